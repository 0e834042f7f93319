"""dashboards room: the Streamlit app (``app.py``, pages under ``views/``) and its launcher.

Importing this package stays light (no Streamlit): the CLI imports ``launch`` from here.
"""

STORE_ENV = "GPUWARDEN_STORE"  # the store directory the dashboard reads (GPUWARDEN_SOURCE=store, the default)
SOURCE_ENV = "GPUWARDEN_SOURCE"  # where fleet samples come from: store | prometheus
PROMETHEUS_URL_ENV = "GPUWARDEN_PROMETHEUS_URL"  # with GPUWARDEN_SOURCE=prometheus: its base URL
PROMETHEUS_STEP_ENV = "GPUWARDEN_PROMETHEUS_STEP"  # the resolution of Prometheus reads (default 60s)
CACHE_DIR_ENV = "GPUWARDEN_CACHE_DIR"  # where report bundles of a Prometheus source are kept
DEFAULT_CACHE_DIR = "/tmp/gpuwarden-reports"  # the chart mounts /tmp writable (an emptyDir)
SOURCES = ("store", "prometheus")
