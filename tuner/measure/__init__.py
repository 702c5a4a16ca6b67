"""Measurement windows (MLPerf LoadGen) and the energy meters that bracket them."""

from tuner.measure.meters import EnergyReading, Meter, NvmlEnergyMeter, RaplMeter, SampledPowerMeter
from tuner.measure.session import build_measurement, measure_with
from tuner.measure.window import LoadGenSummary, WindowResult, parse_logs, run_window

__all__ = [
    "EnergyReading",
    "LoadGenSummary",
    "Meter",
    "NvmlEnergyMeter",
    "RaplMeter",
    "SampledPowerMeter",
    "WindowResult",
    "build_measurement",
    "measure_with",
    "parse_logs",
    "run_window",
]
