"""Streamlit page scripts, run by the router in ``gpuwarden/dashboards/app.py``."""
