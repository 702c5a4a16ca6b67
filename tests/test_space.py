import optuna
import pytest

from tuner.errors import UserError
from tuner.space import Config, SearchSpace, available_kinds, load_space, load_space_file, parse_assignments


def test_packaged_spaces_validate():
    for kind in available_kinds():
        space = load_space(kind)
        assert space.kind == kind
        assert space.batch_sizes


def test_orin_mode_caps_reduce_configurations():
    space = load_space("orin-agx")
    wanted = Config(
        knobs={"nvpmodel": "30W", "gpu_mhz": 1300.5, "emc_mhz": 3199, "cpu_cores": 12, "cpu_mhz": 2201.6}, batch_size=8
    )
    eff = space.effective(wanted)
    assert eff.knobs["gpu_mhz"] == 612  # the 30W cap sits on the 102 MHz grid
    assert eff.knobs["cpu_cores"] == 8
    assert eff.knobs["cpu_mhz"] == 1651.2
    other = wanted.model_copy(update={"knobs": {**wanted.knobs, "gpu_mhz": 918}})
    assert space.effective(other).key() == eff.key()
    assert space.effective(space.default_config(8)).key() == space.default_config(8).key()


def test_grid_holds_each_effective_configuration_once():
    space = load_space("orin-agx").narrow(knobs=["nvpmodel", "gpu_mhz"], batch_sizes=[1])
    grid = space.grid()
    keys = [c.key() for c in grid]
    assert len(keys) == len(set(keys))
    # MAXN and 50W keep their own clocks below their caps; 30W and 15W fold the top of the table.
    assert len(grid) < 4 * 13
    assert all(space.effective(c).key() == c.key() for c in grid)


def test_narrow_and_unknown_knob():
    space = load_space("h200").narrow(knobs=["precision"], batch_sizes=[1, 8])
    assert space.tuned_knobs == ["precision"]
    assert space.batch_sizes == [1, 8]
    with pytest.raises(UserError, match="choose from"):
        load_space("h200").narrow(knobs=["warp_speed"])


def test_suggest_and_params_round_trip():
    space = load_space("orin-agx")
    config = Config(
        knobs={"nvpmodel": "50W", "gpu_mhz": 612, "emc_mhz": 2133, "cpu_cores": 4, "cpu_mhz": 1190.4}, batch_size=16
    )
    study = optuna.create_study()
    study.enqueue_trial(space.params_for(config))
    trial = study.ask()
    assert space.suggest(trial) == config


def test_pin_and_validate():
    space = load_space("h200").pin("sm_mhz", 1500)
    assert space.knobs["sm_mhz"].values == [1500]
    bad = space.default_config(1).model_copy(update={"knobs": {**space.default_config(1).knobs, "sm_mhz": 1980}})
    with pytest.raises(UserError, match="not supported"):
        space.validate_config(bad)


def test_assignments_are_typed_and_checked():
    space = load_space("orin-agx")
    assert parse_assignments(["gpu_mhz=918", "nvpmodel=30W"], space) == {"gpu_mhz": 918, "nvpmodel": "30W"}
    with pytest.raises(UserError, match="choose one of"):
        parse_assignments(["gpu_mhz=931"], space)
    with pytest.raises(UserError, match="knob=value"):
        parse_assignments(["gpu_mhz"], space)


def test_unknown_kind_lists_known():
    with pytest.raises(UserError, match="orin-agx"):
        load_space("tx9")


@pytest.mark.parametrize(
    "content, message",
    [
        ("knobs: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
        ("version: 1\nkind: x\nknobs: {}\n", "batch_sizes"),
        ("version: 1\nkind: x\nbatch_sizes: [1]\nknobs:\n  a: {values: [1, 2], default: 3}\n", "default"),
    ],
)
def test_corrupt_space_file_is_one_line_error(tmp_path, content, message):
    path = tmp_path / "space.yaml"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        load_space_file(path)
    assert "\n" not in str(info.value)


def test_space_model_requires_version_one():
    with pytest.raises(ValueError):
        SearchSpace.model_validate({"version": 2, "kind": "x", "knobs": {}, "batch_sizes": [1]})


def test_a_whole_number_names_the_one_clock_less_than_a_unit_away():
    """--set gpu_mhz=1300 (docs/usage.md) names the Orin's 1300.5 MHz; a number between two values is refused."""
    space = load_space("orin-agx")
    assert parse_assignments(["gpu_mhz=1300"], space) == {"gpu_mhz": 1300.5}
    assert parse_assignments(["gpu_mhz=1300.5"], space) == {"gpu_mhz": 1300.5}
    with pytest.raises(UserError, match="gpu_mhz=1250 is not supported"):
        parse_assignments(["gpu_mhz=1250"], space)
