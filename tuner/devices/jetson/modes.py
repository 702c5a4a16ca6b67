"""The board's nvpmodel modes: where its nvpmodel.conf is, and what each POWER_MODEL sets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tuner.devices.jetson.nvpconf import ConfMode, Param, read_conf
from tuner.devices.jetson.sysfs import is_file

NVPMODEL_CONF = "etc/nvpmodel.conf"


@dataclass
class BoardMode:
    """One POWER_MODEL of the board's nvpmodel.conf: what switching to it sets.

    Caps are None where the conf says -1 or 0 (no cap: the table's maximum).
    """

    id: int
    name: str
    cores: int
    cpu_max_khz: int | None
    gpu_max_hz: int | None
    emc_max_hz: int | None
    tpc_pg_mask: int | None
    dla_max_hz: int | None = None
    dla_caps_hz: tuple[int, ...] = ()


def conf_path(root: Path) -> Path | None:
    """/etc/nvpmodel.conf under the root, following its (usually absolute) link inside the root."""
    path = root / NVPMODEL_CONF
    for _ in range(8):
        if not path.is_symlink():
            return path if is_file(path) else None
        target = os.readlink(path)
        path = root / target.lstrip("/") if os.path.isabs(target) else path.parent / target
    return None


def parse_nvpmodel_conf(text: str) -> tuple[list[BoardMode], int | None]:
    """The POWER_MODEL blocks of an nvpmodel.conf as the space reads them, and its PM_CONFIG default.

    Read with :func:`tuner.devices.jetson.nvpconf.read_conf` (the grammar is
    described there); for CLOCK parameters -1 means no cap (INT_MAX) and an
    EMC cap of 0 means none either. CPU clusters are the CLOCK parameters
    whose paths are cpufreq files; GPU and EMC are named so.
    """
    conf = read_conf(text)
    return [_mode_from(mode, conf.params) for mode in conf.modes], conf.default


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _mode_from(mode: ConfMode, params: dict[str, Param]) -> BoardMode:
    online: dict[str, str] = {}
    cpu_caps: list[int] = []
    per_core: list[int | None] = []
    gpu = emc = tpc = dla = None
    for param, arg, value in mode.lines:
        number = _int(value)
        paths = " ".join(params[param].args.values()) if param in params else ""
        if param == "CPU_ONLINE":
            online[arg] = value
        elif param == "TPC_POWER_GATING":
            tpc = number
        elif arg.startswith("MAX_FREQ") and "cpufreq" in paths and number is not None:
            cpu_caps.append(number)
        elif param == "GPU" and arg.startswith("MAX_FREQ"):
            gpu = number
        elif param == "EMC" and arg.startswith("MAX_FREQ"):
            emc = number
        elif param in ("DLA0_CORE", "DLA_CORE") and arg.startswith("MAX_FREQ"):
            dla = number
            per_core.append(number)
        elif param == "DLA1_CORE" and arg.startswith("MAX_FREQ"):
            per_core.append(number)  # may differ from DLA0's (Orin NX 10W: 153.6 and 115 MHz)
    cores = 1 + sum(1 for core, v in online.items() if core != "CORE_0" and v == "1")
    capped = [c for c in cpu_caps if c > 0]
    return BoardMode(
        id=mode.id,
        name=mode.name,
        cores=cores if online else 0,
        cpu_max_khz=min(capped) if capped else None,
        gpu_max_hz=gpu if gpu is not None and gpu > 0 else None,
        emc_max_hz=emc if emc is not None and emc > 0 else None,
        tpc_pg_mask=tpc,
        dla_max_hz=dla if dla is not None and dla > 0 else None,
        dla_caps_hz=tuple(c for c in per_core if c is not None and c > 0),
    )


def read_modes(root: Path) -> tuple[list[BoardMode], int | None, str | None]:
    """The board's nvpmodel modes, default and conf path; no modes where the conf is missing."""
    path = conf_path(root)
    if path is None:
        return [], None, None
    modes, default = parse_nvpmodel_conf(path.read_text(errors="replace"))
    return modes, default, str(path)
