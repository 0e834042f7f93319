"""``python -m gpuwarden.exporter``: the light exporter entry point (nvml and replay backends)."""

import sys

from .main import main

sys.exit(main())
