"""GPU health: findings from fleet samples (rules for known faults, early-warning anomaly
detection against peers), the evaluation harness scored against injected-fault ground truth, and
fleet failure risk (survival analysis) on the Titan GPU-lifetime data.

Public API::

    scan(frame, now=None, config=None, pools=None) -> list[Finding]
    FindingLog, StreamingScanner, HealthConfig
    PeerDeviationDetector, CounterBurstDetector        (scikit-learn estimators)
    evaluate(findings, truth, start, end, gpu_count) -> EvalReport; combine(reports) -> EvalReport
    titan_survival(data_dir, seed=0) -> TitanReport
"""

from .catalogue import APPLICATION_XIDS, CORDONING_ACTIONS, FATAL_XIDS, XID_RULES, XidRule
from .detectors import CounterBurstDetector, PeerDeviationDetector
from .evaluation import EvalReport, combine, evaluate
from .scan import FindingLog, StreamingScanner, scan
from .scan_config import DEFAULT_CONFIG, HealthConfig
from .titan import TitanReport, titan_survival

__all__ = [
    "APPLICATION_XIDS", "CORDONING_ACTIONS", "FATAL_XIDS", "XID_RULES", "XidRule",
    "CounterBurstDetector", "PeerDeviationDetector",
    "DEFAULT_CONFIG", "FindingLog", "HealthConfig", "StreamingScanner", "scan",
    "EvalReport", "combine", "evaluate", "TitanReport", "titan_survival",
]
