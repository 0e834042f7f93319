"""scheduling room."""
