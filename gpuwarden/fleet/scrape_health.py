"""The scrape-health table: one row per scrape target (the GPU exporter of a node) per timestamp.

Optional beside the fleet samples: Prometheus knows how each scrape of a target went (``up``,
``scrape_duration_seconds``, ``scrape_samples_scraped``); a samples file does not, and the health
scan then reads series presence only. The columns live here, in ``fleet``, so that the store can
produce them and analytics read them without knowing each other; ``docs/schema.md`` lists them.
"""

from __future__ import annotations

from .samples import Column

SCRAPE_HEALTH_COLUMNS: tuple[Column, ...] = (
    Column("timestamp", "timestamp", False, "grid time, UTC: the row covers the step before it"),
    Column("node", "string", False, "Kubernetes node of the target (from its series' `node` / `Hostname` labels)"),
    Column("job", "string", False, "Prometheus job of the target"),
    Column("instance", "string", False, "Prometheus instance of the target"),
    Column("up_ratio", "float", True, "share of the step's scrapes that succeeded (`avg_over_time(up)`); null: no scrape"),
    Column("up_drops", "float", True, "scrapes in the step that failed after one that succeeded (`resets(up)`)"),
    Column("scrape_duration_seconds", "float", True, "slowest scrape of the step (`max_over_time`)"),
    Column("scrape_samples_scraped", "float", True,
           "most samples one scrape of the step returned (`max_over_time`); 0 where every scrape failed"),
)
SCRAPE_HEALTH_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in SCRAPE_HEALTH_COLUMNS)
