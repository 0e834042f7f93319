"""analytics room."""
