"""actuator room."""
