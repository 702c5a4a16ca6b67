"""Fleet verification: 8 twin units that differ (sim:orin#unit=N, a seeded per-unit power and speed) verify one
export against one PostgreSQL study; those outside the tolerance re-tune locally; tune status --fleet sums up.

The units are a test device (tuner.devices.virtual.twin_units.UnitVariation), not hardware.
"""

from __future__ import annotations

import json

import pgserver
import pytest
from clirun import in_process

from tuner.devices.virtual.twin_units import UnitVariation

pytestmark = pytest.mark.slow  # a PostgreSQL server and 8 units' windows and re-tunes

UNITS = range(8)
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def pg():
    with pgserver.server_for_tests() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(pg, tmp_path_factory):
    """The fleet's study (tuned once, on the twin every unit is a copy of) and its export."""
    pg.create_database("verify")
    url = pg.url("verify")
    folder = tmp_path_factory.mktemp("fleet")
    code, _, err = in_process(
        "run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--trials", "10", "--seed", "5", "--storage", url,
        "--out", str(folder),
    )  # fmt: skip
    assert code == 0, err
    code, _, err = in_process(
        "export", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--storage", url, "-o", str(folder / "best.yaml")
    )
    assert code == 0, err
    return url, folder / "best.yaml"


def test_eight_units_verify_one_export_and_status_reports_the_fleet(fleet):
    url, export = fleet
    verdicts = {}
    for unit in UNITS:
        code, out, err = in_process(
            "verify", str(export), "--device", f"sim:orin#unit={unit}", "--storage", url, "--unit", f"unit{unit}",
            "--tolerance", str(TOLERANCE), "--seed", str(unit), "--json",
        )  # fmt: skip
        assert code == 0, err
        verdicts[unit] = json.loads(out)
    for unit, v in verdicts.items():
        factor = UnitVariation.parse(f"unit={unit}", "test")
        energy = factor.power * factor.time
        assert v["windows"] <= 3
        if v["verdict"] == "verified":
            assert v["j_per_query"] <= v["study_j_per_query"] * (1 + TOLERANCE)
            assert v["latency_ms"] <= 50 and v["retune"] is None
        else:
            assert v["verdict"] == "retuned" and v["retune"]["trials"] <= 6 and v["retune"]["seeded"] >= 1
            assert v["retune"]["latency_ms"] <= 50
            assert "over" in v["reason"]
        if energy <= 0.99:  # a unit that draws clearly less keeps the fleet's answer
            assert v["verdict"] == "verified", (unit, v)
        if energy >= 1.03:  # one that draws clearly more than the tolerance re-tunes
            assert v["verdict"] == "retuned", (unit, v)
    assert {v["verdict"] for v in verdicts.values()} == {"verified", "retuned"}

    code, out, err = in_process("status", "--fleet", "--storage", url, "--json")
    assert code == 0, err
    (summary,) = json.loads(out)["fleets"]
    assert len(summary["units"]) == 8
    assert summary["verified"] + summary["retuned"] == 8
    assert summary["retuned"] == sum(v["verdict"] == "retuned" for v in verdicts.values())
    spread = summary["spread"]
    assert spread["min"] <= spread["median"] <= spread["max"] and spread["relative"] > 0
    code, out, _ = in_process("status", "--fleet", "--storage", url)
    assert code == 0 and "8 units" in out and "re-tuned" in out

    # A re-tuned unit's local study sits beside the fleet's, seeded from it; the fleet study's answer is unchanged.
    retuned = [v for v in verdicts.values() if v["retune"]]
    assert all(v["retune"]["study"] != v["study"] for v in retuned)


def test_bad_exports_are_refused_in_one_line(fleet, tmp_path):
    url, export = fleet
    base = ["--storage", url, "--unit", "bad"]
    cases = []
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(export.read_text().replace("max_latency_ms: 50.0", "max_latency_ms: 80.0"))
    cases.append((["verify", str(tampered), "--device", "sim:orin#unit=1", *base], "changed after export"))
    cases.append((["verify", str(export), "--device", "sim:h200", *base], "is h200"))  # another device kind
    cases.append((["verify", str(export), "--model", "bert-base", "--device", "sim:orin", *base], "not bert-base"))
    unsealed = tmp_path / "unsealed.yaml"
    unsealed.write_text("\n".join(line for line in export.read_text().splitlines() if not line.startswith("digest:")))
    cases.append((["verify", str(unsealed), "--device", "sim:orin", *base], "no integrity digest"))
    cases.append((["verify", str(export), "--device", "sim:orin#unit=x", *base], "unit=N"))
    for args, message in cases:
        code, out, err = in_process(*args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    code, out, _ = in_process("status", "--fleet", "--storage", url, "--json")
    units = json.loads(out)["fleets"][0]["units"] if json.loads(out)["fleets"] else []
    assert all(u["unit"] != "bad" for u in units)  # nothing recorded for a refused input
