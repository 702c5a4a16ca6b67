"""Turn the ``--device`` string a user typed into a Device object."""

from __future__ import annotations

from typing import Any

from tuner.devices.base import Device
from tuner.errors import UserError

DEVICE_HELP = "sim:orin, sim:h200 (digital twins)"


def open_device(name: str, **options: Any) -> Device:
    """Resolve a device name; an unknown one lists what is known."""
    if name.startswith("sim:"):
        from tuner.devices.twin import TwinDevice

        return TwinDevice(name)
    raise UserError(f"unknown device {name!r}: known devices are {DEVICE_HELP}")


def known_devices() -> list[dict[str, Any]]:
    """Every device this installation can open, for ``tune devices``."""
    from tuner.devices.twin import TwinDevice, twin_names

    return [TwinDevice(f"sim:{n}").describe() for n in twin_names()]
