"""dashboards room: the Streamlit app (``app.py``, pages under ``views/``) and its launcher.

Importing this package stays light (no Streamlit): the CLI imports ``launch`` from here.
"""

STORE_ENV = "GPUWARDEN_STORE"  # the store directory the dashboard reads
