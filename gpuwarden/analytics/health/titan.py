"""Fleet failure risk on real data: GPU lifetimes of the Titan supercomputer (OLCF, 2012-2019).

``../shared/data/titan/gc_summary_loc.csv.gz`` (olcf/TitanGPULife, Ostrouchov et al., SC'20) has
one row per GPU (serial number): time in service (``years``), whether it died (``dead``: a
double-bit ECC error or falling off the bus took it out of service), its last location (cabinet
column / row, ``cage`` 0-2 from bottom to top of the cabinet, ``slot`` 0-7, ``node`` 0-3), its batch
(``old``: the original 2012 boards; ``new``: the 2016-17 replacements) and how many locations it
has been in (``nloc``).

A Cox proportional-hazards model (Breslow ties, Newton-Raphson with a tiny ridge, written here in
numpy rather than adding a survival library) is fitted on a random half of the GPUs; Harrell's
concordance index of its risk score is measured on the other half. The cage coefficients answer
the paper's location question: Titan is air-cooled bottom to top, so the upper cages run hotter,
and the paper found GPUs there die sooner.

Caveats: the model ignores left truncation (GPUs installed before monitoring began in 2014 enter
late) and uses the last location of a GPU that moved; the per-GPU DBE / off-the-bus counts are the
death events themselves and are therefore not covariates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

SUMMARY_FILE = Path("titan") / "gc_summary_loc.csv.gz"


def load_titan(data_dir: str | Path) -> pd.DataFrame:
    path = Path(data_dir) / SUMMARY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: Titan GPU-lifetime summary not found (expected ../shared/data/titan/)")
    frame = pd.read_csv(path)
    needed = {"years", "dead", "col", "row", "cage", "slot", "node", "batch", "nloc"}
    missing = needed - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    frame = frame[frame["years"] > 0].reset_index(drop=True)
    frame["dead"] = frame["dead"].astype(bool)
    return frame


def design_matrix(frame: pd.DataFrame, location: bool = True, history: bool = True) -> pd.DataFrame:
    """Covariates: cage / node dummies (cage 0, node 0 are the reference), slot, cabinet column and
    row (scaled to 0..1); batch and whether the GPU has been moved."""
    columns: dict[str, np.ndarray] = {}
    if location:
        for cage in (1, 2):
            columns[f"cage_{cage}"] = (frame["cage"] == cage).to_numpy(float)
        for node in (1, 2, 3):
            columns[f"node_{node}"] = (frame["node"] == node).to_numpy(float)
        columns["slot"] = frame["slot"].to_numpy(float) / 7.0
        columns["col"] = frame["col"].to_numpy(float) / max(frame["col"].max(), 1)
        columns["row"] = frame["row"].to_numpy(float) / max(frame["row"].max(), 1)
    if history:
        columns["batch_old"] = (frame["batch"] == "old").to_numpy(float)
        columns["moved"] = (frame["nloc"] > 1).to_numpy(float)
    return pd.DataFrame(columns, index=frame.index)


@dataclass
class CoxModel:
    names: list[str]
    coef: np.ndarray
    se: np.ndarray
    log_likelihood: float
    iterations: int

    def risk(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=float) @ self.coef

    def summary(self) -> pd.DataFrame:
        return pd.DataFrame({
            "coef": self.coef, "hazard_ratio": np.exp(self.coef),
            "hr_low_95": np.exp(self.coef - 1.96 * self.se), "hr_high_95": np.exp(self.coef + 1.96 * self.se),
            "z": self.coef / self.se,
        }, index=self.names)


def fit_cox(X: np.ndarray, time: np.ndarray, event: np.ndarray, names: list[str], ridge: float = 1e-4,
            max_iter: int = 50, tol: float = 1e-9) -> CoxModel:
    """Cox proportional hazards by Newton-Raphson on the Breslow partial likelihood."""
    X = np.asarray(X, dtype=float)
    order = np.argsort(-np.asarray(time, dtype=float), kind="stable")
    X, t, d = X[order], np.asarray(time, dtype=float)[order], np.asarray(event, dtype=bool)[order]
    last = np.searchsorted(-t, -t, side="right") - 1  # last row of each row's risk set (times >= t_i)
    beta = np.zeros(X.shape[1])

    def state(b):
        eta = X @ b
        eta_max = eta.max()
        w = np.exp(eta - eta_max)
        s0 = np.cumsum(w)[last]
        s1 = np.cumsum(w[:, None] * X, axis=0)[last]
        ll = float(np.sum((eta - eta_max - np.log(s0))[d])) - 0.5 * ridge * b @ b
        mean = s1 / s0[:, None]
        grad = np.sum((X - mean)[d], axis=0) - ridge * b
        s2 = np.cumsum(w[:, None, None] * X[:, :, None] * X[:, None, :], axis=0)[last]
        info = np.sum((s2 / s0[:, None, None] - mean[:, :, None] * mean[:, None, :])[d], axis=0) + ridge * np.eye(len(b))
        return ll, grad, info

    ll, grad, info = state(beta)
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 (the count after the loop is reported)
        step = np.linalg.solve(info, grad)
        scale = 1.0
        while True:
            candidate = beta + scale * step
            new_ll, new_grad, new_info = state(candidate)
            if new_ll >= ll - 1e-12 or scale < 1e-6:
                break
            scale /= 2
        converged = abs(new_ll - ll) < tol * (abs(ll) + 1)
        beta, ll, grad, info = candidate, new_ll, new_grad, new_info
        if converged:
            break
    se = np.sqrt(np.diag(np.linalg.inv(info)))
    return CoxModel(list(names), beta, se, ll, iterations)


def concordance_index(time: np.ndarray, risk: np.ndarray, event: np.ndarray, chunk: int = 2000) -> float:
    """Harrell's C: among comparable pairs (the shorter time is an event), the share where the
    higher risk died sooner; risk ties count one half."""
    t = np.asarray(time, dtype=float)
    r = np.asarray(risk, dtype=float)
    e = np.asarray(event, dtype=bool)
    events = np.flatnonzero(e)
    concordant = 0.0
    comparable = 0.0
    for begin in range(0, events.size, chunk):
        i = events[begin:begin + chunk]
        later = t[None, :] > t[i, None]
        comparable += later.sum()
        concordant += (later & (r[i, None] > r[None, :])).sum() + 0.5 * (later & (r[i, None] == r[None, :])).sum()
    return float(concordant / comparable) if comparable else float("nan")


@dataclass
class TitanReport:
    gpus: int
    deaths: int
    train_gpus: int
    test_gpus: int
    c_index: float
    c_index_location_only: float
    c_index_history_only: float
    model: CoxModel
    deaths_by_cage: pd.DataFrame
    seed: int

    @property
    def hotter_cages_fail_sooner(self) -> bool:
        summary = self.model.summary()
        return bool(summary.loc["cage_2", "hr_low_95"] > 1.0 and summary.loc["cage_2", "coef"] > summary.loc["cage_1", "coef"])

    def format(self) -> str:
        summary = self.model.summary()
        lines = [
            f"Titan GPU lifetimes: {self.gpus:,} GPUs, {self.deaths:,} deaths (DBE or off the bus)",
            f"Cox model fitted on {self.train_gpus:,} GPUs (random half, seed {self.seed}); held-out half {self.test_gpus:,} GPUs",
            f"  concordance index on the held-out half: {self.c_index:.3f} (location + history)",
            f"    location only: {self.c_index_location_only:.3f}; history only (batch, moved): {self.c_index_history_only:.3f}",
            "",
            "hazard ratios (reference: cage 0 = bottom, node 0; slot/col/row over their full range):",
        ]
        for name, row in summary.iterrows():
            lines.append(f"  {name:10} HR {row['hazard_ratio']:6.2f}  95% CI {row['hr_low_95']:5.2f}-{row['hr_high_95']:5.2f}  z {row['z']:6.1f}")
        lines.append("")
        lines.append("share dead by cage (old batch / new batch):")
        for cage, row in self.deaths_by_cage.iterrows():
            lines.append(f"  cage {cage}: {row['old']:.3f} / {row['new']:.3f}")
        verdict = ("yes: the upper (hotter) cages fail sooner, cage 2 most" if self.hotter_cages_fail_sooner
                   else "no clear cage effect at 95% confidence")
        lines.append(f"location effect (hotter cages fail sooner, as the SC'20 paper found)? {verdict}")
        return "\n".join(lines)


def titan_survival(data_dir: str | Path, seed: int = 0) -> TitanReport:
    frame = load_titan(data_dir)
    rng = np.random.default_rng(seed)
    train = rng.random(len(frame)) < 0.5
    time, event = frame["years"].to_numpy(float), frame["dead"].to_numpy(bool)

    def held_out_c(location: bool, history: bool) -> tuple[float, CoxModel]:
        X = design_matrix(frame, location, history)
        model = fit_cox(X.to_numpy()[train], time[train], event[train], list(X.columns))
        return concordance_index(time[~train], model.risk(X.to_numpy()[~train]), event[~train]), model

    c_full, model = held_out_c(True, True)
    c_location, _ = held_out_c(True, False)
    c_history, _ = held_out_c(False, True)
    by_cage = frame.groupby(["cage", "batch"])["dead"].mean().unstack("batch").reindex(columns=["old", "new"])
    return TitanReport(len(frame), int(event.sum()), int(train.sum()), int((~train).sum()), c_full, c_location, c_history,
                       model, by_cage, seed)
