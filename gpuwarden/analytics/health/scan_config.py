"""The thresholds of the health scan (:class:`HealthConfig`) and their defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the scan. Defaults were tuned on simulator seeds 1 and 2 only (see
    ``evaluation.TUNING_SEEDS``); the reported figures use other seeds."""

    episode_gap_s: float = 3600.0  # a condition absent this long ends its finding
    active_within_s: float = 600.0  # a finding seen this recently is "active"
    # HBM: single-bit ECC errors + correctable row remaps
    hbm_windows_s: tuple[float, ...] = (3600.0, 6 * 3600.0)
    hbm_alpha: float = 1e-6
    hbm_min_rate_per_hour: float = 0.5
    hbm_min_events: int = 5
    # PCIe replays
    pcie_window_s: float = 3600.0
    pcie_alpha: float = 1e-6
    pcie_min_rate_per_hour: float = 0.5
    pcie_min_events: int = 5
    pcie_storm_per_minute: float = 100.0
    # NVLink CRC / replay / recovery errors (summed over the GPU's links)
    nvlink_windows_s: tuple[float, ...] = (3600.0,)
    nvlink_alpha: float = 1e-6
    nvlink_min_rate_per_hour: float = 0.5
    nvlink_min_events: int = 5
    # Counters are judged by how many samples show new events (a burst within one sample is one
    # event: bursts are what noise looks like, spread-out events what wear looks like), against the
    # larger of the peer group's rate and the GPU's own earlier rate (its history up to
    # ``own_history_lag_s`` before the window, with ``own_prior_hours`` of the peer rate as a prior).
    own_history_lag_s: float = 3600.0
    peer_rate_quantile: float = 0.75
    own_prior_hours: float = 2.0
    # Without this much own history a GPU could be a steadily noisy one: it then needs this many
    # more decades of improbability against its peers alone.
    own_min_history_hours: float = 3.0
    no_history_extra_decades: float = 14.0
    # Gentle precursors (trend_rules): a counter's event rate risen against the GPU's own history
    # (exact two-rate test), in a trailing window of one of these lengths; a taint at most.
    trend_windows_s: tuple[float, ...] = (2 * 3600.0, 4 * 3600.0, 8 * 3600.0)
    trend_alpha: float = 1e-6
    trend_min_events: int = 4  # samples with new events in the window
    trend_min_ratio: float = 3.0  # the recent rate at least this many times the baseline
    trend_min_history_s: float = 6 * 3600.0  # of the GPU's own history before the window
    trend_prior_hours: float = 2.0  # of the peer group's median rate added to the baseline
    trend_peer_floor_per_hour: float = 0.05
    # cooling: temperature no load, ambient or node-mates explain, against the GPU's own history
    cooling_window_s: float = 1800.0
    cooling_history_hours: int = 6
    cooling_excess_celsius: float = 8.0
    cooling_excess_no_history_celsius: float = 18.0
    cooling_min_s: float = 600.0  # of samples in the window (10 at 60 s steps, 40 at 15 s)
    # throttle share (hardware thermal / power brake / hardware slowdown)
    throttle_window_s: float = 600.0
    throttle_share: float = 0.5
    throttle_min_s: float = 180.0  # of measured samples in the window
    # temperature above peers at the same load
    hot_window_s: float = 1800.0
    # straggler: clock and power below peers at the same load, no throttle, no error
    straggler_window_s: float = 3600.0
    straggler_min_active_s: float = 1800.0  # of active samples in the window
    # ...and slower than its node-mates by this much (log clock): a node slower as a whole is a node
    # condition (node_rules), not eight stragglers
    straggler_node_margin: float = 0.05
    # robust scales below peers: clock must be clearly low; power at least somewhat low (a heavier
    # phase runs a lower clock at higher power: that is load, not a slow GPU)
    straggler_threshold: float = 4.0
    straggler_min_scale: float = 0.025
    straggler_max_power_excess: float = 0.05  # log power vs peers: a slower clock at more power is load
    # a mild straggler (trend_rules): this much (log clock) below its busy node-mates' median and this
    # many of their robust spreads, and below its peers by half as much, in this share of its judged
    # samples over this long; a taint at most
    straggler_mild_margin: float = 0.04
    straggler_mild_spread: float = 4.0
    straggler_mild_share: float = 0.9
    straggler_mild_persist_s: float = 1.5 * 3600.0
    # Node conditions (node_rules): this share of a node's GPUs (and at least this many) show it at once
    node_wide_share: float = 0.75
    node_wide_min_gpus: int = 4
    node_slow_margin: float = 0.1  # log clock: a node's busy GPUs this much below their model and pool's
    node_hot_celsius: float = 8.0  # a node's GPUs together this much above their model and pool's
    dbe_explained_within_s: float = 300.0
    # A GPU with no sample this long while its node-mates report lost its series (one missed
    # scrape is jitter; a GPU off the bus stays gone until the node reboots).
    series_lost_after_s: float = 600.0
    # Early warnings recommend a cordon only once sustained this long (before that: a taint).
    cordon_after_s: float = 1800.0
    straggler_cordon_after_s: float = 2700.0
    # XID storms (storm_rules): application XIDs whose episodes start within this many seconds of
    # the previous one are one storm when they strike this many GPUs of one workload, or this many
    # nodes whatever holds them (a gang's crash lights up every GPU it held at once).
    storm_window_s: float = 120.0
    storm_min_workload_gpus: int = 2
    storm_min_nodes: int = 3
    # Failure domains (domain_rules): hardware findings on this many nodes of one domain (a rack, an
    # NVLink domain; the whole fleet where no topology is known) starting within chained minutes are
    # one domain event; a member GPU that reports again this long after it, with no new fault, was
    # never faulty.
    domain_window_s: float = 300.0
    domain_min_nodes: int = 3
    domain_settle_s: float = 300.0


DEFAULT_CONFIG = HealthConfig()
