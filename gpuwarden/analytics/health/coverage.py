"""What a scan could not see: the detectors the source's signals cannot feed, and nodes that went
silent as a whole. A detector without its signal finds nothing, which must never read as "healthy":
the scan's notes say which ones did not run and what still covers the fault."""

from __future__ import annotations

import pandas as pd

from .scan_config import DEFAULT_CONFIG, HealthConfig

# (columns any of which feeds it, the note when none is measured). dcgm-exporter's default
# counters lack the first three (docs/dcgm-exporter.md lists the CSV lines that enable them).
SIGNALS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("ecc_sbe_volatile_total", "ecc_dbe_volatile_total"),
     "no ECC counters in this source: HBM degradation is seen only through row remaps, and a double-bit error "
     "only through its XID 48"),
    (("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total", "nvlink_replay_errors_total",
      "nvlink_recovery_errors_total"),
     "no NVLink error counters in this source: NVLink degradation is not detected; NVLink faults are seen only "
     "through XID 74"),
    (("throttle_reasons_bitmask",),
     "no throttle reasons in this source: the thermal-throttle, power-brake and hardware-slowdown detectors did not "
     "run, and a straggler cannot be told from a throttled GPU"),
    (("recovery_action",), "no NVML recovery action in this source (gpuwarden's exporter serves it): the driver's "
                           "own reset / reboot requests are not seen"),
    (("remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_pending",
      "remapped_rows_failure"),
     "no row-remap counters in this source: row-remap pending / failure is seen only through XID 63 / 64"),
    (("pcie_replay_total",), "no PCIe replay counter in this source: PCIe degradation and replay storms are not detected"),
    (("temperature_celsius",), "no GPU temperature in this source: cooling degradation is not detected"),
    (("sm_clock_mhz", "power_watts"), "no SM clock or power in this source: stragglers are not detected"),
)


class Coverage:
    """What the frames of one scan measured (read in chunks or at once): which columns held a value,
    and each node's newest sample. ``notes()`` says what the scan could not see."""

    def __init__(self, config: HealthConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.measured: set[str] = set()
        self.node_last: dict[str, pd.Timestamp] = {}
        self.rows = 0
        self.scrape_rows = 0

    def add(self, frame: pd.DataFrame) -> Coverage:
        if frame.empty:
            return self
        self.rows += len(frame)
        self.measured.update(c for c in frame.columns if frame[c].notna().any())
        stamps = pd.to_datetime(frame["timestamp"], utc=True)
        for node, when in stamps.groupby(frame["node"].astype(object).to_numpy()).max().items():
            self.node_last[str(node)] = max(when, self.node_last.get(str(node), when))
        return self

    def add_scrape(self, scrape: pd.DataFrame | None) -> Coverage:
        """Count the scrape-health rows read beside the samples (None: the source has none)."""
        self.scrape_rows += 0 if scrape is None else len(scrape)
        return self

    def notes(self) -> list[str]:
        return self.signal_notes() + self.scrape_notes() + self.silent_node_notes() if self.rows else []

    def scrape_notes(self) -> list[str]:
        """Whether observability collapse could read scrape health or saw series presence only."""
        if self.scrape_rows:
            return []
        return ["no scrape health in this source (Prometheus' up, scrape_duration_seconds, scrape_samples_scraped of "
                "the GPU exporter targets): observability collapse is judged on series presence only"]

    def signal_notes(self) -> list[str]:
        """One note per detector whose signals are absent, plus XIDs when none is counted."""
        notes = [note for columns, note in SIGNALS if not self.measured.intersection(columns)]
        if not any(c.startswith("xid_") for c in self.measured):
            notes.append("no XID source in this window (none of gpuwarden_xid_errors_total, DCGM_FI_DEV_XID_ERRORS, "
                         "DCGM_EXP_XID_ERRORS_COUNT changed): every fault carried by an XID is unseen, or none happened")
        return notes

    def silent_node_notes(self) -> list[str]:
        """Nodes whose every GPU stopped reporting before the newest sample: the exporter or the node
        is down, which is no GPU's fault (no finding)."""
        if not self.node_last:
            return []
        newest = max(self.node_last.values())
        limit = newest - pd.Timedelta(seconds=self.config.series_lost_after_s)
        return [f"node {node}: no series from any of its GPUs since {when:%Y-%m-%d %H:%M} UTC (exporter or node down): "
                "no GPU finding" for node, when in sorted(self.node_last.items()) if when < limit]
