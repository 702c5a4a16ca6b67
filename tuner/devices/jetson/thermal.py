"""The board's thermal zones and the limit above which a trial is aborted."""

from __future__ import annotations

from tuner.devices.jetson import sysfs
from tuner.devices.jetson.board import Board
from tuner.devices.jetson.errors import ThermalLimitError

DEFAULT_THERMAL_LIMIT_C = 90.0
# Zones whose sensor is off read -256 C on Orin (CV0/CV1/CV2-therm without the DLA/PVA powered).
NO_SENSOR_C = -200.0


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
