"""GPU models the simulated fleet is built from: memory, power, clocks, GPM support, MIG tables, prices.

MIG profile tables follow NVIDIA's MIG user guide (A100 80GB, H100 80GB, H200 141GB). Prices per
GPU-hour are round public list figures of late 2025 (on-demand / reserved / spot cloud; ``owned``
is capex amortised over 4 years plus power at 0.12 $/kWh and a 1.5 PUE); analytics has its own
price book, these only seed the simulated nodes.
"""

from __future__ import annotations

from gpuwarden.fleet import GpuModel, MigProfile, PriceTier

GIB = 1024**3


def _profiles(table: list[tuple[str, int, float, int]]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, slices, int(memory_gib * GIB), count) for name, slices, memory_gib, count in table)


A100_80GB_MIG = _profiles(
    [("1g.10gb", 1, 10, 7), ("1g.20gb", 1, 20, 4), ("2g.20gb", 2, 20, 3), ("3g.40gb", 3, 40, 2), ("4g.40gb", 4, 40, 1), ("7g.80gb", 7, 80, 1)]
)
H100_80GB_MIG = _profiles(
    [("1g.10gb", 1, 10, 7), ("1g.20gb", 1, 20, 4), ("2g.20gb", 2, 20, 3), ("3g.40gb", 3, 40, 2), ("4g.40gb", 4, 40, 1), ("7g.80gb", 7, 80, 1)]
)
H200_141GB_MIG = _profiles(
    [("1g.18gb", 1, 18, 7), ("1g.35gb", 1, 35, 4), ("2g.35gb", 2, 35, 3), ("3g.71gb", 3, 71, 2), ("4g.71gb", 4, 71, 1), ("7g.141gb", 7, 141, 1)]
)


def _prices(on_demand: float, reserved: float, spot: float, owned: float) -> tuple[tuple[PriceTier, float], ...]:
    return ((PriceTier.ON_DEMAND, on_demand), (PriceTier.RESERVED, reserved), (PriceTier.SPOT, spot), (PriceTier.OWNED, owned))


MODELS: dict[str, GpuModel] = {
    model.name: model
    for model in (
        GpuModel("NVIDIA H100 80GB HBM3", 80 * GIB, 700.0, 1980, True, H100_80GB_MIG, _prices(6.88, 4.30, 2.75, 1.05)),
        GpuModel("NVIDIA H200", 141 * GIB, 700.0, 1980, True, H200_141GB_MIG, _prices(7.91, 5.00, 3.20, 1.20)),
        GpuModel("NVIDIA A100-SXM4-80GB", 80 * GIB, 400.0, 1410, False, A100_80GB_MIG, _prices(4.10, 2.60, 1.60, 0.62)),
        GpuModel("NVIDIA L40S", 48 * GIB, 350.0, 2520, False, (), _prices(1.86, 1.20, 0.80, 0.38)),
    )
}

# A mixed MIG layout using all 7 compute slices of an A100/H100 80GB (valid placement per the guide).
MIG_LAYOUTS: dict[str, tuple[str, ...]] = {
    "NVIDIA A100-SXM4-80GB": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "NVIDIA H100 80GB HBM3": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "NVIDIA H200": ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"),
}
