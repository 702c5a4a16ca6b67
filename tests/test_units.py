import pytest

from tuner.errors import UserError
from tuner.plumbing.units import format_ms, parse_int_list, parse_latency_ms


@pytest.mark.parametrize("text", ["50ms", "50 ms", "0.05s", "50000us", "5e-2 s", " 50MS "])
def test_latency_spellings_agree(text):
    assert parse_latency_ms(text) == pytest.approx(50.0)


@pytest.mark.parametrize("text", ["50", "fast", "50 parsecs", "-5ms", "0ms", ""])
def test_bad_latency_is_a_user_error_naming_the_fix(text):
    with pytest.raises(UserError, match="50ms"):
        parse_latency_ms(text)


def test_canonical_bound_spelling():
    assert format_ms(parse_latency_ms("0.05s")) == format_ms(parse_latency_ms("50 ms")) == "50ms"


def test_int_list():
    assert parse_int_list("1, 8,32", "--batch-sizes") == [1, 8, 32]
    with pytest.raises(UserError, match="--batch-sizes"):
        parse_int_list("1,x", "--batch-sizes")
    with pytest.raises(UserError):
        parse_int_list("0", "--batch-sizes")


def test_figures_never_print_in_exponent_form_and_units_head_their_columns():
    from tuner.cli.common import column_head, fmt
    from tuner.plumbing.units import figure

    assert figure(13761.2) == "13761" and fmt(13761.2) == "13761"
    assert figure(0.074681) == "0.07468" and figure(45.9) == "45.9"
    assert column_head("power_limit_w") == "power\nlimit\nW" and column_head("gpu_mhz") == "gpu\nMHz"
