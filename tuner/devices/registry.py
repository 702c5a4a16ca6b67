"""Turn the ``--device`` string a user typed into a Device object."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from tuner.devices.base import Device
from tuner.errors import UserError, did_you_mean
from tuner.plumbing.usercode import import_target, user_code

KNOWN_DEVICES = (
    "sim:orin, sim:orin-nano, sim:h200, sim:orin-trt (digital twins; orin-trt: a TensorRT INT8 runtime profile), "
    "cuda:N (NVIDIA datacenter GPU), cpu, orin, orin-nano, orin-nano-super, orin-nx, xavier, tx2 (Jetson boards), "
    "py:package.module:Class or a powertune.devices plugin (docs/plugins.md)"
)
PLUGIN_GROUP = "powertune.devices"
TWIN_ALIASES = {"orin-agx": "orin"}
"""Other names of a twin: one twin, one study and one results folder per kind, whichever name was typed."""


def canonical_device(name: str) -> str:
    """``name`` with a twin's other name replaced by its one name (``sim:orin-agx`` is ``sim:orin``)."""
    if not name.startswith("sim:"):
        return name
    short, hash_, option = name[4:].partition("#")
    return f"sim:{TWIN_ALIASES.get(short, short)}{hash_}{option}"


def twin_of(board: str) -> str | None:
    """The twin of a Jetson board name (``orin-agx`` and ``orin`` are both ``sim:orin``), or None."""
    from tuner.devices.virtual.twin_schema import TWIN_KINDS

    return f"sim:{TWIN_ALIASES.get(board, board)}" if board in TWIN_KINDS else None


def plugin_entry_points() -> list[tuple[str, str]]:
    """Installed plugins (name, target) registered in the powertune.devices entry point group."""
    from importlib.metadata import entry_points

    return sorted({(e.name, e.value) for e in entry_points(group=PLUGIN_GROUP)})


def device_help() -> str:
    """The --device help: built-in devices, the py: form, and the plugins installed here."""
    installed = ", ".join(f"{name} ({target})" for name, target in plugin_entry_points())
    return f"device: {KNOWN_DEVICES}; tune devices says which can measure here" + (
        f"; installed plugins: {installed}" if installed else "; no powertune.devices plugins installed"
    )


def open_device(name: str, allow_clock_changes: bool = False, space_file: str | None = None, **options: Any) -> Device:
    """Resolve a device name; an unknown one lists what is known.

    Options that a device kind does not take are refused rather than ignored,
    so ``--allow-clock-changes`` on a twin or a CPU is never silently a no-op.
    """
    if name.startswith("sim:"):
        from tuner.devices.virtual.twin_llm import DecodingTwin
        from tuner.devices.virtual.twin_schema import TWIN_KINDS, twin_names

        name = canonical_device(name)
        if name[4:].split("#", 1)[0] not in TWIN_KINDS:
            twins = [f"sim:{n}" for n in twin_names()]
            raise UserError(f"unknown twin {name!r}{did_you_mean(name, twins)}: known twins are {', '.join(twins)}")

        _no_options(name, allow_clock_changes, options)
        return DecodingTwin(name, space_file=space_file)
    match = re.fullmatch(r"cuda:(\d+)", name)
    if match:
        from tuner.devices.nvml.device import NvmlDevice

        _no_options(name, False, options)
        return NvmlDevice(int(match.group(1)), allow_clock_changes=allow_clock_changes, space_file=space_file)
    if name == "cpu":
        from tuner.devices.host.device import HostDevice

        _no_options(name, allow_clock_changes, {**options, "space": space_file})
        return HostDevice()
    from tuner.devices.jetson import DEVICE_KINDS, jetson_device

    if name in DEVICE_KINDS:
        _no_options(name, allow_clock_changes, {k: v for k, v in options.items() if k != "sysfs_root"})
        if space_file is not None:
            raise UserError(f"--space is not supported for {name}: its space is read from the board")
        try:
            return jetson_device(name, sysfs_root=options.get("sysfs_root"))
        except UserError as exc:
            twin = twin_of(name)
            if "no Jetson board" not in str(exc) or twin is None:
                raise
            raise UserError(f"{exc}; or try its digital twin: --device {twin}") from None
    if name.startswith("py:"):
        _no_options(name, allow_clock_changes, {**options, "space": space_file})
        return _plugin(name, import_target(name, "--device", "py:package.module:Class"))
    entry = _entry_point(name.split(":", 1)[0])
    if entry is not None:
        _no_options(name, allow_clock_changes, {**options, "space": space_file})
        with user_code(f"plugin device {entry.name!r} ({entry.value})", "fix or uninstall the plugin"):
            factory = entry.load()
        return _plugin(name, factory)
    raise UserError(f"unknown device {name!r}{_suggest_device(name)}: known devices are {KNOWN_DEVICES}")


def _suggest_device(name: str) -> str:
    """A near miss among the device names, or the twin of a board named where none is."""
    from tuner.devices.jetson import DEVICE_KINDS
    from tuner.devices.virtual.twin_schema import twin_names

    names = [f"sim:{n}" for n in twin_names()] + list(DEVICE_KINDS) + ["cpu", "cuda:0"]
    return did_you_mean(name, names) or did_you_mean(f"sim:{name}", [f"sim:{n}" for n in twin_names()])


def device_name_for_kind(kind: str) -> str:
    """The --device name that opens hardware of a space kind (for `tune apply` of an export)."""
    from tuner.devices.jetson import DEVICE_KINDS

    for name, jetson_kind in DEVICE_KINDS.items():
        if jetson_kind == kind:
            return name
    raise UserError(f"exports for {kind} are applied with --device (e.g. --device cuda:0): name the device")


def _entry_point(name: str) -> Any:
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        if entry.name == name:
            return entry
    return None


def _plugin(name: str, factory: Any) -> Device:
    """Call a plugin's factory with the device string and check that the result is a Device."""
    with user_code(f"plugin device {name}", "see docs/plugins.md"):
        try:
            dev = factory(name)
        except (UserError, SystemExit):
            raise
        except Exception as exc:
            raise UserError(f"plugin device {name} failed to start: {type(exc).__name__}: {exc}") from None
    if not isinstance(dev, Device):
        missing = [m for m in ("name", "kind", "slug", "simulated", "space", "apply", "measure") if not hasattr(dev, m)]
        raise UserError(
            f"plugin {name} did not return a Device (missing {', '.join(missing) or 'protocol members'}): "
            "see docs/plugins.md"
        )
    with user_code(f"plugin device {name}: its space()", "see docs/plugins.md"):
        dev.space()
    return PluginDevice(dev)


MEASURED = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w", "energy_j", "duration_s")


class PluginDevice:
    """A plugin's device, with what it hands back checked: a failure or a non-number is one line, never a record.

    Every attribute is the plugin's own; ``space``, ``read_state`` and
    ``measure`` run under :func:`~tuner.plumbing.usercode.user_code`, and a
    measurement must hold finite, non-negative numbers (NaN would otherwise
    reach the study as a result).
    """

    def __init__(self, device: Any) -> None:
        self._device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)

    def _call(self, what: str, *args: Any) -> Any:
        with user_code(f"plugin device {self._device.name}: its {what}()", "see docs/plugins.md"):
            return getattr(self._device, what)(*args)

    def space(self) -> Any:
        return self._call("space")

    def read_state(self) -> Any:
        return self._call("read_state")

    def measure(self, model: str, config: Any, settings: Any) -> Any:
        measurement = self._call("measure", model, config, settings)
        for field in MEASURED:
            value = getattr(measurement, field, None)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise UserError(
                    f"plugin device {self._device.name}: measure() returned {field}={value!r}, not a measured "
                    "number; a plugin must return finite measurements (see docs/plugins.md)"
                )
        return measurement


def _no_options(name: str, allow_clock_changes: bool, options: dict[str, Any]) -> None:
    flags = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
    if allow_clock_changes:
        flags.append("--allow-clock-changes")
    if flags:
        raise UserError(f"{', '.join(flags)} does not apply to {name}: drop it")


JETSON_BOARDS = {
    "orin": "Jetson AGX Orin",
    "orin-nano": "Jetson Orin Nano",
    "orin-nano-super": "Jetson Orin Nano Super",
    "orin-nx": "Jetson Orin NX",
    "xavier": "Jetson AGX Xavier",
    "tx2": "Jetson TX2",
}
TWIN_RUNTIMES = {"pytorch": "eager PyTorch", "tensorrt-int8": "TensorRT INT8 runtime profile"}


def known_devices() -> list[dict[str, Any]]:
    """Every kind of device ``--device`` takes, for ``tune devices``: twins, the CPU, GPUs, Jetson boards, plugins.

    Each entry says whether it can measure on this machine (``usable``) and, when
    not, why (``why``), so a user learns it before a study starts, not from its
    failed trials.
    """
    from tuner.devices.virtual.twin import TwinDevice
    from tuner.devices.virtual.twin_schema import TWIN_KINDS, twin_names

    found = []
    for short in twin_names():
        described = TwinDevice(f"sim:{short}").describe()
        runtime = TWIN_RUNTIMES.get(TWIN_KINDS[short][1], TWIN_KINDS[short][1])
        found.append({**described, "title": f"{described['title']}, {runtime}", "usable": True, "why": ""})
    problem = cpu_problem()
    found.append(
        {
            "name": "cpu",
            "kind": "cpu",
            "twin": False,
            "title": "host CPU (observe-only, RAPL meter)",
            "usable": problem is None,
            "why": problem or "",
        }
    )
    found += _gpus()
    found += _jetson_boards()
    for name, target in plugin_entry_points():
        found.append(
            {
                "name": f"{name}[:ARG]",
                "kind": "plugin",
                "twin": None,
                "title": f"installed plugin {target} (not opened: it says what it needs when named)",
                "usable": None,
                "why": "",
            }
        )
    found.append(
        {
            "name": "py:package.module:Class",
            "kind": "plugin",
            "twin": None,
            "title": "any plugin on PYTHONPATH (docs/plugins.md)",
            "usable": None,
            "why": "",
        }
    )
    return found


def cpu_problem() -> str | None:
    """Why ``--device cpu`` cannot measure here (no RAPL energy counters), or None when it can."""
    from tuner.devices.host.meters import RaplMeter

    try:
        RaplMeter()
    except UserError as exc:
        return str(exc).split(": this CPU")[0] + ": this CPU or kernel exposes no powercap intel-rapl zones"
    return None


METERS = ("nvml-energy", "nvml-power", "rapl", "rails", "ina3221", "jtop")
"""The meters of the built-in devices (``--meter``); an outside meter is a URL (tuner.devices.meters)."""


def check_meter(meter: str | None, device: str, model: str | None = None) -> None:
    """Refuse, before anything is opened, a meter the device cannot use or a device that cannot measure here.

    Built-in devices take the built-in meters, or an outside one (docs/meters.md);
    a plugin may name its own. The CPU has one meter, RAPL, and without its
    counters every trial would fail (``tune devices`` says the same: cpu_problem);
    the error then names the twin that runs ``model`` instead.
    """
    from runners.llm_spec import is_llm
    from tuner.devices.jetson import DEVICE_KINDS
    from tuner.devices.meters.registry import check_external, is_external

    if meter is not None and is_external(meter):
        return check_external(meter, device)
    builtin = device.startswith(("sim:", "cuda:")) or device == "cpu" or device in DEVICE_KINDS
    if meter is not None and builtin and meter.lower() not in METERS:
        raise UserError(
            f"unknown meter {meter!r}{did_you_mean(meter.lower(), METERS)}: choose one of {', '.join(METERS)}"
        )
    if device != "cpu":
        return
    problem = cpu_problem()
    if problem is not None and model and is_llm(model):
        raise UserError(
            f"--device cpu cannot measure energy here: {problem}; give a meter plugin (--meter py:module:factory) "
            f"or run {model} on a GPU"
        )
    if problem is not None:
        runs = f"--device sim:orin runs {model} from its FLOP/byte profile" if model else "e.g. --device sim:orin"
        raise UserError(
            f"--device cpu cannot measure energy here: {problem}; tune a digital twin instead ({runs}; "
            "tune devices lists what works here)"
        )
    if meter not in (None, "rapl"):
        raise UserError(f"--meter {meter} does not apply to --device cpu: it is metered by RAPL; drop --meter")


def _gpus() -> list[dict[str, Any]]:
    """One entry per NVIDIA GPU that NVML lists, or one ``cuda:N`` entry saying why there is none."""
    gpu: dict[str, Any] = {"kind": "nvml", "twin": False}
    try:
        import pynvml
    except ImportError:
        return [{**gpu, "name": "cuda:N", "title": "NVIDIA datacenter GPU", "usable": False, "why": _NO_NVML}]
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        why = f"no NVIDIA driver here (NVML: {' '.join(str(exc).split()) or type(exc).__name__})"
        return [{**gpu, "name": "cuda:N", "title": "NVIDIA datacenter GPU", "usable": False, "why": why}]
    from tuner.devices.nvml.visible import visible_gpus

    found = []
    why = "no NVIDIA GPU is visible (the driver lists none, or CUDA_VISIBLE_DEVICES hides them)"
    try:
        # cuda:N as torch numbers them (after CUDA_VISIBLE_DEVICES), each named by its physical card
        for i, card in enumerate(visible_gpus(pynvml)):
            title = f"{card.name} ({card.uuid}, PCI {card.pci_bus_id})"
            found.append({**gpu, "name": f"cuda:{i}", "title": title, "usable": True, "why": ""})
    except UserError as exc:
        why = str(exc)
    except Exception as exc:
        why = f"NVML could not list the GPUs ({' '.join(str(exc).split()) or type(exc).__name__})"
    finally:
        pynvml.nvmlShutdown()
    if not found:
        return [{**gpu, "name": "cuda:N", "title": "NVIDIA datacenter GPU", "usable": False, "why": why}]
    return found


_NO_NVML = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"


def _jetson_boards() -> list[dict[str, Any]]:
    """Every Jetson board name; the one this machine is (by its device tree) can measure, the others say why not."""
    from tuner.devices.jetson import DEVICE_KINDS, board_title, detect_kind

    root = Path(os.environ.get("TUNE_SYSFS_ROOT") or "/")
    here = detect_kind(root)
    titles = {DEVICE_KINDS[name]: title for name, title in JETSON_BOARDS.items()}
    compatible = root / "proc/device-tree/compatible"
    found = []
    for name, title in JETSON_BOARDS.items():
        kind = DEVICE_KINDS[name]
        entry = {"name": name, "kind": kind, "twin": False, "title": title, "usable": here == kind, "why": ""}
        if here == kind:
            entry["title"] = board_title(root)
        else:
            twin = f"; its digital twin is {twin_of(name)}" if twin_of(name) else ""
            what = f"this machine is a {titles[here]}" if here else f"not a Jetson board ({compatible} names none)"
            entry["why"] = what + twin
        found.append(entry)
    return found


_BUILTIN = re.compile(r"cuda:\d{1,3}|cpu")


def builtin_device_name(name: str) -> bool:
    """A device name that opens a built-in backend (a Jetson board, an NVIDIA GPU), never a plugin."""
    from tuner.devices.jetson import DEVICE_KINDS

    return name in DEVICE_KINDS or _BUILTIN.fullmatch(name) is not None
