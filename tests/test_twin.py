import itertools

import numpy as np
import pytest

from runners.profile import load_profile
from tuner.calibration import load_rows, twin_errors
from tuner.devices.base import WindowSettings
from tuner.devices.twin import TwinDevice
from tuner.errors import UserError
from tuner.space import Config

EXACT = WindowSettings(noise=False)


def test_twin_reproduces_every_calibration_row_within_15_percent():
    errors = twin_errors(load_rows())
    assert len(errors) == 15
    for e in errors:
        assert abs(e["time_err"]) <= 0.15, e
        if e["power_err"] is not None:
            assert abs(e["power_err"]) <= 0.15, e


def test_maxn_is_not_the_most_energy_efficient_mode_for_resnet50():
    """Each nvpmodel mode at its own full clocks (what users get by picking a mode), as Pagoda compares them."""
    orin = TwinDevice("sim:orin")
    space = orin.space()
    for batch in (1, 8, 32):
        energy = {}
        for mode in ("MAXN", "50W", "30W", "15W"):
            config = space.default_config(batch)
            config = space.effective(config.model_copy(update={"knobs": {**config.knobs, "nvpmodel": mode}}))
            energy[mode] = orin.measure("resnet50", config, EXACT).j_per_query
        assert min(energy, key=energy.get) != "MAXN", (batch, energy)


def test_energy_per_query_falls_with_batch_size_until_the_gpu_saturates():
    for name in ("sim:orin", "sim:h200"):
        device = TwinDevice(name)
        space = device.space()
        energy = [device.measure("resnet50", space.default_config(b), EXACT).j_per_query for b in space.batch_sizes]
        assert all(a > b for a, b in itertools.pairwise(energy)), (name, energy)
        assert energy[0] / energy[2] > 1.5  # small batches waste energy on launch-bound idle power
        assert energy[-2] / energy[-1] < 1.05  # saturated: the last doubling gains little


def test_h200_power_limit_is_enforced_by_lowering_the_clock():
    h200 = TwinDevice("sim:h200")
    knobs = {"sm_mhz": 1980, "mem_mhz": 3201, "power_limit_w": 300, "precision": "fp16"}
    m = h200.measure("resnet50", Config(knobs=knobs, batch_size=512), EXACT)
    assert m.avg_w <= 300 + 1e-6
    assert m.throttled
    assert m.extra["gpu_mhz_effective"] < 1980
    free = h200.measure("resnet50", Config(knobs={**knobs, "power_limit_w": 700}, batch_size=512), EXACT)
    assert free.qps > m.qps and not free.throttled


def test_lower_clocks_are_slower_and_memory_clock_matters_for_memory_bound_models():
    orin = TwinDevice("sim:orin")
    base = orin.space().default_config(32)
    slow = base.model_copy(update={"knobs": {**base.knobs, "gpu_mhz": 624.75}})
    assert orin.measure("resnet50", slow, EXACT).qps < orin.measure("resnet50", base, EXACT).qps
    low_emc = base.model_copy(update={"knobs": {**base.knobs, "emc_mhz": 665.6}})
    ratio_mobilenet = orin.measure("mobilenet_v2", low_emc, EXACT).qps / orin.measure("mobilenet_v2", base, EXACT).qps
    ratio_bert = orin.measure("bert-base", low_emc, EXACT).qps / orin.measure("bert-base", base, EXACT).qps
    assert ratio_mobilenet < ratio_bert  # low arithmetic intensity suffers more from a slow EMC


def test_seeded_noise_is_reproducible_and_about_one_to_two_percent():
    orin = TwinDevice("sim:orin")
    config = orin.space().default_config(8)
    seeded = [orin.measure("resnet50", config, WindowSettings(seed=s)).j_per_query for s in range(200)]
    again = [orin.measure("resnet50", config, WindowSettings(seed=s)).j_per_query for s in range(200)]
    assert seeded == again
    cv = np.std(seeded) / np.mean(seeded)
    assert 0.005 < cv < 0.03


def test_every_twin_output_says_twin():
    m = TwinDevice("sim:h200").measure("bert-base", TwinDevice("sim:h200").space().default_config(8), EXACT)
    assert m.twin and m.meter == "twin"
    assert "twin" in TwinDevice("sim:orin").describe()["title"]


def test_vectorized_matches_single_evaluation():
    orin = TwinDevice("sim:orin")
    grid = orin.space().narrow(knobs=["gpu_mhz"], batch_sizes=[4]).grid()
    many = orin.measure_many("efficientnet_b0", grid, EXACT)
    for config, m in zip(grid[:5], many[:5], strict=False):
        assert orin.measure("efficientnet_b0", config, EXACT).j_per_query == pytest.approx(m.j_per_query)


def test_unknown_twin_and_model():
    with pytest.raises(UserError, match="sim:orin"):
        TwinDevice("sim:gameboy")
    with pytest.raises(UserError, match="resnet50"):
        load_profile("alexnet")
