"""exporter room."""
