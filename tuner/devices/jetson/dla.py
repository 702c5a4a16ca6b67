"""A Jetson's deep-learning accelerators (DLA): where their clock caps live and what each mode sets.

The DLA clock has no devfreq node: nvpmodel sets it through one ``clk_cap``
file per DLA core, in Hz, and the DLA runs at that cap while it has work
(``nvpmodel -q --verbose`` on boards prints REAL_VAL equal to CONF_VAL for
DLA0_CORE/DLA1_CORE). The files are found the way nvpmodel finds them: the
``< PARAM TYPE=CLOCK NAME=DLA<n>_CORE >`` sections of the board's own
nvpmodel.conf name them, ``MAX_FREQ`` for L4T 35 and ``MAX_FREQ_KNEXT`` for
L4T 36. In NVIDIA's nvpmodel_p3701_0000.conf (AGX Orin) these are
``/sys/devices/platform/13e40000.host1x/15880000.nvdla0/acm/clk_cap/dla0_core``
and ``/sys/devices/platform/bus@0/13e00000.host1x/15880000.nvdla0/clk_cap/dla0_core``
(``158c0000.nvdla1`` for the second core); AGX Xavier's L4T 32 conf has
``/sys/devices/13e10000.host1x/15880000.nvdla0/acm/clk_cap/dla0_core``. AGX
Xavier's L4T 32 conf caps both DLAs through one section instead, ``< PARAM
TYPE=CLOCK NAME=DLA_CORE >`` with ``MAX_FREQ /sys/kernel/nvpmodel_emc_cap/nafll_dla``
(the conf NVIDIA's MLPerf Xavier harness writes, mlcommons inference_results
closed/NVIDIA code/common nvpmodel template ``xavier_agx``): T194 clocks both DLA
cores from the one NAFLL_DLA source, so that board has one cap file. Those
paths are the fallback where the conf is missing. A board with none of them
(Orin Nano, TX2) has no DLA, and its search space offers no DLA knob.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuner.devices.jetson.sysfs import inside, is_file
from tuner.space import SearchSpace

DLA_KNOBS = ("dla_cores", "dla_mhz", "dla_batch_size")
# Per DLA core, newest release first (see the module docstring for where each comes from).
CANDIDATES = (
    (
        "sys/devices/platform/bus@0/13e00000.host1x/15880000.nvdla0/clk_cap/dla0_core",
        "sys/devices/platform/13e40000.host1x/15880000.nvdla0/acm/clk_cap/dla0_core",
        "sys/devices/13e10000.host1x/15880000.nvdla0/acm/clk_cap/dla0_core",
    ),
    (
        "sys/devices/platform/bus@0/13e00000.host1x/158c0000.nvdla1/clk_cap/dla1_core",
        "sys/devices/platform/13e40000.host1x/158c0000.nvdla1/acm/clk_cap/dla1_core",
        "sys/devices/13e10000.host1x/158c0000.nvdla1/acm/clk_cap/dla1_core",
    ),
)
_SECTION = re.compile(r"<\s*PARAM\s+TYPE=CLOCK\s+NAME=DLA(\d?)_CORE\s*>")


def conf_paths(text: str) -> dict[int, list[str]]:
    """The clk_cap paths a conf's DLA<n>_CORE sections name, per core (MAX_FREQ_KNEXT first)."""
    found: dict[int, list[str]] = {}
    core: int | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("<"):
            match = _SECTION.fullmatch(line)
            core = int(match.group(1) or 0) if match else None
            continue
        parts = line.split()
        if core is not None and len(parts) >= 2 and parts[0] in ("MAX_FREQ", "MAX_FREQ_KNEXT"):
            paths = found.setdefault(core, [])
            paths.insert(0 if parts[0] == "MAX_FREQ_KNEXT" else len(paths), parts[1].lstrip("/"))
    return found


def find_caps(root: Path, conf_text: str | None) -> list[Path]:
    """The board's DLA clock-cap files, core 0 first; empty on a board without DLAs."""
    named = conf_paths(conf_text) if conf_text else {}
    caps: list[Path] = []
    for core in range(len(CANDIDATES)):
        options = [*named.get(core, []), *CANDIDATES[core]]
        path = next((root / rel for rel in options if is_file(root / rel) and inside(root, root / rel)), None)
        if path is None:
            break
        caps.append(path)
    return caps


def for_runtime(space: SearchSpace, runtime: str | None, dlas: bool = True) -> SearchSpace:
    """The space as ``runtime`` can use it; ``dlas=False`` (a board without DLA nodes) also drops the DLA knobs."""
    return space.for_runtime(runtime, () if dlas else DLA_KNOBS)
