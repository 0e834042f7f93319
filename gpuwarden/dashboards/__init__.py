"""dashboards room."""
