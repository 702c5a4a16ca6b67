"""One import rule for every ``py:`` spec (--meter, --device, --model), driven through the CLI as ``tune``.

The ``tune`` console script, unlike ``python -m tuner``, does not put the
working folder on the import path; ``python -P -m tuner`` behaves as the
script does, so these tests run the CLI that way. A module in the working
folder is found for every flag, as ``py:mymodels:build`` always was, and a
module file another user could rewrite is refused before any of it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import FAKES
from locations import REPO as ROOT
from test_plugins import PLUGIN

MARK = "import pathlib\npathlib.Path('imported').write_text('ran')\n"
MODEL = "import torch\ndef build():\n    return torch.nn.Linear(4, 2), (4,)\n"


def tune(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``tune ARGS`` as the console script runs it: the working folder is not on the import path."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-P", "-m", "tuner", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # a LoadGen window of the tiny CNN on this CPU
def test_a_meter_plugin_in_the_working_folder_is_found_as_a_model_is(tmp_path, rapl_at_15w):
    (tmp_path / "mymeter.py").write_text((FAKES / "fakemeter.py").read_text())
    r = tune(tmp_path, "measure", "--model", "tiny-cnn", "--device", "cpu", "--window", "1", "--batch-size", "2",
             "--json", "--meter", "py:mymeter:ConstantMeter")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["measurements"][0]["avg_w"] == pytest.approx(42.0)


def test_a_device_plugin_in_the_working_folder_is_found(tmp_path):
    (tmp_path / "tableplug.py").write_text(PLUGIN)
    r = tune(tmp_path, "run", "--model", "resnet50", "--device", "py:tableplug:TableDevice", "--max-latency", "15ms",
             "--trials", "2", "--seed", "1", "--out", str(tmp_path / "out"), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["measured"] >= 2


SPECS = [
    ("--meter", ("measure", "--model", "tiny-cnn", "--device", "cpu", "-b", "2", "--meter", "py:plug:M")),
    ("--device", ("run", "--model", "resnet50", "--device", "py:plug:M", "--max-latency", "15ms", "--out", "../o")),
    ("--model", ("run", "--model", "py:plug:build", "--device", "cpu", "--max-latency", "15ms", "--out", "../o")),
]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file as another user needs root (chown)")
@pytest.mark.parametrize("how", ["group-writable", "other-owner", "folder-writable"])
@pytest.mark.parametrize(("flag", "args"), SPECS, ids=[s[0] for s in SPECS])
def test_a_module_another_user_could_rewrite_is_refused_before_it_runs(tmp_path, rapl_at_15w, flag, args, how):
    work = tmp_path / "work"
    work.mkdir()
    module = work / "plug.py"
    module.write_text(MARK + MODEL)
    module.chmod(0o644)
    if how == "group-writable":
        module.chmod(0o664)
    elif how == "other-owner":
        os.chown(module, 12345, 12345)
    else:
        work.chmod(0o777)
    r = tune(work, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "refusing to run plug" in lines[0], r.stderr
    assert flag in lines[0] and ("chmod" in lines[0] or "chown" in lines[0]), lines[0]
    assert not (work / "imported").exists()
