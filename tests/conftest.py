import os
import sys
import threading
import time
from pathlib import Path

import pytest

# The twin's calibration tooling (scripts/twin_calibration.py, scripts/twin_checks.py) is not in the package.
# Appended, not prepended: the installed tuner still comes first.
sys.path.append(str(Path(__file__).resolve().parent.parent / "scripts"))


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
