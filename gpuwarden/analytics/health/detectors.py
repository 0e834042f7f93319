"""Anomaly detectors for GPU health, following the scikit-learn estimator contract: ``__init__``
only stores parameters, ``fit`` learns from a fleet window and returns ``self``, learned attributes
end in ``_``, and ``predict`` answers +1 (normal) / -1 (anomalous) as scikit-learn's outlier
detectors do (``score_samples``: lower is more abnormal; ``decision_function``: negative is
anomalous).

Both compare a GPU with its peers, never with one global threshold: ``groups`` (for example
"model / node pool") gives every row its peer group, and each group learns its own baseline.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import poisson
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

_MAD_TO_SIGMA = 1.4826


def _group_labels(groups, n_rows: int) -> np.ndarray:
    if groups is None:
        return np.zeros(n_rows, dtype=object)
    labels = np.asarray(groups, dtype=object)
    if labels.shape != (n_rows,):
        raise ValueError(f"groups has shape {labels.shape}; expected ({n_rows},), one label per row of X")
    return labels


class _AllowsNaN:
    """Estimator tag: a feature a GPU cannot measure is NaN and never flags it."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


class _PeerOutlier(_AllowsNaN):
    """The outlier-detector contract over ``score_samples`` (lower is more abnormal) and the fitted
    ``offset_``: below the offset is an outlier (-1), else an inlier (1). Rows carry their peer
    group in ``groups``."""

    def decision_function(self, X, groups=None) -> np.ndarray:
        return self.score_samples(X, groups) - self.offset_

    def predict(self, X, groups=None) -> np.ndarray:
        return np.where(self.decision_function(X, groups) < 0, -1, 1)

    def fit_predict(self, X, y=None, groups=None) -> np.ndarray:
        return self.fit(X, groups=groups).predict(X, groups)


class PeerDeviationDetector(_PeerOutlier, OutlierMixin, BaseEstimator):
    """Flags rows whose peer-relative features deviate from their group's robust centre.

    Each feature is first expressed relative to peers (for example the log of a GPU's clock over
    the median clock of GPUs of its model and pool at the same load). ``fit`` learns, per group,
    the median (``center_``) and a robust spread (1.4826 x MAD, at least ``min_scale``: ``scale_``).
    A row's deviation on a feature is ``(x - center) / scale`` oriented by ``direction`` ("low":
    below the centre counts; "high": above; "both"). ``threshold`` is one number or one per
    feature; a feature "fires" when its deviation exceeds its threshold. With ``require="all"`` a
    row is anomalous when every feature fires; with "any", when one does. Missing features never
    make a row anomalous.
    """

    def __init__(self, threshold: float = 4.0, min_scale: float = 0.025, direction: str = "low", require: str = "all"):
        self.threshold = threshold
        self.min_scale = min_scale
        self.direction = direction
        self.require = require

    def fit(self, X, y=None, groups=None):
        if self.direction not in ("low", "high", "both"):
            raise ValueError(f"direction={self.direction!r}; expected 'low', 'high' or 'both'")
        if self.require not in ("all", "any"):
            raise ValueError(f"require={self.require!r}; expected 'all' or 'any'")
        X = validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64)
        labels = _group_labels(groups, X.shape[0])
        self.global_center_, self.global_scale_ = self._robust(X)
        self.groups_ = np.array(sorted(set(labels.tolist()), key=str), dtype=object)
        self.center_ = np.empty((len(self.groups_), X.shape[1]))
        self.scale_ = np.empty((len(self.groups_), X.shape[1]))
        for i, group in enumerate(self.groups_):
            self.center_[i], self.scale_[i] = self._robust(X[labels == group])
        thresholds = np.broadcast_to(np.asarray(self.threshold, dtype=float), (X.shape[1],))
        if (thresholds <= 0).any():
            raise ValueError(f"threshold={self.threshold!r}; expected positive number(s), one or one per feature")
        self.thresholds_ = thresholds.copy()
        self.offset_ = -1.0
        return self

    def _robust(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        center = np.zeros(X.shape[1])
        scale = np.full(X.shape[1], float(self.min_scale))
        for j in range(X.shape[1]):
            column = X[:, j][~np.isnan(X[:, j])]
            if column.size:
                center[j] = np.median(column)
                scale[j] = max(_MAD_TO_SIGMA * np.median(np.abs(column - center[j])), float(self.min_scale))
        return center, scale

    def deviations(self, X, groups=None) -> np.ndarray:
        """Oriented deviations (in robust scales) per row and feature; NaN where a feature is missing."""
        check_is_fitted(self)
        X = validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64, reset=False)
        labels = _group_labels(groups, X.shape[0])
        center = np.tile(self.global_center_, (X.shape[0], 1))
        scale = np.tile(self.global_scale_, (X.shape[0], 1))
        index = {group: i for i, group in enumerate(self.groups_)}
        for group in set(labels.tolist()):
            if group in index:
                rows = labels == group
                center[rows] = self.center_[index[group]]
                scale[rows] = self.scale_[index[group]]
        z = (X - center) / scale
        if self.direction == "low":
            return -z
        if self.direction == "high":
            return z
        return np.abs(z)

    def score_samples(self, X, groups=None) -> np.ndarray:
        """Minus the deviation, in units of each feature's threshold, that decides (the smallest over
        features for "all", the largest for "any"); lower is more abnormal, below -1 anomalous."""
        z = self.deviations(X, groups) / self.thresholds_
        filled = np.where(np.isnan(z), -np.inf, z)
        deciding = filled.min(axis=1) if self.require == "all" else filled.max(axis=1)
        deciding = np.where(np.isfinite(deciding), deciding, 0.0)
        return -deciding


class CounterBurstDetector(_PeerOutlier, OutlierMixin, BaseEstimator):
    """Flags a burst of counter events (single-bit ECC errors, PCIe replays) that its peer group's
    baseline rate cannot explain.

    ``X`` has two columns: events counted in a window, and the window's length in hours. ``fit``
    learns each group's baseline rate per GPU-hour (``rate_``: the ``quantile`` of the rows' rates,
    the median by default, at least ``min_rate_per_hour``, so a fleet that normally shows none still
    needs a real burst). A higher quantile (0.9) allows for healthy GPUs whose steady rate differs
    (one noisier link or memory stack is not a burst).
    A row is anomalous when it has at least ``min_events`` and the Poisson probability of seeing
    that many at the baseline rate is below ``alpha``. ``score_samples`` is ``log10`` of that
    probability (lower is more abnormal).
    """

    def __init__(self, alpha: float = 1e-6, min_rate_per_hour: float = 0.5, min_events: int = 3, quantile: float = 0.5):
        self.alpha = alpha
        self.min_rate_per_hour = min_rate_per_hour
        self.min_events = min_events
        self.quantile = quantile

    def fit(self, X, y=None, groups=None):
        X = validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64)
        if X.shape[1] != 2:
            raise ValueError(f"X has {X.shape[1]} columns; expected 2 (events, hours)")
        labels = _group_labels(groups, X.shape[0])
        self.global_rate_ = self._rate(X)
        self.groups_ = np.array(sorted(set(labels.tolist()), key=str), dtype=object)
        self.rate_ = np.array([self._rate(X[labels == g]) for g in self.groups_])
        self.offset_ = float(np.log10(self.alpha))
        return self

    def _rate(self, X: np.ndarray) -> float:
        ok = (X[:, 1] > 0) & ~np.isnan(X).any(axis=1)
        rates = X[ok, 0] / X[ok, 1]
        base = float(np.quantile(rates, self.quantile, method="lower")) if rates.size else 0.0
        return max(base, float(self.min_rate_per_hour))

    def expected(self, X, groups=None) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, ensure_all_finite="allow-nan", dtype=np.float64, reset=False)
        labels = _group_labels(groups, X.shape[0])
        rate = np.full(X.shape[0], self.global_rate_)
        index = {group: i for i, group in enumerate(self.groups_)}
        for group in set(labels.tolist()):
            if group in index:
                rate[labels == group] = self.rate_[index[group]]
        return rate * np.nan_to_num(X[:, 1])

    def score_samples(self, X, groups=None) -> np.ndarray:
        mu = self.expected(X, groups)
        X = np.asarray(X, dtype=float)
        events = np.nan_to_num(X[:, 0])
        with np.errstate(divide="ignore"):
            logp = np.log10(np.maximum(poisson.sf(events - 1, np.maximum(mu, 1e-12)), 1e-300))
        return np.where(events >= self.min_events, logp, 0.0)
