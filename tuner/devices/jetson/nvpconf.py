"""The board's /etc/nvpmodel.conf as nvpmodel reads it, and a tuned mode written in the same grammar.

NVIDIA's header in every conf defines the grammar: ``< PARAM TYPE=FILE|CLOCK
NAME=P >`` sections bind argument names to sysfs paths (``MAX_FREQ``, and on
the releases that ship one file for two kernels, ``MAX_FREQ_KNEXT`` for the
newer one); ``< POWER_MODEL ID=n NAME=x >`` sections list ``PARAM ARG VALUE``
lines applied in order; ``< PM_CONFIG DEFAULT=n >`` names the mode a board
boots into before any mode was chosen. A CLOCK value of -1 is INT_MAX (no
cap). The AGX Orin conf of L4T 35 and 36 (nvpmodel_p3701_0000.conf, the copy
NVIDIA ships in github.com/LineageOS/android_device_nvidia_concord
nvpmodel/) names the same PARAMs on both releases: CPU_ONLINE CORE_0..11,
TPC_POWER_GATING, GPU_POWER_CONTROL_ENABLE/DISABLE, CPU_A78_0..2, GPU, EMC,
DLA0/1_CORE, DLA0/1_FALCON, PVA0_VPS/AXI; only the paths differ, so a mode
block (names and values, no paths) is valid on both.

:func:`tuned_mode` writes the study's configuration as a new POWER_MODEL
starting from the lines of the mode it was tuned under (so every PARAM the
board's modes set, PVA and falcon caps included, stays as that mode sets it)
and :func:`check_mode` proves it by reading the result back with
:func:`read_conf`, the reader board discovery uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuner.errors import UserError

HEADER = re.compile(r"<\s*(.*?)\s*>")
NAME_OK = re.compile(r"[A-Za-z0-9_]{1,48}")


@dataclass
class Param:
    """One ``< PARAM >`` section: its type and its argument names bound to paths."""

    type: str
    args: dict[str, str] = field(default_factory=dict)

    def paths(self, arg: str) -> list[str]:
        """The paths an argument may write: the newer kernel's first, as nvpmodel tries them."""
        return [self.args[a] for a in (f"{arg}_KNEXT", arg) if a in self.args]


@dataclass
class ConfMode:
    """One ``< POWER_MODEL >`` section, its lines in order."""

    id: int
    name: str
    lines: list[tuple[str, str, str]] = field(default_factory=list)

    def value(self, param: str, arg: str) -> str | None:
        return next((v for p, a, v in self.lines if p == param and a == arg), None)


@dataclass
class NvpConf:
    """A parsed conf: its PARAM sections, its modes and the PM_CONFIG default."""

    params: dict[str, Param]
    modes: list[ConfMode]
    default: int | None

    def mode(self, mode_id: int) -> ConfMode | None:
        return next((m for m in self.modes if m.id == mode_id), None)

    def clusters(self) -> dict[str, int]:
        """Each CPU clock PARAM and the first CPU of the cluster its cpufreq path names."""
        out: dict[str, int] = {}
        for name, param in self.params.items():
            for path in param.paths("MAX_FREQ"):
                match = re.search(r"/cpu(\d+)/cpufreq/", path)
                if param.type == "CLOCK" and match:
                    out[name] = int(match.group(1))
                    break
        return out


def read_conf(text: str) -> NvpConf:
    """Parse an nvpmodel conf the way nvpmodel reads one (see the module docstring)."""
    params: dict[str, Param] = {}
    modes: list[ConfMode] = []
    default: int | None = None
    mode: ConfMode | None = None
    param: Param | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = HEADER.fullmatch(line)
        if header:
            fields = dict(re.findall(r"(\w+)=(\S+)", header.group(1)))
            kind = header.group(1).split()[0] if header.group(1) else ""
            mode, param = None, None
            if kind == "POWER_MODEL" and "ID" in fields and fields["ID"].isdigit():
                mode = ConfMode(int(fields["ID"]), fields.get("NAME", fields["ID"]))
                modes.append(mode)
            elif kind == "PARAM" and "NAME" in fields:
                param = params[fields["NAME"]] = Param(fields.get("TYPE", ""))
            elif kind == "PM_CONFIG" and "DEFAULT" in fields:
                default = int(fields["DEFAULT"]) if fields["DEFAULT"].isdigit() else None
            continue
        parts = line.split()
        if mode is not None and len(parts) >= 3:
            mode.lines.append((parts[0], parts[1], parts[2]))
        elif param is not None and len(parts) >= 2:
            param.args[parts[0]] = parts[1]
    return NvpConf(params, modes, default)


def render_mode(mode: ConfMode) -> str:
    """A POWER_MODEL section as NVIDIA's confs write one."""
    lines = [f"< POWER_MODEL ID={mode.id} NAME={mode.name} >"]
    lines += [f"{p} {a} {v}" for p, a, v in mode.lines]
    return "\n".join(lines) + "\n"


def fresh_id(conf: NvpConf) -> int:
    """An id no mode of the conf uses: one past the highest."""
    return max((m.id for m in conf.modes), default=-1) + 1


def tuned_mode(conf: NvpConf, base_id: int, targets: dict[str, int], mode_id: int, name: str) -> ConfMode:
    """The tuned configuration as a mode of this conf, built on the lines of mode ``base_id``.

    ``targets`` holds what the device writes (tuner.devices.jetson.device
    ``targets``): ``cores``, ``cpu_khz``, ``gpu_hz``, ``emc_hz``, ``dla_hz``.
    CPU and GPU clocks are pinned (MIN_FREQ = MAX_FREQ, as the tuner sets
    them); the EMC line is a cap, the only form nvpmodel has; a cluster with
    no core online gets no clock lines (the kernel refuses its limits).
    """
    if not NAME_OK.fullmatch(name):
        raise UserError(f"nvpmodel mode name {name!r} must be 1-48 letters, digits or _ (nvpmodel reads one token)")
    base = conf.mode(base_id)
    if base is None:
        raise UserError(f"the board's nvpmodel.conf has no mode {base_id}: export from a study of this board")
    clusters = conf.clusters()
    cores = targets.get("cores")
    online = {a: v for p, a, v in base.lines if p == "CPU_ONLINE"}
    if cores is not None:
        names = conf.params.get("CPU_ONLINE", Param("")).args
        online = {a: "1" if int(a.split("_")[-1]) < cores else "0" for a in names}
    first_off = min((int(a.split("_")[-1]) for a, v in online.items() if v == "0"), default=10**6)
    lines: list[tuple[str, str, str]] = []
    done: set[str] = set()

    def clock(param: str, value: int, pin: bool) -> None:
        if pin and "MIN_FREQ" in conf.params[param].args:
            lines.append((param, "MIN_FREQ", str(value)))
        lines.append((param, "MAX_FREQ", str(value)))
        done.add(param)

    for param, arg, value in base.lines:
        if param in done:
            continue
        if param == "CPU_ONLINE":
            lines.append((param, arg, online.get(arg, value)))
        elif param in clusters and "cpu_khz" in targets:
            if clusters[param] < first_off:
                clock(param, targets["cpu_khz"], pin=True)
            else:
                done.add(param)
        elif param == "GPU" and "gpu_hz" in targets:
            clock(param, targets["gpu_hz"], pin=True)
        elif param == "EMC" and "emc_hz" in targets:
            clock(param, targets["emc_hz"], pin=False)
        elif re.fullmatch(r"DLA\d+_CORE", param) and "dla_hz" in targets:
            clock(param, targets["dla_hz"], pin=False)
        else:
            lines.append((param, arg, value))
    for param, first in clusters.items():  # a cluster the base mode left offline but the tuned cores bring up
        if param not in done and "cpu_khz" in targets and first < first_off:
            clock(param, targets["cpu_khz"], pin=True)
    return ConfMode(mode_id, name, lines)


def with_mode(text: str, mode: ConfMode, default: bool) -> str:
    """The conf text with ``mode`` added before its PM_CONFIG section (and, with ``default``, made the default).

    Everything else stays byte for byte as it was, so removing the block and
    restoring the DEFAULT line gives the original file back.
    """
    block = render_mode(mode) + "\n"
    match = re.search(r"^[ \t]*<\s*PM_CONFIG\b[^\n]*$", text, flags=re.MULTILINE)
    if match is None:
        raise UserError("the board's nvpmodel.conf has no PM_CONFIG section: it is not a conf nvpmodel accepts")
    start = match.start()
    comment = re.search(r"(^#[^\n]*\n)+\Z", text[:start], flags=re.MULTILINE)
    insert = comment.start() if comment else start
    pm = text[start : match.end()]
    if default:
        pm = re.sub(r"DEFAULT=\S+", f"DEFAULT={mode.id}", pm)
    return text[:insert] + block + text[insert:start] + pm + text[match.end() :]


def check_mode(text: str, mode: ConfMode, tables: dict[str, list[int]] | None = None) -> ConfMode:
    """Read ``text`` back with :func:`read_conf` and prove ``mode`` is in it as nvpmodel would take it.

    Every line names a declared PARAM and argument, CLOCK values are integers
    (-1 or a value of the clock's table where ``tables`` gives one, keyed by
    PARAM), CORE_0 stays online, and the ID is unique. Returns the mode as read.
    """
    conf = read_conf(text)
    found = [m for m in conf.modes if m.id == mode.id]
    if len(found) != 1 or found[0].name != mode.name or found[0].lines != mode.lines:
        raise UserError(f"nvpmodel mode {mode.id} ({mode.name}) does not read back as written: not exported")
    for param, arg, value in found[0].lines:
        spec = conf.params.get(param)
        if spec is None or (arg not in spec.args and f"{arg}_KNEXT" not in spec.args):
            raise UserError(f"nvpmodel mode {mode.name}: {param} {arg} is not declared by the board's conf")
        if spec.type == "CLOCK":
            if not re.fullmatch(r"-?\d+", value):
                raise UserError(f"nvpmodel mode {mode.name}: {param} {arg} {value} is not an integer clock")
            table = (tables or {}).get(param)
            if table and int(value) not in (-1, 0, *table):
                raise UserError(f"nvpmodel mode {mode.name}: {param} {arg} {value} is not in the board's table")
    if found[0].value("CPU_ONLINE", "CORE_0") == "0":
        raise UserError(f"nvpmodel mode {mode.name} takes CORE_0 offline, which nvpmodel refuses")
    return found[0]
