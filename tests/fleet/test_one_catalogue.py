"""One GPU catalogue: the simulator's models and prices and the mixed replay's models and MIG
profiles all come from ``gpu_models.csv`` / ``gpu_mig_profiles.csv``. A model added to a copy of the
catalogue (``$GPUWARDEN_GPU_CATALOGUE``) reaches the simulator's price and the mixed replay with no
other edit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.fleet import Location, PriceTier
from gpuwarden.fleet.gpu_catalogue import (CATALOGUE_ENV, MIG_PROFILES_PATH, MODELS_PATH, CatalogueError,
                                           gpu_catalogue, load_gpu_catalogue)
from gpuwarden.scheduling.errors import SchedulingError
from gpuwarden.scheduling.replay_mixed import MixedSpec, mig_profiles
from gpuwarden.sim.catalog import MIG_LAYOUTS, MODELS, sim_models

ROOT = Path(__file__).resolve().parents[2]
X100 = "NVIDIA X100 104GB,104,800,2000,true,7,8,18,900,X100|X100-SXM,9.10,5.90,3.70,1.40\n"
X100_PROFILES = "".join(f"NVIDIA X100 104GB,{name},{c},{m},{gib},{n},{placements}\n" for name, c, m, gib, n, placements in (
    ("1g.13gb", 1, 1, 13, 7, "0 1 2 3 4 5 6"), ("1g.26gb", 1, 2, 26, 4, "0 2 4 6"), ("2g.26gb", 2, 2, 26, 3, "0 2 4"),
    ("3g.52gb", 3, 4, 52, 2, "0 4"), ("4g.52gb", 4, 4, 52, 1, "0"), ("7g.104gb", 7, 8, 104, 1, "0")))


def _catalogue_with_x100(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    models, profiles = folder / MODELS_PATH.name, folder / MIG_PROFILES_PATH.name
    shutil.copy(MODELS_PATH, models)
    shutil.copy(MIG_PROFILES_PATH, profiles)
    with models.open("a") as handle:
        handle.write(X100)
    with profiles.open("a") as handle:
        handle.write(X100_PROFILES)
    return folder


def test_the_simulators_models_and_prices_are_the_catalogues_priced_rows():
    priced = {name: spec for name, spec in gpu_catalogue().models.items() if spec.price_per_hour}
    assert set(MODELS) == set(priced) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"}
    assert MODELS["NVIDIA H200"].price_per_hour == ((PriceTier.ON_DEMAND, 7.91), (PriceTier.RESERVED, 5.00),
                                                    (PriceTier.SPOT, 3.20), (PriceTier.OWNED, 1.20))
    assert MODELS["NVIDIA L40S"].hourly_price(PriceTier.OWNED) == 0.38
    assert dict(MIG_LAYOUTS) == {  # the simulated MIG nodes' layouts (one 3g, one 2g, two 1g)
        "NVIDIA A100-SXM4-80GB": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
        "NVIDIA H100 80GB HBM3": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
        "NVIDIA H200": ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"),
    }


def test_the_mixed_replays_models_and_profiles_are_the_catalogues():
    assert mig_profiles("H100") == {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb"}
    assert mig_profiles("H200") == {"1g": "1g.18gb", "2g": "2g.35gb", "3g": "3g.71gb"}
    assert MixedSpec().pools() == (
        ("mixed-h100", "NVIDIA H100 80GB HBM3", Location.CLOUD, PriceTier.RESERVED, 6 / 16, 0.0),
        ("mixed-h100-spot", "NVIDIA H100 80GB HBM3", Location.CLOUD, PriceTier.SPOT, 2 / 16, 0.0),
        ("mixed-h200", "NVIDIA H200", Location.ON_PREM, PriceTier.RESERVED, 8 / 16, 0.0),
    )
    with pytest.raises(SchedulingError, match="NVIDIA L40S has no MIG"):
        mig_profiles("L40S")
    with pytest.raises(SchedulingError, match="two models are one"):
        MixedSpec(cloud_model="H200")


def test_prices_are_all_given_or_none(tmp_path):
    folder = _catalogue_with_x100(tmp_path / "catalogue")
    models = folder / MODELS_PATH.name
    models.write_text(models.read_text().replace(",9.10,5.90,3.70,1.40\n", ",9.10,5.90,,1.40\n"))
    with pytest.raises(CatalogueError, match="price_spot empty"):
        load_gpu_catalogue(models, folder / MIG_PROFILES_PATH.name)


def test_a_model_added_to_a_copy_of_the_catalogue_reaches_the_simulator(tmp_path):
    folder = _catalogue_with_x100(tmp_path / "catalogue")
    catalogue = load_gpu_catalogue(folder / MODELS_PATH.name, folder / MIG_PROFILES_PATH.name)
    models, layouts = sim_models(catalogue)
    assert models["NVIDIA X100 104GB"].hourly_price(PriceTier.SPOT) == 3.70
    assert models["NVIDIA X100 104GB"].mig_profile("3g.52gb").memory_bytes == 52 * 1024**3
    assert layouts["NVIDIA X100 104GB"] == ("3g.52gb", "2g.26gb", "1g.13gb", "1g.13gb")
    assert "NVIDIA X100 104GB" not in MODELS  # the bundled catalogue is untouched


_SCRIPT = """
import json
from gpuwarden.cli.simulate_cmd import mixed_rows
from gpuwarden.fleet import PriceTier
from gpuwarden.scheduling.replay_mixed import MixedSpec, workload
from gpuwarden.sim.catalog import MIG_LAYOUTS, MODELS

spec = MixedSpec(cloud_model="X100", cloud_nodes=4, on_prem_nodes=4, hours=6.0, warmup_hours=1.0, seed=7)
rows = mixed_rows(spec)
x100 = [j for j in workload(spec) if j.gpu_model == "NVIDIA X100 104GB"]
print(json.dumps({
    "price": MODELS["NVIDIA X100 104GB"].hourly_price(PriceTier.SPOT), "layout": MIG_LAYOUTS["NVIDIA X100 104GB"],
    "pools": [p[:2] for p in spec.pools()], "profiles": sorted({j.mig_profile for j in x100 if j.mig_profile}),
    "rows": [{k: r[k] for k in ("policy", "gpus", "inference_served", "training_started")} for r in rows],
}))
"""


def test_a_model_added_to_a_copy_of_the_catalogue_reaches_the_mixed_replay(tmp_path):
    """The whole process reads the copy (``$GPUWARDEN_GPU_CATALOGUE``): the simulator prices the new
    model, and the mixed replay builds its pools of it and asks for its MIG profiles."""
    folder = _catalogue_with_x100(tmp_path / "catalogue")
    env = {**os.environ, CATALOGUE_ENV: str(folder)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["price"] == 3.70
    assert out["layout"] == ["3g.52gb", "2g.26gb", "1g.13gb", "1g.13gb"]
    assert out["pools"] == [["mixed-x100", "NVIDIA X100 104GB"], ["mixed-x100-spot", "NVIDIA X100 104GB"],
                            ["mixed-h200", "NVIDIA H200"]]
    assert set(out["profiles"]) <= {"1g.13gb", "2g.26gb", "3g.52gb"} and out["profiles"]
    naive, ours = out["rows"]
    assert naive["gpus"] == ours["gpus"] == 64
    assert ours["inference_served"] > 0 and ours["training_started"] > 0


def test_the_simulators_cloud_prices_are_the_shipped_price_books():
    """The catalogue's prices seed the simulated nodes (the simulator may read only fleet); the price
    book bills them. Their cloud tiers are the same list prices, so a simulated fleet's cost report
    prices what the simulator was seeded with. (``owned`` differs by design: the book computes it from
    capex and measured power, the simulator's seed is a fixed figure.)"""
    from gpuwarden.analytics.pricebook import PriceBook
    from gpuwarden.fleet.gpu_catalogue import gpu_catalogue

    book = PriceBook.default()
    priced = [spec for spec in gpu_catalogue().models.values() if spec.price_per_hour]
    assert priced
    for spec in priced:
        seeded = dict(spec.price_per_hour)
        for tier in ("on-demand", "reserved", "spot"):
            assert seeded[tier] == pytest.approx(book.hourly(spec.name, tier)), (spec.name, tier)
