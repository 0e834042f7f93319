"""GPU models the simulated fleet is built from: the GPU catalogue's hardware (memory, power,
clocks, GPM support, MIG profiles) plus the prices that seed the simulated nodes.

Hardware comes from :mod:`gpuwarden.fleet.gpu_catalogue`, the one place it is written. Prices per
GPU-hour are round public list figures of late 2025 (on-demand / reserved / spot cloud; ``owned``
is capex amortised over 4 years plus power at 0.12 $/kWh and a 1.5 PUE); analytics has its own
price book, these only seed the simulated nodes.
"""

from __future__ import annotations

from gpuwarden.fleet import GpuModel, MigProfile, PriceTier
from gpuwarden.fleet.gpu_catalogue import GIB, gpu_catalogue

__all__ = ["GIB", "MIG_LAYOUTS", "MODELS"]

# on-demand, reserved, spot, owned per GPU-hour
_PRICES: dict[str, tuple[float, float, float, float]] = {
    "NVIDIA H100 80GB HBM3": (6.88, 4.30, 2.75, 1.05),
    "NVIDIA H200": (7.91, 5.00, 3.20, 1.20),
    "NVIDIA A100-SXM4-80GB": (4.10, 2.60, 1.60, 0.62),
    "NVIDIA L40S": (1.86, 1.20, 0.80, 0.38),
}


def _model(name: str, prices: tuple[float, float, float, float]) -> GpuModel:
    spec = gpu_catalogue().model(name)
    profiles = tuple(MigProfile(p.name, p.compute_slices, p.memory_bytes, p.max_instances)
                     for p in spec.mig_profiles.values())
    tiers = (PriceTier.ON_DEMAND, PriceTier.RESERVED, PriceTier.SPOT, PriceTier.OWNED)
    return GpuModel(spec.name, spec.memory_bytes, spec.tdp_watts, spec.max_sm_clock_mhz, spec.gpm_supported,
                    profiles, tuple(zip(tiers, prices)))


MODELS: dict[str, GpuModel] = {name: _model(name, prices) for name, prices in _PRICES.items()}

# The simulated MIG nodes' layout: a mixed one using every compute slice (a valid placement per
# NVIDIA's MIG user guide; checked against the catalogue in tests/test_gpu_catalogue.py).
MIG_LAYOUTS: dict[str, tuple[str, ...]] = {
    "NVIDIA A100-SXM4-80GB": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "NVIDIA H100 80GB HBM3": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "NVIDIA H200": ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"),
}
