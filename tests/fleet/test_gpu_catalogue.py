"""The GPU catalogue: it loads, names a broken line, resolves aliases, and holds NVIDIA's MIG profiles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.analytics.pricebook import PriceBook
from gpuwarden.fleet.catalogue import CatalogueError
from gpuwarden.fleet.gpu_catalogue import (GIB, MIG_PROFILES_PATH, MODELS_PATH, GpuCatalogueError, gpu_catalogue,
                                           load_gpu_catalogue)
from gpuwarden.fleet.semantics import gpu_compute_slices, mig_share
from gpuwarden.scheduling import mig
from gpuwarden.sim.catalog import MIG_LAYOUTS, MODELS


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    models, profiles = tmp_path / "models.csv", tmp_path / "profiles.csv"
    shutil.copy(MODELS_PATH, models)
    shutil.copy(MIG_PROFILES_PATH, profiles)
    return models, profiles


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_the_bundled_catalogue_loads_every_model_with_its_hardware():
    catalogue = load_gpu_catalogue()
    h200 = catalogue.model("NVIDIA H200")
    assert h200.memory_bytes == 141 * GIB
    assert (h200.tdp_watts, h200.max_sm_clock_mhz, h200.gpm_supported) == (700.0, 1980, True)
    assert (h200.nvlink_links, h200.nvlink_gbytes_per_second) == (18, 900.0)
    l40s = catalogue.model("NVIDIA L40S")
    assert (l40s.mig_compute_slices, l40s.mig_profiles, l40s.nvlink_links) == (0, {}, 0)
    assert catalogue.model("NVIDIA A100-SXM4-80GB").gpm_supported is False


@pytest.mark.parametrize("spelling, name", [
    ("H100", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),  # dcgm-exporter's modelName
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3"),  # GPU feature discovery's label
    ("nvidia h100-sxm5-80gb", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA A100-SXM4-40GB"),  # the mixed MIG strategy's label
    ("NVIDIA-H200-SHARED", "NVIDIA H200"),  # time-slicing's label
    ("A100", "NVIDIA A100-SXM4-80GB"),
    ("T4", "Tesla T4"),
    ("NVIDIA RTX 9999", None),
])
def test_aliases_resolve_to_the_catalogue_name(spelling, name):
    assert gpu_catalogue().resolve(spelling) == name


def test_an_unknown_model_is_an_error_naming_it_and_the_known_ones():
    with pytest.raises(GpuCatalogueError, match=r"'NVIDIA RTX 9999'.*known models: .*NVIDIA H200"):
        gpu_catalogue().model("NVIDIA RTX 9999")


# NVIDIA's MIG user guide, "Supported MIG Profiles": (profile, compute slices, memory slices,
# instances available) per product.
GUIDE = {
    "NVIDIA A100-SXM4-40GB": [("1g.5gb", 1, 1, 7), ("1g.10gb", 1, 2, 4), ("2g.10gb", 2, 2, 3), ("3g.20gb", 3, 4, 2),
                              ("4g.20gb", 4, 4, 1), ("7g.40gb", 7, 8, 1)],
    "NVIDIA A100-SXM4-80GB": [("1g.10gb", 1, 1, 7), ("1g.20gb", 1, 2, 4), ("2g.20gb", 2, 2, 3), ("3g.40gb", 3, 4, 2),
                              ("4g.40gb", 4, 4, 1), ("7g.80gb", 7, 8, 1)],
    "NVIDIA A30": [("1g.6gb", 1, 1, 4), ("2g.12gb", 2, 2, 2), ("4g.24gb", 4, 4, 1)],
    "NVIDIA H100 80GB HBM3": [("1g.10gb", 1, 1, 7), ("1g.20gb", 1, 2, 4), ("2g.20gb", 2, 2, 3), ("3g.40gb", 3, 4, 2),
                              ("4g.40gb", 4, 4, 1), ("7g.80gb", 7, 8, 1)],
    "NVIDIA H100 NVL": [("1g.12gb", 1, 1, 7), ("1g.24gb", 1, 2, 4), ("2g.24gb", 2, 2, 3), ("3g.47gb", 3, 4, 2),
                        ("4g.47gb", 4, 4, 1), ("7g.94gb", 7, 8, 1)],
    "NVIDIA H200": [("1g.18gb", 1, 1, 7), ("1g.35gb", 1, 2, 4), ("2g.35gb", 2, 2, 3), ("3g.71gb", 3, 4, 2),
                    ("4g.71gb", 4, 4, 1), ("7g.141gb", 7, 8, 1)],
    "NVIDIA B200": [("1g.23gb", 1, 1, 7), ("1g.45gb", 1, 2, 4), ("2g.45gb", 2, 2, 3), ("3g.90gb", 3, 4, 2),
                    ("4g.90gb", 4, 4, 1), ("7g.180gb", 7, 8, 1)],
}


@pytest.mark.parametrize("model", sorted(GUIDE))
def test_mig_profiles_of_each_model_are_nvidias(model):
    profiles = gpu_catalogue().mig_profiles(model)
    assert [(p.name, p.compute_slices, p.memory_slices, p.max_instances) for p in profiles.values()] == GUIDE[model]
    spec = gpu_catalogue().model(model)
    for profile in profiles.values():  # every instance fits at each of its placements
        assert all(start + profile.memory_slices <= spec.mig_memory_slices for start in profile.placements)
        assert len(profile.placements) >= profile.max_instances


def test_compute_slices_come_from_the_catalogue_everywhere():
    assert gpu_compute_slices("NVIDIA A30") == 4 and gpu_compute_slices("H200") == 7
    assert gpu_compute_slices("NVIDIA RTX 9999") == 7  # unknown: the largest split the catalogue knows
    assert mig_share("2g.12gb", "NVIDIA A30") == pytest.approx(0.5)
    assert mig.fraction_slices(0.5, "NVIDIA A30") == 2 and mig.fraction_slices(0.5, "NVIDIA H100 80GB HBM3") == 4
    assert mig.fits("NVIDIA A30", ["2g.12gb"], "2g.12gb") and not mig.fits("NVIDIA A30", ["2g.12gb", "2g.12gb"], "1g.6gb")
    assert mig.valid_layouts("A30") == [("1g.6gb", "1g.6gb", "1g.6gb", "1g.6gb"), ("1g.6gb", "1g.6gb", "2g.12gb"),
                                        ("2g.12gb", "2g.12gb"), ("4g.24gb",)]
    advice = mig.advise_layouts("NVIDIA A30", 2, {"2g.12gb": 1})
    # one GPU gets 2g.12gb + 2g.12gb: 2 of its 4 slices beyond the demand, none left unpartitioned (7 would leave 3)
    assert (advice.wasted_compute_slices, advice.unused_slices) == (2, 0)
    assert mig.mig_table("B200") == gpu_catalogue().mig_profiles("NVIDIA B200")


def test_the_simulator_and_the_price_book_read_the_catalogue():
    for name, model in MODELS.items():
        spec = gpu_catalogue().model(name)
        assert (model.memory_bytes, model.tdp_watts, model.max_sm_clock_mhz) == (
            spec.memory_bytes, spec.tdp_watts, spec.max_sm_clock_mhz)
        assert [p.name for p in model.mig_profiles] == list(spec.mig_profiles)
    for name, layout in MIG_LAYOUTS.items():  # the simulated layouts are valid and use every compute slice
        used: list[str] = []
        for profile in layout:
            assert mig.fits(name, used, profile)
            used.append(profile)
        assert sum(mig.mig_spec(name, p).compute_slices for p in layout) == mig.compute_slices(name)
    book = PriceBook.default()
    assert book.model("NVIDIA-H100-80GB-HBM3").name == "NVIDIA H100 80GB HBM3"
    assert book.model("H200").name == "NVIDIA H200"
    assert book.model("NVIDIA H200 NVL").name == "NVIDIA H200"  # billed at the H200's prices
    assert book.model("NVIDIA B200").tdp_watts == gpu_catalogue().model("B200").tdp_watts == 1000.0


def test_a_price_book_entry_may_be_keyed_by_an_alias():
    book = PriceBook.from_mapping({"models": {"H100": {"on-demand": 5.0}}})
    assert book.hourly("NVIDIA H100 80GB HBM3", "on-demand") == 5.0
    assert book.model("NVIDIA H100 80GB HBM3").tdp_watts == 700.0


@pytest.mark.parametrize("which, find, replace, message", [
    ("models", "NVIDIA H200,141,700,", "NVIDIA H200,141,seven hundred,", "tdp_watts 'seven hundred' is not a number"),
    ("models", "NVIDIA H200,141,700,1980,true,", "NVIDIA H200,141,700,1980,yes,", "gpm_supported must be true or false"),
    ("models", "NVIDIA L4,24,72,2040,false,0,0,", "NVIDIA L4,24,72,2040,false,7,0,", "both 0"),
    ("models", "|H200-SXM-141GB", "|H100", "'H100' names both"),
    ("profiles", "NVIDIA H200|NVIDIA H200 NVL,2g.35gb,2,", "NVIDIA H200|NVIDIA H200 NVL,2g.35gb,3,",
     "must be named <compute slices>g"),
    ("profiles", "NVIDIA B200,3g.90gb,3,4,90,2,0 4", "NVIDIA B200,3g.90gb,3,4,90,2,0 5", "placements '0 5'"),
    ("profiles", "NVIDIA A30,1g.6gb,", "NVIDIA A31,1g.6gb,", "model 'NVIDIA A31' is not in"),
    ("profiles", "NVIDIA B200,7g.180gb,7,8,180,1,0", "NVIDIA B200,7g.180gb,7,8,180,1", "placements ''"),
    ("profiles", "NVIDIA B200,7g.180gb,7,8,180,1,0", "NVIDIA B200,7g.180gb,7,8,180,1,0,extra", "more than the 7 fields"),
])
def test_a_broken_line_is_named(tmp_path, which, find, replace, message):
    models, profiles = _copy(tmp_path)
    path = models if which == "models" else profiles
    text = path.read_text()
    assert find in text
    lineno = _line_of(path, find)
    path.write_text(text.replace(find, replace, 1))
    with pytest.raises(CatalogueError) as error:
        load_gpu_catalogue(models, profiles)
    assert f"{path}:{lineno}: " in str(error.value) and message in str(error.value)


def test_a_mig_model_without_a_full_gpu_profile_is_refused(tmp_path):
    models, profiles = _copy(tmp_path)
    lines = [line for line in profiles.read_text().splitlines() if not line.startswith("NVIDIA A30,4g.24gb")]
    profiles.write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogueError, match="NVIDIA A30 has MIG but no profile taking all 4 compute slices"):
        load_gpu_catalogue(models, profiles)
