"""The board's thermal zones, the limit above which a trial is aborted, and the thermal caps in force.

A cooling device of the kernel's devfreq or cpufreq cooling (drivers/thermal/devfreq_cooling.c, named
``devfreq-<device>``, ``thermal-devfreq-<n>`` before Linux 5.12; cpufreq_cooling.c, ``cpufreq-cpu<n>``)
caps a clock through a PM QoS max-frequency request, and the limits read back capped: devfreq's
``max_freq`` shows the lowest of every request (devfreq.c max_freq_show, get_freq_range), cpufreq's
``scaling_max_freq`` the resolved policy->max. While one is in a state above 0 (``cur_state``), a limit
read is not what the user set, so it is never saved as the board's original, and a restore writes every
limit rather than trusting a read-back that happens to match.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.devices.jetson import sysfs
from tuner.devices.jetson.board import Board
from tuner.devices.jetson.errors import ThermalLimitError

DEFAULT_THERMAL_LIMIT_C = 90.0
# Zones whose sensor is off read -256 C on Orin (CV0/CV1/CV2-therm without the DLA/PVA powered).
NO_SENSOR_C = -200.0
COOLING = "sys/class/thermal"
CLOCK_COOLING = re.compile(r"(thermal-)?(devfreq|cpufreq)-\S+")


def thermal_caps(root: Path) -> list[str]:
    """The clock cooling devices capping a limit now, e.g. ``cooling_device1 (devfreq-17000000.gpu) state 2``."""
    found: list[str] = []
    for device in sorted((root / COOLING).glob("cooling_device*")):
        kind, state = device / "type", device / "cur_state"
        if not (sysfs.is_file(kind) and sysfs.is_file(state)):
            continue
        try:
            name, level = sysfs.read(kind), int(sysfs.read(state))
        except (OSError, ValueError):
            continue
        if CLOCK_COOLING.fullmatch(name) and level > 0:
            found.append(f"{device.name} ({name}) state {level}")
    return found


class ThermalGuard:
    """Reads the board's thermal zones and refuses a trial above the limit (part of JetsonDevice)."""

    board: Board
    thermal_limit_c: float

    def temperatures(self) -> dict[str, float]:
        temps: dict[str, float] = {}
        for zone, path in self.board.zones.items():
            try:
                celsius = int(sysfs.read(path)) / 1000
            except (OSError, ValueError):
                continue  # some zones refuse reads while their sensor is off
            if celsius > NO_SENSOR_C:
                temps[zone] = celsius
        return temps

    def check_thermal(self, temps: dict[str, float] | None = None) -> dict[str, float]:
        """Raise ThermalLimitError if any zone is above the limit; return the temperatures."""
        temps = self.temperatures() if temps is None else temps
        hot = {z: t for z, t in temps.items() if t > self.thermal_limit_c}
        if hot:
            shown = ", ".join(f"{z} {t:.1f} C" for z, t in sorted(hot.items()))
            raise ThermalLimitError(f"thermal limit {self.thermal_limit_c:.0f} C exceeded ({shown}): trial aborted")
        return temps
