"""Turn a ``--meter`` that names a meter outside the device into a Meter.

``ptd://host:port`` is PTDaemon, ``remote://host:port`` a ``tune meter-serve``,
``py:package.module:Class`` any importable factory and a name registered in
the ``powertune.meters`` entry-point group an installed plugin. A factory is
called with the ``--meter`` string and must return a
:class:`tuner.measure.meters.Meter`. Built-in names (nvml-energy, rails, ...)
stay the device's to resolve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.errors import UserError
from tuner.measure.meters import Meter, MeterLost, checked_reading, meter_problem
from tuner.plumbing.usercode import import_target, user_code

PLUGIN_GROUP = "powertune.meters"


def _entry_point(name: str) -> Any:
    from importlib.metadata import entry_points

    return next((e for e in entry_points(group=PLUGIN_GROUP) if e.name == name), None)


def is_external(spec: str | None) -> bool:
    """Whether ``spec`` names a meter outside the device (a URL, a py: target or an installed meter plugin)."""
    if not spec:
        return False
    return spec.startswith(("ptd://", "remote://", "py:")) or _entry_point(spec.split(":", 1)[0]) is not None


def open_meter(spec: str) -> Meter:
    """The meter ``spec`` names; a malformed or broken one is a one-line user error."""
    if spec.startswith("ptd://"):
        from tuner.devices.meters.ptd import PtdMeter

        return PtdMeter.from_url(spec)
    if spec.startswith("remote://"):
        from tuner.devices.meters.remote import RemoteMeter

        return RemoteMeter.from_url(spec)
    fix = "fix the plugin or pick another --meter (docs/meters.md)"
    if spec.startswith("py:"):
        factory = import_target(spec, "--meter", "py:package.module:Class")
    else:
        entry = _entry_point(spec.split(":", 1)[0])
        if entry is None:
            raise UserError(f"unknown meter {spec!r}: see docs/meters.md")
        with user_code(f"meter plugin {entry.name!r} ({entry.value}) while loading", fix):
            factory = entry.load()
    with user_code(f"meter plugin {spec} while starting", fix):
        meter = factory(spec)
    problem = meter_problem(meter)
    if problem is not None:
        raise UserError(f"meter plugin {spec} did not return a Meter: {problem}; {fix}")
    return meter


def first_reading(spec: str, meter: Meter, most_s: float = 5.0) -> None:
    """One short window read from a freshly opened plugin meter: one that fails or reads NaN is refused now.

    It waits the meter's ``min_window_s`` (at most ``most_s``), ending at once at a signal.
    """
    import time

    from tuner.plumbing import interrupts

    fix = "fix the plugin or pick another --meter (docs/meters.md)"
    with user_code(f"meter plugin {spec} on its first reading", fix):
        meter.start()
        end = time.monotonic() + min(max(meter.min_window_s, 0.1), most_s)
        while time.monotonic() < end and interrupts.pending() is None:
            time.sleep(0.05)
        reading = meter.stop()
    try:
        checked_reading(meter.name, reading)
    except MeterLost as exc:
        raise UserError(f"meter plugin {spec} on its first reading: {exc}") from None
    interrupts.check()


def check_external(spec: str, device: str) -> None:
    """Before a command measures: the meter opens and, where it is on the network, answers."""
    from tuner.measure.meters import MeterLost

    if device.startswith("sim:"):
        raise UserError(f"--meter {spec} reads real hardware; {device} is a digital twin: drop --meter")
    meter = open_meter(spec)
    probe = getattr(meter, "probe", None)
    if probe is not None:
        try:
            probe()
        except MeterLost as exc:
            raise UserError(f"--meter {spec}: {exc}") from None


def device_meter(choice: str | None, builtin: Callable[[str | None], Meter]) -> Meter:
    """The meter a device's window uses: the external one paired with the device's own, or a built-in one."""
    if not is_external(choice):
        return builtin(choice)
    from tuner.devices.meters.paired import PairedMeter

    assert choice is not None
    external = open_meter(choice)
    try:
        own = builtin(None)
    except UserError:
        return external
    return PairedMeter(external, own)
