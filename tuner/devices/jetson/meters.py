"""Energy meters of a Jetson: the INA3221 rails sampled on a thread, or a jetson-stats service.

The rails read a sensor every period and integrate by the trapezoid rule; the
board's own labels name them, and the meter says which rails its total is and
that it is not wall power.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tuner.devices.jetson.board import Rail
from tuner.errors import UserError
from tuner.measure.meters import EnergyReading
from tuner.measure.poller import Poller

JTOP_PERIOD_S = 0.5
# The module's input rail, which the others are part of: VDD_IN (Orin Nano/NX, TX2, Xavier NX) or
# POM_5V_IN (Nano on L4T 32), the two jetson-stats takes as the total (jtop/core/power.py total_power).
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


class RailMeter:
    """Energy from the INA3221 rails: per-rail trapezoid integration on a sampling thread.

    When the board has a VDD_IN or POM_5V_IN rail (module input, e.g. Orin Nano, TX2)
    that alone is the total, since the other rails are part of it; otherwise (AGX Orin, AGX Xavier) the
    rails are summed, and the reading warns that this is not wall power: the
    module has no VDD_IN rail and the carrier board is not covered.
    """

    name = "ina3221"
    min_window_s = 1.0

    def __init__(
        self,
        rails: list[Rail],
        period_s: float = 0.05,
        temperatures: Callable[[], dict[str, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._all = rails
        total = [r for r in rails if r.name in TOTAL_RAILS][:1]
        self._summed = total or rails
        self.rails = [r.name for r in self._summed]
        self.warning = (
            f"{total[0].name} is the module's input power: carrier board and supply losses are not included"
            if total
            else f"sum of INA3221 rails {', '.join(self.rails)}: the module has no VDD_IN rail, "
            "so this is not wall power"
        )
        self.period_s = period_s
        self._temperatures = temperatures
        self._clock = clock
        self._poller = Poller(self._sample, period_s, "ina3221-meter")
        self._t: list[float] = []
        self._w: dict[str, list[float]] = {}
        self.max_temps_c: dict[str, float] = {}
        self._temp_every = max(1, round(1.0 / period_s))

    def _sample(self, temps: bool = False) -> None:
        now = self._clock()
        watts = {r.name: r.watts() for r in self._all}
        self._t.append(now)
        for name, w in watts.items():
            self._w.setdefault(name, []).append(w)
        temps = temps or (len(self._t) - 1) % self._temp_every == 0
        if self._temperatures is not None and temps:
            for zone, c in self._temperatures().items():
                self.max_temps_c[zone] = max(c, self.max_temps_c.get(zone, c))

    def start(self) -> None:
        self._t, self._w, self.max_temps_c = [], {}, {}
        self._sample(temps=True)
        self._poller.start()

    def stop(self) -> EnergyReading:
        self._poller.stop()
        self._sample(temps=True)
        per_rail = {name: _trapezoid(self._t, w) for name, w in self._w.items()}
        energy = sum(per_rail[name] for name in self.rails)
        duration = self._t[-1] - self._t[0]
        if duration > 0 and energy <= 0:
            raise UserError(
                f"INA3221 rails {', '.join(self.rails)} read no power over {duration:.2f} s: "
                "the sensor is not updating; pick another --meter"
            )
        extra = {f"rail_j:{name}": j for name, j in per_rail.items()}
        return EnergyReading(
            energy,
            duration,
            energy / duration if duration > 0 else 0.0,
            self.name,
            list(self.rails),
            len(self._t),
            self.warning,
            extra,
        )


def _trapezoid(t: list[float], w: list[float]) -> float:
    return sum((t[i + 1] - t[i]) * (w[i] + w[i + 1]) / 2 for i in range(len(t) - 1))


class JtopMeter:
    """Total power from a running jetson-stats (jtop) service, integrated like the rails.

    jetson-stats is AGPL-3.0 and optional (``pip install 'powertune[jetson]'``);
    it is imported only when this meter is chosen. jtop samples no faster
    than every 0.5 s, so short windows are refused by ``min_window_s``.
    """

    name = "jtop"
    min_window_s = 5.0

    def __init__(self, period_s: float = JTOP_PERIOD_S) -> None:
        try:
            from jtop import jtop  # type: ignore[import-not-found]
        except ImportError:
            raise UserError(
                "--meter jtop needs jetson-stats (AGPL-3.0): pip install 'powertune[jetson]' "
                "and start its service (sudo systemctl start jtop)"
            ) from None
        self._jtop_cls = jtop
        self.period_s = max(period_s, JTOP_PERIOD_S)
        self.rails = ["jtop:tot"]
        self._poller = Poller(self._sample, self.period_s, "jtop-meter")
        self._t: list[float] = []
        self._w: list[float] = []
        self._jtop: Any = None

    def _watts(self) -> float:
        power = self._jtop.power
        return float(power["tot"]["power"]) / 1000

    def _sample(self) -> None:
        self._t.append(time.monotonic())
        self._w.append(self._watts())

    def start(self) -> None:
        self._jtop = self._jtop_cls()
        self._jtop.start()
        self._t, self._w = [], []
        self._sample()
        self._poller.start()

    def stop(self) -> EnergyReading:
        try:
            self._poller.stop()
            self._sample()
        finally:
            self._jtop.close()
        energy = _trapezoid(self._t, self._w)
        duration = self._t[-1] - self._t[0]
        return EnergyReading(
            energy,
            duration,
            energy / duration if duration > 0 else 0.0,
            self.name,
            list(self.rails),
            len(self._t),
            "jtop total power (its own rail selection); not wall power",
        )
