"""What a result was measured on and with: hardware, driver or L4T release, software versions.

Studies record this once (study attributes) and every result file and export
copies it, so a figure can always be traced to the board or GPU, its driver
or L4T release, the tool and its runtime libraries, and the meter. Versions
are read from package metadata, never by importing the packages (torch alone
takes seconds to import).
"""

from __future__ import annotations

import platform
import re
import socket
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner import __version__
from tuner.devices.base import Device

# What names the physical card a device ran on, and how its clocks were governed, where the device says.
CARD_KEYS = ("gpu_uuid", "pci_bus_id", "nvml_index", "cuda_visible_devices", "observe_only")
PACKAGES = {"torch": "torch", "onnxruntime": "onnxruntime", "loadgen": "mlcommons-loadgen", "optuna": "optuna"}


@cache
def software_versions() -> dict[str, str | None]:
    """The tool's version and each runtime library's installed version (None: not installed).

    Cached: a benchmark opens thousands of studies in one process, and the
    installed packages do not change under it.
    """
    found: dict[str, str | None] = {"powertune": __version__, "python": platform.python_version()}
    for key, dist in PACKAGES.items():
        try:
            found[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[key] = None
    return found


def _first_line(path: Path) -> str | None:
    try:
        text = path.read_bytes()[:512].decode("utf-8", "replace")
    except OSError:
        return None
    return text.replace("\x00", "").strip().splitlines()[0].strip() if text.strip() else None


def device_provenance(device: Device) -> dict[str, Any]:
    """Hardware name and driver or L4T release of ``device``, as far as it can tell.

    A twin says it is one and names what it models (a board that replays
    earlier windows of real hardware says that instead, ``replayed``); a Jetson board is named by
    its device tree and its L4T release by /etc/nv_tegra_release (both under
    the sysfs root, so tests and containers see their own); an NVIDIA GPU by
    NVML's name and driver version, and the physical card by its UUID and PCI
    bus id (``cuda:N`` names another card under another CUDA_VISIBLE_DEVICES),
    with whether its clocks were left to the driver (``observe_only``).
    """
    try:
        info = device.describe()
    except Exception as exc:  # a plugin's describe() must not cost the user the run
        info = {"describe_error": f"{type(exc).__name__}: {exc}"}
    record: dict[str, Any] = {
        "device": device.name,
        "device_kind": device.kind,
        "twin": bool(device.simulated),
        "hardware": info.get("gpu") or info.get("title") or info.get("cpu"),
        "driver": info.get("driver"),
        "host": socket.gethostname(),
    }
    for key in CARD_KEYS:
        if info.get(key) is not None:
            record[key] = info[key]
    if info.get("backend") == "jetson":
        root = Path(info.get("sysfs_root") or "/")
        record["hardware"] = _first_line(root / "proc/device-tree/model") or f"Jetson ({device.kind})"
        record["l4t"] = _first_line(root / "etc/nv_tegra_release")
    if device.simulated:
        record["hardware"] = info.get("replayed") or twin_hardware(record["hardware"] or device.kind)
    return record


def twin_hardware(title: str) -> str:
    """What a twin's numbers stand for, saying "digital twin" once: a twin's title may already say it.

    "Jetson AGX Orin 64 GB (digital twin)" -> "digital twin of Jetson AGX Orin 64 GB (not hardware)".
    """
    match = re.search(r"\s*\(digital twin,?\s*([^)]*)\)", title)
    name = title if match is None else title[: match.start()] + title[match.end() :]
    extra = f"; {match.group(1)}" if match is not None and match.group(1) else ""
    return f"digital twin of {name.strip()} (not hardware{extra})"


def provenance(device: Device) -> dict[str, Any]:
    """Everything a result file records about where and with what it was measured."""
    return {**device_provenance(device), "software": dict(software_versions())}


TWIN_NOTE = " [digital twin: simulated, not measured on hardware]"


def twin_note(device: Device) -> str:
    """The label every simulated result carries; a simulated device may say better what it is (``simulated_note``)."""
    if not device.simulated:
        return ""
    return getattr(device, "simulated_note", TWIN_NOTE)
