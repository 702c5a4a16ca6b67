"""The meter ``--meter`` names read together with the device's own: a trial records both.

The named meter (wall power, say) is the primary: its energy is the
trial's, and the objective's. The device's own meter (the rails) is read over
the same window and lands in the measurement's extra as ``meter_also_*``, with
``meter_objective`` naming the primary, so results say which one was used.
"""

from __future__ import annotations

from tuner.measure.meters import EnergyReading, Meter, energy_reader


class PairedMeter:
    """``primary`` brackets the window inside ``secondary``: started last, stopped first."""

    def __init__(self, primary: Meter, secondary: Meter) -> None:
        self.primary, self.secondary = primary, secondary
        self.name = primary.name
        self.rails = list(primary.rails)
        self.min_window_s = max(primary.min_window_s, secondary.min_window_s)
        read = energy_reader(primary)
        if read is not None:
            self.energy_now = read

    def start(self) -> None:
        self.secondary.start()
        try:
            self.primary.start()
        except BaseException:
            self.secondary.stop()
            raise

    def stop(self) -> EnergyReading:
        try:
            reading = self.primary.stop()
        finally:
            other = self.secondary.stop()
        self.name = reading.meter
        self.rails = list(reading.rails)
        extra = {
            **reading.extra,
            "objective": reading.meter,
            "also": other.meter,
            "also_rails": ", ".join(other.rails),
            "also_energy_j": other.energy_j,
            "also_avg_w": other.avg_w,
        }
        return EnergyReading(
            reading.energy_j,
            reading.duration_s,
            reading.avg_w,
            reading.meter,
            list(reading.rails),
            reading.samples,
            reading.warning,
            extra,
        )
