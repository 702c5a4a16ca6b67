import fcntl
import hashlib
import importlib.util
import os
import pickle
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# One BLAS thread, as the CLI runs (tuner.launch): the learned strategy's near-ties (an early stop at a bound of
# 0.94% against a 1% resolution) come out alike on every machine only when its matrix sums are added in one order.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# tests/fakes/ (fake boards, drivers, meters, hostile peers) and tests/support/ (clirun, pgserver, locations, ...)
# hold plain modules that tests import by name (``from fakeboard import make_fake_board``, ``from clirun import
# run_cli``); test files themselves have no __init__.py, so pytest imports each by its (unique) basename.
_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS / "fakes"), str(_TESTS / "support")]
# Test modules whose helpers tests in other folders import by name: test_window (SleepyRunner, for
# devices/meters/test_netmeters.py), test_profile_onnx (tiny_cnn_onnx, for cli/test_own_model.py and
# cli/test_own_words.py) and test_plugins (PLUGIN, for cli/test_py_specs.py). pytest puts a test file's own
# folder on sys.path only once it collects that file, so a run of the importing file alone needs these.
sys.path[2:2] = [str(_TESTS / "measure"), str(_TESTS / "runner"), str(_TESTS / "devices")]

# The twin's calibration tooling (scripts/twin_calibration.py, scripts/twin_checks.py) is not in the package.
# Appended, not prepended: the installed tuner still comes first.
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m "not slow"``, a module marked slow as a whole (``pytestmark = pytest.mark.slow``) is not imported.

    Every test in it would be deselected anyway; importing it costs each xdist worker torch and LoadGen.
    """
    if config.getoption("markexpr", "") != "not slow" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py" or not collection_path.is_file():
        return None
    return True if re.search(r"^pytestmark = pytest\.mark\.slow\b", collection_path.read_text(), re.M) else None


# A test marked ``loadgen`` or ``torch`` needs that library; where it is not installed the test is skipped
# with the install line as its reason. CI installs both (.ci/run), so there a missing one fails instead.
NEEDS = {
    "loadgen": ("mlperf_loadgen", "needs LoadGen: pip install 'powertune[loadgen]'"),
    "torch": ("torch", "needs torch: pip install torch==2.13.0"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip each test marked with a library (NEEDS) that is not installed here, naming how to install it."""
    if os.environ.get("CI"):
        return
    missing = {marker: reason for marker, (module, reason) in NEEDS.items() if importlib.util.find_spec(module) is None}
    for item in items:
        for marker, reason in missing.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Journals of every test go to its own folder, never to the user's state dir."""
    monkeypatch.setenv("TUNE_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def rapl_at_15w(tmp_path, monkeypatch):
    """A package zone whose counter a thread advances as a 15 W CPU would."""
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    energy = zone / "energy_uj"
    energy.write_text("0\n")
    stop = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not stop.wait(0.01):
            tmp = energy.with_suffix(".tmp")  # atomic, as a sysfs read never sees half a value
            tmp.write_text(f"{int((time.monotonic() - start) * 15e6)}\n")
            os.replace(tmp, energy)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    monkeypatch.setenv("TUNE_POWERCAP_ROOT", str(tmp_path))
    yield
    stop.set()
    thread.join()


@dataclass(frozen=True)
class TwinStudy:
    """A finished twin study, copied into the test's own folder: read it, resume it, export from it."""

    out: Path  # the results folder (--out): tune.db and a folder per device and model
    url: str  # its SQLite storage
    name: str  # the Optuna study name
    summary: Any  # tuner.study.RunSummary of the run that made it (its ``storage`` names the cached original)
    options: Any  # the tuner.run_options.RunOptions it ran with (``out`` is the copy)


@pytest.fixture(scope="session")
def made_once(tmp_path_factory) -> Callable[[str, Callable[[Path], Any]], tuple[Path, Any]]:
    """``made_once(name, build)``: ``build(folder)`` runs once per test run, whichever xdist worker asks first.

    The tests run in one pytest-xdist worker per core (pyproject.toml's addopts), each a process of its own,
    so a session fixture alone would be built once per worker. This one builds into a folder every worker
    of the run sees (the parent of the workers' base temp folders; the base temp folder itself without
    xdist), under an flock, and hands back the folder and what ``build`` returned (pickled beside it).
    A worker that asks while another builds waits for it; a build that raised is tried again by the next
    asker. The folder is shared: copy it before writing to it (``twin_study`` does).
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made-once"
    root.mkdir(exist_ok=True)

    def get(name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
        folder, done = root / name, root / f"{name}.pickle"
        fd = os.open(root / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not done.exists():
                if folder.exists():
                    shutil.rmtree(folder)  # what a build that raised left behind
                folder.mkdir()
                made = build(folder)
                done.with_suffix(".tmp").write_bytes(pickle.dumps(made))
                os.replace(done.with_suffix(".tmp"), done)
            return folder, pickle.loads(done.read_bytes())
        finally:
            os.close(fd)  # drops the flock

    return get


@pytest.fixture
def twin_study(made_once, tmp_path):
    """Factory for a study run once per test run with ``run_study`` on a twin, handed out as a private copy.

    ``twin_study(device="sim:orin", model="resnet50", max_latency_ms=50.0, trials=14, seed=0, **RunOptions)``
    returns a TwinStudy under ``tmp_path``; tests that ask for the same options share one run (a few CPU
    seconds for the default), in whichever xdist worker they run, and may write to their copy (pareto files,
    a resume) without affecting each other.
    """
    from tuner.devices.registry import open_device
    from tuner.run_options import RunOptions
    from tuner.study import run_study

    made = 0

    def make(device: str = "sim:orin", **kw: Any) -> TwinStudy:
        nonlocal made
        settings = {"model": "resnet50", "max_latency_ms": 50.0, "trials": 14, "seed": 0, **kw}
        key = repr((device, sorted((k, repr(v)) for k, v in settings.items())))

        def build(folder: Path) -> tuple[str, Any]:
            study, summary = run_study(open_device(device), RunOptions(**settings, out=folder))
            storage = study._storage
            getattr(storage, "_backend", storage).engine.dispose()  # closed: the copies are whole files
            return study.study_name, summary

        folder, (name, summary) = made_once(f"twin-study-{hashlib.sha1(key.encode()).hexdigest()[:16]}", build)
        made += 1
        out = tmp_path / f"twin-study-{made}"
        shutil.copytree(folder, out)
        url = f"sqlite:///{(out / 'tune.db').as_posix()}"
        options = RunOptions(**settings, out=out)
        return TwinStudy(out=out, url=url, name=name, summary=summary.model_copy(), options=options)

    return make
