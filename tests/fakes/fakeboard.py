"""A fake Jetson, laid out and behaving as real boards do, not as our backend reads them.

The tree is what a board shows under /, and every rule the tests rely on comes
from a real board or its sources (cited where it is set). Writes obey the
kernel's rules through :mod:`fakekernel` (offline clusters refuse their limits,
read-only attributes refuse writes, nothing can be created under /sys, bad
values are refused), in this process and in every child the tests start.

What it lays out:

- Releases (``layout``): ``l4t35`` (JetPack 5: GPU ``/sys/devices/17000000.ga10b``,
  EMC cap ``/sys/kernel/nvpmodel_emc_cap/emc_iso_cap``, as in the L4T 35 nvpmodel
  conf published in mlcommons inference_results_v3.0
  closed/*/code/common/nvpmodel_orin.py), ``l4t36.3`` (JetPack 6.0: GPU under
  ``/sys/devices/platform/bus@0/17000000.gpu``) and ``l4t36.4`` (JetPack 6.1+:
  ``/sys/devices/platform/17000000.gpu`` with its ``devfreq_dev`` link and the
  ``/sys/kernel/nvpmodel_clk_cap/emc`` cap, as user scripts and runbooks for
  36.4 boards read them). ``l4t36`` means ``l4t36.4``. nvgpu links ``gpu.0`` in
  the GPU's parent folder to the GPU device (nvgpu's sysfs.c), which is where
  the conf's TPC_PG_MASK path points; ``tpc_pg_mask`` and ``railgate_enable``
  are attributes of the GPU device itself (jetson-stats reads them there).
- /sys/class/devfreq holds VIC and NVDEC before the GPU (15340000.vic,
  15480000.nvdec sort first); each ``device/of_node/name`` is a device-tree
  string ending with NUL ("gpu" on L4T 36, "ga10b" on 35), which is how
  jetson-stats (jtop/core/gpu.py, read for behaviour only) finds the GPU.
- GPU tables (``grid``): ``jp5``, the 13 steps of JetPack 5.0 (114.75 ...
  1300.5 MHz, shared reference jetson-orin-agx.md), and ``jp6``, the 102 MHz
  grid of later releases (306 ... 1224, 1300.5 MHz, shared reference
  orin-mlperf.md). Frequency lists end with a space, as the kernel prints them.
- cpufreq: one real folder per cluster (``cpufreq/policyN``) and a
  ``cpuN/cpufreq`` link to it for every CPU of the cluster, as the kernel
  makes them; ``online`` for cpu1 and up.
- ``/etc/nvpmodel.conf``, an absolute link into ``/etc/nvpmodel/``, in NVIDIA's
  format (the PARAM / POWER_MODEL / PM_CONFIG header of every conf, e.g.
  mlcommons inference_results_v1.0 closed/NVIDIA/power/nvpmodel-computelab-310.conf),
  with the AGX Orin 64 GB modes of nvpmodel_p3701_0000.conf as tabulated in
  the shared reference jetson-orin-agx.md (MAXN, MODE_15W, MODE_30W, MODE_50W;
  default MODE_30W). Like NVIDIA's own conf (the copy in github.com/LineageOS/
  android_device_nvidia_concord nvpmodel/nvpmodel_p3701_0000.conf), one file
  serves L4T 35 and 36: each path argument has an ``_KNEXT`` twin naming the
  newer kernel's path, and nvpmodel writes whichever exists; its EMC section
  header reads ``<PARAM TYPE=CLOCK NAME=EMC >``, without the space. A mode's
  block lists only the clusters it keeps online,
  as NVIDIA's confs do (MODE_10W of the Xavier conf lists CPU_DENVER_0 alone).
  The Orin Nano's two modes are those of NVIDIA's nvpmodel_p3767_0003.conf
  (the copy in the same LineageOS repository; 15W and 7W, see BOARDS).
- The fake ``nvpmodel`` reads that conf and, for ``-m ID``, writes the mode's
  lines in order through the same kernel rules (cores, TPC mask, CPU and GPU
  clocks, EMC cap; -1 means the table's maximum, a GPU minimum of 0 the
  table's minimum); ``-q`` prints ``NV Power Mode: NAME`` then the id, as the
  real tool does; the mode persists in /var/lib/nvpmodel/status. ``-f CONF``
  reads another conf, as MLPerf's Orin harness runs it (``nvpmodel -f
  build/nvpmodel.temp.conf -m 0``, mlcommons inference_results_v3.0
  closed/*/code/common/nvpmodel_orin.py). A mode line naming a PARAM or
  argument that no section declares, or a PM_CONFIG DEFAULT naming no mode,
  is refused before anything is written. :meth:`FakeBoard.reboot` power-cycles
  the board: sysfs as the kernel boots it, then the mode last set (else the
  conf's default), as nvpmodel.service does.
- DLAs (AGX Orin): one ``clk_cap/dla<n>_core`` file per DLA core, in Hz, where
  NVIDIA's nvpmodel_p3701_0000.conf puts them (its DLA0_CORE/DLA1_CORE PARAM
  sections: ``13e40000.host1x/15880000.nvdla0/acm/clk_cap`` on L4T 35,
  ``bus@0/13e00000.host1x/15880000.nvdla0/clk_cap`` for L4T 36, the latter also
  in a 36.5 board's ``nvpmodel -q --verbose``), and the conf's DLA caps per mode
  (MAXN -1, MODE_15W 614400000, MODE_30W/50W 1369600000). nvpmodel writes -1
  as the DLA's top clock, 1600 MHz (MLPerf's MaxP DLA clock, shared reference
  orin-mlperf.md), as the EMC cap reads back 3199000000 after INT_MAX in the
  same 36.5 log. The Orin Nano has no DLA node, as it has no DLA.
- Starting state (``start``): the board boots with every core online and the
  full ranges, then nvpmodel sets the start mode, so a ``MODE_30W`` start
  leaves cluster 2 offline with limits nobody can write until it is online.
- Sensors: INA3221 channels by label (unused ones labelled "NC"), at a random
  hwmonN; thermal zones including PMIC-Die at 100 C and CV0/CV1-therm at
  -256 C (sensor off); /proc/device-tree/model and compatible (NUL-separated);
  /etc/nv_tegra_release.

- Mode switches that need a reboot (the golden-context rule): once a GPU
  context has existed since boot, ``nvpmodel -m`` into a mode whose TPC_PG_MASK
  differs from the board's prints what a real board printed when the switch
  was declined ("NVPM WARN: Golden image context is already created", "NVPM
  WARN: Reboot required for changing to this power mode: N", "NVPM WARN: DO
  YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", then "NVPM ERROR:
  optMask is 1, no request for power mode"; output captured from devices in
  public Jetson tooling, e.g. a JetPack 6.1 AGX Orin going from MODE_30W
  to MAXN), reads its answer from standard input and stays in its mode; a
  "yes" is recorded (``reboot_requested``) instead of rebooting. The context
  exists from boot on a desktop image (``desktop=True``: the display server
  opens the GPU before any user logs in), and otherwise from the first window
  the tool measures (its model runs on the GPU), or when a test calls
  ``create_gpu_context``; a reboot clears it. The refusal is nvpmodel's own
  rule, not jetson-stats': jtop (jtop/core/nvpmodel.py, NVPModelService
  .set_nvpmodel_id) refuses any switch to another mask before it calls
  nvpmodel at all ("The new nvpmodel N has a different mask M, is not
  compatible") and only passes ``input='YES'`` when forced. The masks are the
  conf's: AGX Orin p3701 MAXN 0, MODE_15W 248, MODE_30W 240, MODE_50W 0.
- Switch time: ``set_switch_time`` makes every ``nvpmodel -m`` take that
  long; tuner.devices.switching.SwitchCosts.mode_s is the figure the twin
  uses (docs/serving.md says what it rests on).

- The clocks that run and throttling (:meth:`FakeBoard.throttle`): GPU
  ``cur_freq``, every cluster's ``scaling_cur_freq`` and BPMP debugfs
  ``clk/{gpusysclk,nafll_dla0_core,nafll_dla1_core}/rate`` (``nafll_dla`` on
  Xavier) follow the limits at the top of the range, as under load, and sit
  below them while throttled; ``oc3_event_cnt`` of the ``soctherm_oc`` hwmon
  then rises (tests/fakekernel.py says where each rule comes from, and how
  limits clamp: the 4.9 kernel of L4T 32 refuses a crossing write instead).
- Root-only files, as a board has them: debugfs mounted 0700, the nvpmodel EMC
  cap 0600, AGX Xavier's L4T 32 rails 0400. Tests may run as root, for whom
  modes stop nothing, so :func:`as_user` makes the tuner ask
  :func:`unprivileged_access` (the "other" permission bits) instead.
- INA3221 layouts: hwmon ``in[1-3]``/``curr[1-3]`` with the shunt voltages
  in4-in6 and, from L4T 36, the sums in7/curr4 (kernel
  Documentation/hwmon/ina3221.rst); L4T 32's ``ina3221x`` IIO folders
  (:func:`_iio_rails`).
- Boards besides the AGX Orin and Orin Nano: an Orin NX 16 GB with NVIDIA's
  nvpmodel_p3767_0000.conf modes, and an AGX Xavier and a TX2 on L4T 32
  (``layout="l4t32"``); where each table comes from is said beside it.

- Thermal caps through cooling devices (:meth:`FakeBoard.thermal_cap`): unlike soctherm's throttling,
  the devfreq and cpufreq cooling devices lower what ``max_freq`` and ``scaling_max_freq`` read back
  while their ``cur_state`` is above 0, and the user's request comes back when it returns to 0.

What it does not model: the EMC rate moving by itself (it stays where written) and DVFS below the max
while a governor idles.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import random
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import fakekernel

from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config

if TYPE_CHECKING:
    import pytest


def tiny_run(device: str = "orin-nano") -> list[str]:
    """``tune run`` arguments for the tiny CNN on a fake board: two knobs, two batch sizes, one-second windows.

    The tests and benchmarks that tune a fake board run this study; ``--model``
    comes first, as the message naming a running tuner's command expects.
    """
    return [
        "run",
        "--model",
        "tiny-cnn",
        "--device",
        device,
        "--max-latency",
        "500ms",
        "--knobs",
        "nvpmodel,gpu_mhz",
        "--batch-sizes",
        "1,4",
        "--sampler",
        "random",
        "--window",
        "1",
    ]


TESTS = Path(__file__).resolve().parent

_A78AE_KHZ = [
    115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400, 883200, 960000,
    1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600, 1574400, 1651200, 1728000,
    1804800, 1881600, 1958400, 2035200, 2112000, 2188800, 2201600,
]  # fmt: skip

GRIDS = {
    "jp5": [
        114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
        930750000, 1032750000, 1134750000, 1236750000, 1300500000,
    ],
    "jp6": [
        306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000,
        1122000000, 1224000000, 1300500000,
    ],
}  # fmt: skip

# Per model: clusters, TPCs, the modes of its conf (cores online, per-cluster CPU max in kHz or -1,
# GPU max in Hz or -1, EMC cap in Hz or 0, TPC_PG_MASK), tables, rails, zones.
BOARDS: dict[str, dict[str, Any]] = {
    "orin-agx": {
        "conf": "nvpmodel_p3701_0005.conf",
        "model": "NVIDIA Jetson AGX Orin Developer Kit",
        "compatible": b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0",
        "clusters": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
        "tpcs": 8,
        "cpu_khz": _A78AE_KHZ,
        "cpu_min_khz": 729600,
        "emc_khz": [204000, 665600, 2133000, 3199000],
        "modes": [
            (0, "MAXN", 12, -1, -1, 0, 0),
            (1, "MODE_15W", 4, 1113600, 408000000, 2133000000, 248),
            (2, "MODE_30W", 8, 1728000, 612000000, 3199000000, 240),
            (3, "MODE_50W", 12, 1497600, 816000000, 3199000000, 0),
        ],
        "dla_caps": {0: -1, 1: 614400000, 2: 1369600000, 3: 1369600000},
        "dla_max_hz": 1600000000,
        "default_mode": 2,
        "ina": {
            "1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"},
            "1-0041": {2: "VDDQ_VDD2_1V8AO"},
        },
        "zones": {
            "CPU-therm": 45.5,
            "GPU-therm": 44.0,
            "CV0-therm": -256.0,
            "CV1-therm": -256.0,
            "SOC0-therm": 44.8,
            "Tj-therm": 46.1,
            "PMIC-Die": 100.0,
        },
    },
    "orin-nano": {
        "conf": "nvpmodel_p3767_0003.conf",
        "model": "NVIDIA Jetson Orin Nano Developer Kit",
        "compatible": b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0",
        "clusters": [[0, 1, 2, 3], [4, 5]],
        "tpcs": 4,
        "cpu_khz": [f for f in _A78AE_KHZ if f <= 1497600] + [1510400],
        "cpu_min_khz": 729600,
        "emc_khz": [204000, 665600, 2133000],
        # NVIDIA's nvpmodel_p3767_0003.conf (github.com/LineageOS/android_device_nvidia_concord
        # nvpmodel/nvpmodel_p3767_0003.conf, default 0): 15W with 6 cores, CPU, GPU -1 and EMC 0 (no caps),
        # TPC_PG_MASK 240 (all 4 TPCs); 7W with 4 cores, CPU 960000 kHz, GPU 408000000 Hz, EMC 2133000000 Hz,
        # TPC_PG_MASK 252 (2 TPCs), so 15W <-> 7W needs a reboot once a GPU context exists.
        "modes": [
            (0, "15W", 6, -1, -1, 0, 240),
            (1, "7W", 4, 960000, 408000000, 2133000000, 252),
        ],
        "default_mode": 0,
        "ina": {"1-0040": {1: "VDD_IN", 2: "VDD_CPU_GPU_CV", 3: "VDD_SOC"}},
        "zones": {"CPU-therm": 41.0, "GPU-therm": 40.5, "SOC0-therm": 40.9, "tj-therm": 42.0},
    },
}
NANO_GRID = [114750000, 216750000, 318750000, 420750000, 522750000, 624750000]

# Orin NX 16 GB: the four modes of NVIDIA's nvpmodel_p3767_0000.conf (github.com/LineageOS/android_device_nvidia_concord
# nvpmodel/nvpmodel_p3767_0000.conf, default 2): TPC_PG_MASK 240 in MAXN and 25W, 252 in 10W and 15W, and its DLA
# caps per core (10W: DLA0 153600000, DLA1 115000000 Hz). CPU top 1984 MHz (the ONX opp of NVIDIA's p3767-0000
# device tree), GPU top 918 MHz (a board's MAXN); rails VDD_IN, VDD_CPU_GPU_CV, VDD_SOC as on the Orin Nano
# (jetson-stats takes VDD_IN as the total).
BOARDS["orin-nx"] = {
    "conf": "nvpmodel_p3767_0000.conf",
    "model": "NVIDIA Orin NX Developer Kit",
    "compatible": b"nvidia,p3768-0000+p3767-0000\0nvidia,p3767-0000\0nvidia,tegra234\0",
    "clusters": [[0, 1, 2, 3], [4, 5, 6, 7]],
    "tpcs": 8,
    "cpu_khz": [f for f in _A78AE_KHZ if f <= 1958400] + [1984000],
    "cpu_min_khz": 729600,
    "emc_khz": [204000, 665600, 2133000, 3199000],
    "grid": [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000],
    "modes": [
        (0, "MAXN", 8, -1, -1, 0, 240),
        (1, "10W", 4, 1190400, 612000000, 2133000000, 252),
        (2, "15W", 4, 1651200, 612000000, 0, 252),
        (3, "25W", 8, 1497600, 408000000, 0, 240),
    ],
    "dla_caps": {0: -1, 1: (153600000, 115000000), 2: 614400000, 3: 614400000},
    "dla_max_hz": 1600000000,
    "default_mode": 2,
    "ina": {"1-0040": {1: "VDD_IN", 2: "VDD_CPU_GPU_CV", 3: "VDD_SOC"}},
    "zones": {"CPU-therm": 42.0, "GPU-therm": 41.0, "CV0-therm": -256.0, "SOC0-therm": 41.5, "tj-therm": 43.0},
}
# Orin Nano 8 GB under JetPack 6.2's Super conf: NVIDIA's nvpmodel_p3767_0003_super.conf (2024; the copy in
# github.com/LineageOS/android_device_nvidia_concord nvpmodel/, commit 370b63a8, default 1): 15W, 25W and
# MAXN_SUPER, TPC_PG_MASK 240 in each, one CPU_A78_<n> CLOCK section per core (not per cluster, unlike the stock
# conf), EMC -1 in MAXN_SUPER. 7W as id 3 is what later Super confs list (nvpmodel -q and conf fixtures of
# 36.4.x boards in public tooling); its lines are the stock nvpmodel_p3767_0003.conf's 7W (same copy: 4 cores,
# CPU 960000 kHz, GPU 408 MHz, EMC 2133 MHz, TPC_PG_MASK 252), no Super conf text with 7W having been found.
# The board tells it is a Super as a real one does (tuner.devices.jetson.board.is_super): the compatible string of
# the -super board config ("nvidia,p3768-0000+p3767-0005-super" first, as on a devkit moved to the Super identity
# in NVIDIA forum thread "25w and MAXN SUPER not seen in jetpack 7.2") and /etc/nvpmodel.conf linked to the
# _super conf (which public scripts pick for p3767-0003 and -0005 alike). Tops: CPU 1728 MHz, GPU 1020 MHz, EMC
# 3199 MHz (the Super devkit's published maxima); model string as such a board's /proc/device-tree/model reads.
BOARDS["orin-nano-super"] = {
    **BOARDS["orin-nano"],
    "conf": "nvpmodel_p3767_0003_super.conf",
    "model": "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
    "compatible": b"nvidia,p3768-0000+p3767-0005-super\0nvidia,p3767-0005\0nvidia,tegra234\0",
    "cpu_khz": [f for f in _A78AE_KHZ if f <= 1728000],
    "emc_khz": [204000, 665600, 2133000, 3199000],
    "grid": [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000],
    "per_core_cpu_params": True,
    "modes": [
        (0, "15W", 6, 1497600, 612000000, 2133000000, 240),
        (1, "25W", 6, 1344000, 918000000, 3199000000, 240),
        (2, "MAXN_SUPER", 6, -1, -1, -1, 240),
        (3, "7W", 4, 960000, 408000000, 2133000000, 252),
    ],
    "default_mode": 1,
}
_CARMEL_KHZ = [f for f in _A78AE_KHZ if f <= 2188800] + [2265600]
_TX2_KHZ = [345600, 499200, 652800, 806400, 960000, 1113600, 1267200, 1420800, 1574400, 1728000, 1881600, 2035200]

# L4T 32 (JetPack 4) boards, metered through the ina3221x IIO driver. AGX Xavier: the modes of NVIDIA's
# nvpmodel_t194.conf (ids 0-3 of eight: MAXN, MODE_10W with TPC_PG_MASK 5, MODE_15W, MODE_30W_ALL, from the
# copy in github.com/LineageOS/android_device_nvidia_galen nvpmodel/nvpmodel_t194.conf), its DLA caps through
# the one DLA_CORE section of the L4T 32 conf (MAX_FREQ /sys/kernel/nvpmodel_emc_cap/nafll_dla, as NVIDIA's MLPerf
# Xavier nvpmodel template has it), rails GPU, CPU, SOC at 0x40 and CV, VDDRQ, SYS5V at 0x41 with no input rail
# (energymon's jetson/JetsonPowerRails.md, from the L4T 32.6.1 guide and device trees), root-only as the issue's
# probe found them. TX2: the modes of its L4T 28.1 conf as search_spaces/tx2.yaml cites them (MAXN, MAXQ,
# MAXP_CORE_ALL, MAXP_CORE_ARM, MAXP_CORE_DENVER; default 3), the Denver pair cpu1-2 as its own cluster, rails
# VDD_SYS_GPU, VDD_SYS_SOC, VDD_4V0_WIFI at 0x40 and VDD_IN (the module's input, the others part of it),
# VDD_SYS_CPU, VDD_SYS_DDR at 0x41 (the same energymon table). The CPU tables are the 76.8 MHz / 153.6 MHz steps
# these cores share with later Jetsons, not read from a board.
BOARDS["xavier-agx"] = {
    "conf": "nvpmodel_t194.conf",
    "model": "NVIDIA Jetson AGX Xavier Developer Kit",
    "compatible": b"nvidia,p2972-0000\0nvidia,tegra194\0",  # mainline tegra194-p2972-0000.dts
    "gpu_node": "gv11b",
    "clusters": [[0, 1], [2, 3], [4, 5], [6, 7]],
    "cpu_param": "CPU_DENVER_{index}",
    "tpcs": 4,
    "cpu_khz": _CARMEL_KHZ,
    "cpu_min_khz": 1190400,
    "emc_khz": [204000, 665600, 1065600, 1331200, 1600000, 2133000],
    "grid": [114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 675750000, 828750000, 905250000,
             1032750000, 1198500000, 1236750000, 1338750000, 1377000000],
    "modes": [
        (0, "MAXN", 8, -1, -1, 0, 0),
        (1, "MODE_10W", 2, 1200000, 520000000, 1065600000, 5),
        (2, "MODE_15W", 4, 1200000, 670000000, 1331200000, 0),
        (3, "MODE_30W_ALL", 8, 1200000, 900000000, 1600000000, 0),
    ],
    "dla_section": "DLA_CORE",
    "dla_caps": {0: -1, 1: 550000000, 2: 750000000, 3: 1050000000},
    "dla_max_hz": 1395200000,
    "default_mode": 2,
    "iio": True,
    "rails_root_only": True,
    "ina": {"1-0040": {0: "GPU", 1: "CPU", 2: "SOC"}, "1-0041": {0: "CV", 1: "VDDRQ", 2: "SYS5V"}},
    "zones": {"CPU-therm": 41.5, "GPU-therm": 40.0, "AUX-therm": 39.5, "Tboard_tegra": 38.0, "PMIC-Die": 100.0},
}  # fmt: skip
BOARDS["tx2"] = {
    "conf": "nvpmodel_t186.conf",
    "model": "NVIDIA Jetson TX2 Developer Kit",
    "compatible": b"nvidia,p2771-0000\0nvidia,tegra186\0",  # mainline tegra186-p2771-0000.dts
    "gpu_node": "gp10b",
    "clusters": [[0, 3, 4, 5], [1, 2]],
    "cpu_param": ["CPU_A57", "CPU_DENVER"],
    "tpcs": None,
    "cpu_khz": _TX2_KHZ,
    "cpu_min_khz": 345600,
    "emc_khz": [40800, 665600, 1331200, 1600000, 1866000],
    "grid": [
        114750000,
        216750000,
        318750000,
        420750000,
        522750000,
        624750000,
        726750000,
        828750000,
        930750000,
        1032750000,
        1134750000,
        1236750000,
        1300500000,
    ],
    "modes": [
        (0, "MAXN", [0, 1, 2, 3, 4, 5], [-1, -1], -1, 0, None),
        (1, "MAXQ", [0, 3, 4, 5], [1200000, None], 850000000, 1331200000, None),
        (2, "MAXP_CORE_ALL", [0, 1, 2, 3, 4, 5], [1400000, 1400000], 1120000000, 1600000000, None),
        (3, "MAXP_CORE_ARM", [0, 3, 4, 5], [2000000, None], 1120000000, 1600000000, None),
        (4, "MAXP_CORE_DENVER", [0, 1], [345600, 2035200], 1120000000, 1600000000, None),
    ],
    "default_mode": 3,
    "iio": True,
    "ina": {
        "0-0040": {0: "VDD_SYS_GPU", 1: "VDD_SYS_SOC", 2: "VDD_4V0_WIFI"},
        "0-0041": {0: "VDD_IN", 1: "VDD_SYS_CPU", 2: "VDD_SYS_DDR"},
    },
    "zones": {"BCPU-therm": 36.5, "MCPU-therm": 36.0, "GPU-therm": 34.5, "Tboard_tegra": 32.0, "PMIC-Die": 100.0},
}

LAYOUTS: dict[str, dict[str, str]] = {
    "l4t32": {
        # JetPack 4: the GPU node named by its chip (gv11b on Xavier, gp10b on TX2; NVIDIA's L4T 32 confs), the
        # EMC cap of nvpmodel_emc_cap, host1x at 13e10000 (nvpmodel_t194.conf's DLA and PVA paths)
        "release": "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t186ref, EABI: aarch64",
        "parent": "sys/devices",
        "gpu": "sys/devices/17000000.{node}",
        "devfreq": "sys/devices/17000000.{node}/devfreq/17000000.{node}",
        "class": "17000000.{node}",
        "node": "{node}",
        "conf_gpu": "/sys/devices/17000000.{node}/devfreq/17000000.{node}",
        "emc_cap": "sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
        "host1x": "sys/devices/13e10000.host1x",
        "dla": "sys/kernel/nvpmodel_emc_cap",
    },
    "l4t35": {
        "release": "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64",
        "parent": "sys/devices",
        "gpu": "sys/devices/17000000.ga10b",
        "devfreq": "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
        "class": "17000000.ga10b",
        "node": "ga10b",
        "conf_gpu": "/sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
        "emc_cap": "sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
        "host1x": "sys/devices/platform/13e40000.host1x",
        "dla": "sys/devices/platform/13e40000.host1x/{unit}/acm/clk_cap",
    },
    "l4t36.3": {
        "release": "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64",
        "parent": "sys/devices/platform/bus@0",
        "gpu": "sys/devices/platform/bus@0/17000000.gpu",
        "devfreq": "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
        "class": "17000000.gpu",
        "node": "gpu",
        "conf_gpu": "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
        "emc_cap": "sys/kernel/nvpmodel_clk_cap/emc",
        "host1x": "sys/devices/platform/bus@0/13e00000.host1x",
        "dla": "sys/devices/platform/bus@0/13e00000.host1x/{unit}/clk_cap",
    },
    "l4t36.4": {
        "release": "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64",
        "parent": "sys/devices/platform",
        "gpu": "sys/devices/platform/17000000.gpu",
        "devfreq": "sys/devices/platform/17000000.gpu/devfreq/17000000.gpu",
        "class": "17000000.gpu",
        "node": "gpu",
        "conf_gpu": "/sys/devices/platform/17000000.gpu/devfreq_dev",
        "emc_cap": "sys/kernel/nvpmodel_clk_cap/emc",
        "host1x": "sys/devices/platform/13e00000.host1x",
        "dla": "sys/devices/platform/bus@0/13e00000.host1x/{unit}/clk_cap",
    },
}
ALIASES = {"l4t36": "l4t36.4"}
GOVERNORS_CPU = "userspace ondemand performance schedutil "
GOVERNORS_GPU = "nvhost_podgov userspace performance simple_ondemand "

# Files the board changes by itself (sensors, the instantaneous clocks):
# left out of snapshots, since no restore can or should put them back.
SENSOR_SUFFIXES = (
    "_input",
    "/temp",
    "/cur_freq",
    "/scaling_cur_freq",
    "gpusysclk/rate",
    "nafll_dla0_core/rate",
    "nafll_dla1_core/rate",
    "nafll_dla/rate",
    "_event_cnt",
)
SHUNT_MOHM = 5

_SCRIPT = r'''
"""Fake nvpmodel for tests: reads /etc/nvpmodel.conf and applies a mode's lines in order."""
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, {tests!r})
import fakekernel  # noqa: E402

fakekernel.register(ROOT)
EXTRA = json.loads((HERE / "fake.json").read_text())
STATUS = ROOT / "var/lib/nvpmodel/status"
SHUNT_MOHM = 5


def under(path):
    return ROOT / path.lstrip("/")


CONF = ["/etc/nvpmodel.conf"]


class ConfError(Exception):
    """What nvpmodel refuses in a conf: a mode line naming a PARAM or argument no section declares."""


def conf_text():
    path = under(CONF[0])
    while path.is_symlink():
        target = os.readlink(path)
        path = under(target) if target.startswith("/") else path.parent / target
    return path.read_text()


def parse():
    params, modes, default, cur, section = {{}}, [], None, None, None
    for raw in conf_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head = re.fullmatch(r"<\s*(.*?)\s*>", line)
        if head:
            fields = dict(re.findall(r"(\w+)=(\S+)", head.group(1)))
            kind = head.group(1).split()[0]
            cur = section = None
            if kind == "PARAM":
                cur = fields["NAME"]
                params[cur] = {{"type": fields["TYPE"], "args": {{}}}}
            elif kind == "POWER_MODEL":
                section = {{"id": int(fields["ID"]), "name": fields["NAME"], "lines": []}}
                modes.append(section)
            elif kind == "PM_CONFIG":
                default = int(fields["DEFAULT"])
            continue
        parts = line.split()
        if section is not None:
            section["lines"].append(parts)
        elif cur is not None:
            params[cur]["args"][parts[0]] = parts[1]
    for mode in modes:
        for parts in mode["lines"]:
            if len(parts) != 3 or parts[0] not in params or not (
                parts[1] in params[parts[0]]["args"] or f"{{parts[1]}}_KNEXT" in params[parts[0]]["args"]
            ):
                raise ConfError(f"NVPM ERROR: invalid line in POWER_MODEL {{mode['id']}}: {{' '.join(parts)}}")
    if [m["id"] for m in modes].count(default) != 1 or len({{m["id"] for m in modes}}) != len(modes):
        raise ConfError("NVPM ERROR: PM_CONFIG DEFAULT must name exactly one POWER_MODEL, ids unique")
    return params, modes, default


def read(rel):
    return (ROOT / rel).read_text().strip()


def write(path, value):
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, f"{{value}}\n".encode())
    finally:
        os.close(fd)


def status_id(default):
    if not STATUS.exists():
        return default
    return int(STATUS.read_text().split()[0].split(":")[1])


def clock_path(args, key):
    for name in (f"{{key}}_KNEXT", key):
        if name in args and os.path.exists(under(args[name])):
            return under(args[name])
    return None


def set_mode(mode_id):
    params, modes, _ = parse()
    mode = next((m for m in modes if m["id"] == mode_id), None)
    if mode is None:
        print(f"NVPM ERROR: Invalid power mode ID: {{mode_id}}", file=sys.stderr)
        return 1
    for param, arg, value in mode["lines"]:
        spec = params[param]
        if spec["type"] == "FILE":
            target = clock_path(spec["args"], arg)
            if target is None:
                print(f"NVPM ERROR: Error opening {{spec['args'].get(arg)}}", file=sys.stderr)
                return 1
            write(target, value)
            continue
        path = clock_path(spec["args"], arg)
        if path is None:
            print(f"NVPM ERROR: Error opening {{spec['args'].get(arg)}}", file=sys.stderr)
            return 1
        number = int(value)
        table_file = clock_path(spec["args"], "FREQ_TABLE")
        table = sorted(int(t) for t in table_file.read_text().split()) if table_file else []
        if "cpufreq" in str(path) and number < 0:
            number = int(read(os.path.relpath(path.parent / "cpuinfo_max_freq", ROOT)))
        elif table and arg.startswith("MAX") and number < 0:
            number = max(table)
        elif table and arg.startswith("MIN") and number == 0 and "devfreq" in str(path):
            number = min(table)
        elif param.startswith("DLA") and number < 0:
            number = EXTRA["dla_max_hz"]
        elif number < 0:
            number = 0
        write(path, number)
    STATUS.parent.mkdir(parents=True, exist_ok=True)
    STATUS.write_text(f"pmode:{{mode_id:04d}}\n")
    refresh()
    return 0


def needs_reboot(mode_id):
    """Once a GPU context exists (the golden context is made), a mode with another TPC mask needs a reboot."""
    if not (HERE / "gpu-context").exists():
        return False
    params, modes, _ = parse()
    mode = next((m for m in modes if m["id"] == mode_id), None)
    for param, arg, value in mode["lines"] if mode is not None else []:
        if param == "TPC_POWER_GATING":
            target = clock_path(params[param]["args"], arg)
            return target is not None and target.read_text().strip() != value
    return False


def clocks():
    """Current clocks (GHz), online cores and active TPCs, from the files."""
    cpus = EXTRA["cpus"]
    online = [0] + [c for c in range(1, cpus) if read(f"sys/devices/system/cpu/cpu{{c}}/online") == "1"]
    freqs = [int(read(f"sys/devices/system/cpu/cpufreq/policy{{p}}/scaling_cur_freq")) / 1e6
             for p in EXTRA["policies"]]
    mask_file = ROOT / EXTRA["gpu"] / "tpc_pg_mask"
    mask = int(mask_file.read_text()) if mask_file.exists() else 0
    cap_ghz = int(read(EXTRA["emc_cap"])) / 1e9 or 3.2
    emc = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
    tpcs = EXTRA["tpcs"] - bin(mask & ((1 << EXTRA["tpcs"]) - 1)).count("1") if EXTRA["tpcs"] else 1
    return {{
        "gpu": int(read(f"{{EXTRA['devfreq']}}/cur_freq")) / 1e9,
        "cpu": sum(freqs) / len(freqs),
        "cores": len(online),
        "emc": int(read(emc)) / 1e9 if (ROOT / emc).exists() else cap_ghz,
        "tpc_share": tpcs / (EXTRA["tpcs"] or 1),
    }}


def rail_watts(c):
    gpu = 1.2 + 14.0 * c["tpc_share"] * c["gpu"] ** 2
    cpu = 0.6 + 0.45 * c["cores"] * c["cpu"] ** 2
    mem = 0.4 + 0.6 * c["emc"]
    if EXTRA["model"] == "tx2":  # VDD_IN feeds the module: the other rails are part of it
        sub = {{"VDD_SYS_GPU": gpu, "VDD_SYS_CPU": cpu, "VDD_SYS_SOC": 0.6 + mem, "VDD_SYS_DDR": mem}}
        return {{**sub, "VDD_4V0_WIFI": 0.3, "VDD_IN": 1.5 + 0.3 + sum(sub.values())}}
    if EXTRA["model"] == "xavier-agx":  # six parallel rails, no input rail
        return {{"GPU": gpu, "CPU": cpu, "SOC": 1.5 + mem, "CV": 0.2, "VDDRQ": mem, "SYS5V": 1.8}}
    if "VDD_IN" in EXTRA["rails"]:
        return {{"VDD_IN": 2.0 + gpu + cpu + 2 * mem, "VDD_CPU_GPU_CV": gpu + cpu, "VDD_SOC": 1.0 + mem}}
    return {{"VDD_GPU_SOC": 2.5 + gpu, "VDD_CPU_CV": cpu, "VIN_SYS_5V0": 3.0 + mem, "VDDQ_VDD2_1V8AO": mem}}


def sensor(path, value):
    """A sensor changes at once: a reader never sees it half written (temporary name, then rename)."""
    tmp = path.with_name(f".{{path.name}}.tmp_input")
    tmp.write_text(f"{{value}}\n")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)  # a root-only sensor stays root-only
    os.replace(tmp, path)


def refresh():
    fakekernel.settle(ROOT)
    c = clocks()
    sums = {{}}
    for name, watts in rail_watts(c).items():
        folder, channel, millivolts = EXTRA["rails"][name]
        milliamps = round(watts * 1e6 / millivolts)
        if EXTRA.get("iio"):
            # L4T 32 ina3221x IIO: in_voltageN (mV), in_currentN (mA), in_powerN (mW), channels from 0
            sensor(ROOT / folder / f"in_voltage{{channel}}_input", millivolts)
            sensor(ROOT / folder / f"in_current{{channel}}_input", milliamps)
            sensor(ROOT / folder / f"in_power{{channel}}_input", round(watts * 1000))
            continue
        sensor(ROOT / folder / f"in{{channel}}_input", millivolts)
        sensor(ROOT / folder / f"curr{{channel}}_input", milliamps)
        # shunt voltage in uV across SHUNT_MOHM (in4-in6 are channels 1-3), and the sums in7 / curr4
        sensor(ROOT / folder / f"in{{channel + 3}}_input", milliamps * SHUNT_MOHM)
        sums.setdefault(folder, []).append(milliamps)
    for folder, currents in sums.items():
        if (ROOT / folder / "curr4_input").exists():
            sensor(ROOT / folder / "curr4_input", sum(currents))
            sensor(ROOT / folder / "in7_input", sum(currents) * SHUNT_MOHM)


def boot():
    """What nvpmodel.service does at boot: the mode last set (the status file), else the conf's default."""
    _params, modes, default = parse()
    mode_id = status_id(default)
    return set_mode(mode_id if any(m["id"] == mode_id for m in modes) else default)


def main(argv):
    if argv[:1] == ["-f"] and len(argv) >= 2:
        CONF[0] = argv[1]
        argv = argv[2:]
    try:
        params, modes, default = parse()
    except (ConfError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if argv[:1] == ["-q"]:
        mode_id = status_id(default)
        name = next(m["name"] for m in modes if m["id"] == mode_id)
        print(f"NV Power Mode: {{name}}")
        print(mode_id)
        return 0
    if len(argv) == 2 and argv[0] == "-m" and argv[1].isdigit():
        if EXTRA.get("ignore_m"):
            return 0
        if EXTRA.get("fail_m"):
            print("NVPM ERROR: Error opening /sys/devices/platform/17000000.gpu/devfreq_dev/available_frequencies")
            return 1
        mode_id = int(argv[1])
        if needs_reboot(mode_id):
            print("NVPM WARN: Golden image context is already created")
            print(f"NVPM WARN: Reboot required for changing to this power mode: {{mode_id}}")
            print("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:", flush=True)
            if sys.stdin.readline().strip() in ("YES", "yes"):
                (ROOT / "var/lib/nvpmodel/fake-reboot").write_text(f"{{mode_id}}\n")
                print("NVPM WARN: rebooting")
                return 0
            print("NVPM ERROR: optMask is 1, no request for power mode")
            return 0
        time.sleep(EXTRA.get("switch_s", 0.0))
        return set_mode(mode_id)
    print("usage: nvpmodel [-f CONF] [-m ID] [-q]", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


@dataclass
class FakeBoard:
    """A laid-out fake board: its root, ``nvpmodel`` executable and the paths tests poke."""

    root: Path
    model: str
    layout: str
    grid: str
    nvpmodel: Path
    gpu_dir: Path
    gpu_device: Path
    hwmon_dirs: dict[str, Path]
    conf: dict[str, Any]
    boot_sysfs: dict[str, bytes] = field(default_factory=dict)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeBoard:
        """Point this test's tuner (and its child processes) at the board through :meth:`env`."""
        for key, value in self.env().items():
            monkeypatch.setenv(key, value)
        from tuner.devices.jetson.device import JetsonDevice

        if not getattr(JetsonDevice.measure, "creates_context", False):
            monkeypatch.setattr(JetsonDevice, "measure", windows_create_context(JetsonDevice.measure))
        return self

    def env(self) -> dict[str, str]:
        """Environment that points the tuner at this board and makes child processes obey its kernel."""
        site = str(TESTS / "fakekernel_site")
        path = os.environ.get("PYTHONPATH", "")
        return {
            "TUNE_SYSFS_ROOT": str(self.root),
            "TUNE_NVPMODEL": str(self.nvpmodel),
            "FAKE_KERNEL_ROOTS": str(self.root),
            "FAKE_GPU_CONTEXT": "window",
            "PYTHONPATH": site + (os.pathsep + path if path else ""),
        }

    def path(self, rel: str) -> Path:
        return self.root / rel

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text().strip().strip("\0")

    def policy(self, cpu: int) -> Path:
        return self.root / f"sys/devices/system/cpu/cpufreq/policy{cpu}"

    def snapshot(self) -> dict[str, bytes]:
        """Every configuration file's bytes and every link's target (not sensors: the board moves those)."""
        files: dict[str, bytes] = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if rel.startswith("etc/fake-nvpmodel") or rel.endswith(SENSOR_SUFFIXES):
                continue
            if path.is_symlink():
                files[rel] = b"-> " + os.readlink(path).encode()
            elif path.is_file():
                files[rel] = path.read_bytes()
        return files

    def _module(self) -> ModuleType:
        loader = importlib.machinery.SourceFileLoader("fake_nvpmodel", str(self.nvpmodel))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(module)
        return module

    def refresh(self) -> None:
        """Recompute rails and cur_freq from the current clocks, as the sensors would show."""
        self._module().refresh()

    def rail_watts(self) -> dict[str, float]:
        """What the rails read now, in watts."""
        out = {}
        for name, (folder, channel, _mv) in self.conf["rails"].items():
            if self.conf.get("iio"):
                out[name] = int(self.read(f"{folder}/in_power{channel}_input")) / 1e3
                continue
            mv = int(self.read(f"{folder}/in{channel}_input"))
            ma = int(self.read(f"{folder}/curr{channel}_input"))
            out[name] = mv * ma / 1e6
        return out

    def set_rail(self, name: str, millivolts: int, milliamps: int) -> None:
        folder, channel, _mv = self.conf["rails"][name]
        (self.root / folder / f"in{channel}_input").write_text(f"{millivolts}\n")
        (self.root / folder / f"curr{channel}_input").write_text(f"{milliamps}\n")

    def set_temp(self, zone_type: str, celsius: float) -> None:
        for zone in sorted((self.root / "sys/class/thermal").glob("thermal_zone*")):
            if (zone / "type").read_text().strip() == zone_type:
                (zone / "temp").write_text(f"{round(celsius * 1000)}\n")
                return
        raise KeyError(zone_type)

    def set_nvpmodel_ignores_m(self, ignore: bool = True) -> None:
        """Make ``nvpmodel -m`` succeed without switching (a mode that needs a reboot does that)."""
        self.conf["ignore_m"] = ignore
        (self.nvpmodel.parent / "fake.json").write_text(json.dumps(self.conf))

    def set_nvpmodel_fails(self, fail: bool = True) -> None:
        """Make ``nvpmodel -m`` fail as it does when the conf names a missing node (seen on 36.x boards)."""
        self.conf["fail_m"] = fail
        (self.nvpmodel.parent / "fake.json").write_text(json.dumps(self.conf))

    def set_switch_time(self, seconds: float) -> None:
        """Make every ``nvpmodel -m`` take ``seconds`` (tests use a fraction of SwitchCosts.mode_s)."""
        self.conf["switch_s"] = seconds
        (self.nvpmodel.parent / "fake.json").write_text(json.dumps(self.conf))

    def throttle(
        self,
        gpu_hz: int | None = None,
        cpu_khz: int | None = None,
        dla_hz: int | None = None,
        oc_events: int = 0,
    ) -> None:
        """Throttle the board as soctherm does under heat or over-current; no arguments: free it.

        The running clocks (GPU ``cur_freq`` and BPMP ``gpusysclk``, every cluster's
        ``scaling_cur_freq``, the DLA's ``nafll_dla*`` rate) are held at or below the
        caps while the limits still read back as written, and ``oc3_event_cnt``
        (instantaneous over-current) gains ``oc_events`` at every read (see fakekernel).
        Seen on boards: a JetPack 6 AGX Orin under MAXN stress logging "System throttled
        due to Over-current" with oc3_event_cnt rising by thousands per hour (NVIDIA
        developer forum, "About System throttled due to over-current").
        """
        fakekernel.throttle(self.root, gpu_hz=gpu_hz, cpu_khz=cpu_khz, dla_hz=dla_hz, oc_events=oc_events)

    def thermal_cap(self, gpu_hz: int | None = None, cpu_khz: int | None = None) -> None:
        """Cap the GPU and CPU limits through their cooling devices; no arguments: lift the cap.

        Unlike :meth:`throttle`, the limits read back lowered (devfreq ``max_freq``, cpufreq
        ``scaling_max_freq``), the user's request is kept and comes back when the cap lifts
        (tests/fakes/fakekernel.py says where each rule comes from). Linux's devfreq and cpufreq
        cooling devices do this wherever a thermal zone's cooling map names them.
        """
        fakekernel.thermal_cap(self.root, gpu_hz=gpu_hz, cpu_khz=cpu_khz)

    def oc_events(self) -> int:
        """The instantaneous over-current count (read without counting it as time passing)."""
        for hwmon in (self.root / "sys/class/hwmon").iterdir():
            if (hwmon / "name").read_text().strip() == "soctherm_oc":
                return int((hwmon / "oc3_event_cnt").read_text())
        raise KeyError("soctherm_oc")

    def create_gpu_context(self) -> None:
        """The GPU has run since boot: from now on a mode with another TPC mask asks for a reboot."""
        gpu_context_created(self.root)

    def has_gpu_context(self) -> bool:
        """Whether a GPU context has existed since the last boot (nvpmodel's golden-context rule applies)."""
        return (self.nvpmodel.parent / "gpu-context").exists()

    def reboot_requested(self) -> bool:
        """Whether anyone answered yes to nvpmodel's reboot question (the fake records it, never reboots)."""
        return (self.root / "var/lib/nvpmodel/fake-reboot").exists()

    def mode_id(self) -> int:
        return int(self.read("var/lib/nvpmodel/status").split()[0].split(":")[1])

    def set_mode(self, mode_id: int) -> None:
        """What ``sudo nvpmodel -m ID`` does on the board."""
        if self._module().set_mode(mode_id) != 0:
            raise RuntimeError(f"fake nvpmodel could not set mode {mode_id}")

    def reboot(self) -> None:
        """A power cycle: sysfs back to its boot values, then nvpmodel at boot.

        What a boot leaves in sysfs is what the kernel starts with (every core
        online, full ranges: the tree before the start mode was set); then
        nvpmodel sets the mode last chosen, which persists across power cycles
        (the Jetson Linux Developer Guide's power management chapter; the
        choice lives in /var/lib/nvpmodel/status), or the conf's PM_CONFIG
        DEFAULT when there is none. Files under /etc and /var are on disk and
        survive as they are.
        """
        changed = [(rel, data) for rel, data in self.boot_sysfs.items() if (self.root / rel).read_bytes() != data]
        changed.sort(key=lambda item: not item[0].endswith("/online"))
        for rel, data in changed:
            fd = os.open(self.root / rel, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        (self.nvpmodel.parent / "gpu-context").unlink(missing_ok=True)
        if self._module().boot() != 0:
            raise RuntimeError("fake nvpmodel could not set the boot mode")
        if self.conf.get("desktop"):
            self.create_gpu_context()

    @contextmanager
    def live(self, period_s: float = 0.02) -> Iterator[None]:
        """Refresh the sensors on a thread, so rails follow writes made by the code under test."""
        module = self._module()
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period_s):
                module.refresh()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _link(path: Path, target: Path | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, path.parent) if isinstance(target, Path) else target, path)


def _cooling_devices(root: Path, board: dict[str, Any], layout: str) -> None:
    """The fan and the clock cooling devices, idle (``cur_state`` 0), where the thermal class lists them.

    ``/sys/class/thermal/cooling_deviceN`` links to ``/sys/devices/virtual/thermal/cooling_deviceN`` with
    ``type``, ``cur_state`` and ``max_state``. The GPU's is named ``devfreq-17000000.gpu`` from Linux 5.12
    (drivers/thermal/devfreq_cooling.c "devfreq-%s" with the device's name; L4T 36 runs 5.15) and
    ``thermal-devfreq-0`` before (L4T 35's 5.10, L4T 32's 4.9), each cluster's ``cpufreq-cpu<first>``
    (cpufreq_cooling.c); the fan is ``pwm-fan``. :meth:`FakeBoard.thermal_cap` moves their states.
    """
    gpu = "devfreq-17000000.gpu" if layout.startswith("l4t36") else "thermal-devfreq-0"
    kinds = [("pwm-fan", 3), (gpu, len(board.get("grid") or NANO_GRID) - 1)]
    kinds += [(f"cpufreq-cpu{cluster[0]}", len(board["cpu_khz"]) - 1) for cluster in board["clusters"]]
    for number, (kind, top) in enumerate(kinds):
        device = root / "sys/devices/virtual/thermal" / f"cooling_device{number}"
        _write(device / "type", kind)
        _write(device / "cur_state", 0)
        _write(device / "max_state", top)
        _link(root / "sys/class/thermal" / device.name, device)


def _oc_hwmon(root: Path, rng: random.Random) -> None:
    """The over-current event counters, where NVIDIA's tegra23x-oc-event driver registers them.

    An hwmon device named ``soctherm_oc`` under the platform device
    ``soctherm-oc-event`` with read-only ``oc1..oc3_event_cnt`` and
    ``oc1..oc3_throt_en`` (SENSOR_DEVICE_ATTR_RO in the driver; OC1 under-voltage,
    OC2 average, OC3 instantaneous over-current), linked from /sys/class/hwmon.
    """
    taken = {p.name for p in (root / "sys/class/hwmon").glob("hwmon*")}
    number = next(n for n in rng.sample(range(10, 20), 10) if f"hwmon{n}" not in taken)
    hwmon = root / "sys/devices/platform/soctherm-oc-event/hwmon" / f"hwmon{number}"
    _write(hwmon / "name", "soctherm_oc")
    for index in (1, 2, 3):
        _write(hwmon / f"oc{index}_event_cnt", 0)
        _write(hwmon / f"oc{index}_throt_en", 1)
    _link(root / "sys/class/hwmon" / hwmon.name, hwmon)


def _conf_text(board: dict[str, Any], lay: dict[str, str]) -> str:
    """An nvpmodel.conf in NVIDIA's format for this board and release (see the module docstring).

    As NVIDIA's nvpmodel_p3701_0000.conf of L4T 35/36 does, one file serves
    both kernels: each argument names the L4T 35 path, and ``<ARG>_KNEXT`` the
    newer kernel's (here: this layout's own, or L4T 36.4's on an L4T 35
    board); nvpmodel writes the one that exists. The EMC section's header is
    written ``<PARAM ...`` without the space, as in that file. An L4T 32 conf
    names its own paths only (NVIDIA's MLPerf Xavier template has no _KNEXT for
    them), gates no TPCs on a TX2, and caps AGX Xavier's DLAs through one
    ``DLA_CORE`` section.
    """
    cpus = sum(len(c) for c in board["clusters"])
    old = LAYOUTS["l4t35"]
    new = lay if lay is not old else LAYOUTS["l4t36.4"]
    l4t32 = lay["release"].startswith("# R32")

    def both(arg: str, path: Any) -> list[str]:
        if l4t32:
            return [f"{arg} {path(lay)}"]
        first, knext = path(old), path(new)
        return [f"{arg} {first}"] + ([f"{arg}_KNEXT {knext}"] if knext != first else [])

    def gpu0(leaf: str) -> Any:
        return lambda lay: f"/{lay['parent']}/gpu.0/{leaf}"

    # One CLOCK section per cluster (named from its first core's cpufreq folder), or per core as the Super conf has
    clusters = [[c] for c in range(cpus)] if board.get("per_core_cpu_params") else board["clusters"]
    params = board.get("cpu_param", "CPU_A78_{index}")
    names = params if isinstance(params, list) else [params.format(index=i) for i in range(len(clusters))]
    dlas = _dla_count(board)
    out = ["# fake nvpmodel.conf: NVIDIA's PARAM / POWER_MODEL / PM_CONFIG format", ""]
    out.append("< PARAM TYPE=FILE NAME=CPU_ONLINE >")
    out += [f"CORE_{c} /sys/devices/system/cpu/cpu{c}/online" for c in range(cpus)]
    if board["tpcs"] is not None:
        out += ["", "< PARAM TYPE=FILE NAME=TPC_POWER_GATING >", *both("TPC_PG_MASK", gpu0("tpc_pg_mask"))]
    out += ["", "< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_ENABLE >", *both("GPU_PWR_CNTL_EN", gpu0("power/control"))]
    out += ["", "< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_DISABLE >", *both("GPU_PWR_CNTL_DIS", gpu0("power/control"))]
    for name, cluster in zip(names, clusters, strict=True):
        base = f"/sys/devices/system/cpu/cpu{cluster[0]}/cpufreq"
        out += ["", f"< PARAM TYPE=CLOCK NAME={name} >"]
        out += [f"FREQ_TABLE {base}/scaling_available_frequencies", f"MAX_FREQ {base}/scaling_max_freq"]
        out += [f"MIN_FREQ {base}/scaling_min_freq"]
    out += ["", "< PARAM TYPE=CLOCK NAME=GPU >"]
    for arg, leaf in (("FREQ_TABLE", "available_frequencies"), ("MAX_FREQ", "max_freq"), ("MIN_FREQ", "min_freq")):
        out += both(arg, lambda lay, leaf=leaf: f"{lay['conf_gpu']}/{leaf}")
    out += ["", "<PARAM TYPE=CLOCK NAME=EMC >", *both("MAX_FREQ", lambda lay: f"/{lay['emc_cap']}"), ""]
    sections = ["DLA_CORE"] if board.get("dla_section") == "DLA_CORE" else [f"DLA{c}_CORE" for c in range(dlas)]
    for core, section in enumerate(sections[:dlas]):
        out += [f"< PARAM TYPE=CLOCK NAME={section} >"]
        out += [*both("MAX_FREQ", lambda lay, core=core: f"/{_dla_cap(lay, core)}"), ""]
    for mode_id, name, cores, cpu_max, gpu_max, emc_cap, tpc in board["modes"]:
        online = cores if isinstance(cores, list) else list(range(cores))
        caps = cpu_max if isinstance(cpu_max, list) else [cpu_max] * len(clusters)
        out.append(f"< POWER_MODEL ID={mode_id} NAME={name} >")
        out += [f"CPU_ONLINE CORE_{c} {1 if c in online else 0}" for c in range(cpus)]
        if tpc is not None:
            out += [f"TPC_POWER_GATING TPC_PG_MASK {tpc}"]
        out += ["GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on"]
        for param, cluster, cap in zip(names, clusters, caps, strict=True):
            if cap is not None and set(cluster) & set(online):
                out += [f"{param} MIN_FREQ {board['cpu_min_khz']}", f"{param} MAX_FREQ {cap}"]
        out += ["GPU MIN_FREQ 0", f"GPU MAX_FREQ {gpu_max}", "GPU_POWER_CONTROL_DISABLE GPU_PWR_CNTL_DIS auto"]
        out += [f"EMC MAX_FREQ {emc_cap}"]
        dla = board["dla_caps"].get(mode_id) if "dla_caps" in board else None
        per_core = dla if isinstance(dla, tuple) else (dla,) * dlas
        out += [f"{section} MAX_FREQ {cap}" for section, cap in zip(sections[:dlas], per_core, strict=False)]
        out += [""]
    out += ["# mandatory section to configure the default power mode", f"< PM_CONFIG DEFAULT={board['default_mode']} >"]
    return "\n".join(out) + "\n"


def _dla_rate(board: dict[str, Any], core: int) -> str:
    """BPMP's clock of DLA core ``core``: nafll_dla0_core/nafll_dla1_core on Orin (T234), nafll_dla on Xavier (T194)."""
    return "nafll_dla" if board.get("dla_section") == "DLA_CORE" else f"nafll_dla{core}_core"


def _iio_rails(root: Path, address: str, number: int, channels: dict[int, str], root_only: bool) -> dict[str, list]:
    """One INA3221 in L4T 32's ina3221x IIO layout: what jetson-stats and Zeus read there.

    ``/sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:deviceN`` with ``name``
    ina3221x, ``rail_name_<ch>`` (channels 0-2) and ``in_power<ch>_input`` (mW),
    ``in_voltage<ch>_input`` (mV), ``in_current<ch>_input`` (mA) beside the
    current limits (jtop/core/power.py list_all_i2c_ports, zeus/device/soc/jetson.py).
    """
    folder = f"sys/bus/i2c/drivers/ina3221x/{address}/iio:device{number}"
    _write(root / folder / "name", "ina3221x")
    found: dict[str, list] = {}
    for channel, label in channels.items():
        _write(root / folder / f"rail_name_{channel}", label)
        for reading in ("power", "voltage", "current"):
            _write(root / folder / f"in_{reading}{channel}_input", 0)
            if root_only:
                (root / folder / f"in_{reading}{channel}_input").chmod(0o400)
        _write(root / folder / f"crit_current_limit_{channel}", 32760)
        _write(root / folder / f"warn_current_limit_{channel}", 32760)
        found[label] = [folder, channel, 5000]
    return found


def _dla_count(board: dict[str, Any]) -> int:
    """DLA cap files: two per Orin with DLAs, one shared file on L4T 32's AGX Xavier, none on a board without."""
    if "dla_caps" not in board:
        return 0
    return 1 if board.get("dla_section") == "DLA_CORE" else 2


def _dla_cap(lay: dict[str, str], core: int) -> str:
    """Where DLA core ``core``'s clock cap sits in this layout (see the module docstring)."""
    if lay["release"].startswith("# R32"):
        return f"{lay['dla']}/nafll_dla"
    unit = ("15880000.nvdla0", "158c0000.nvdla1")[core]
    return lay["dla"].format(unit=unit) + f"/dla{core}_core"


def make_fake_board(
    root: Path,
    model: str = "orin-agx",
    layout: str = "l4t35",
    seed: int | None = None,
    grid: str = "jp5",
    start: str | None = None,
    desktop: bool = False,
) -> FakeBoard:
    """Lay out a fake ``model`` board under ``root`` and boot it into ``start`` (default: the conf's default).

    ``desktop``: a desktop image, whose display server holds a GPU context from boot (see the module
    docstring's golden-context rule); otherwise the first measured window creates it.
    """
    if model not in BOARDS:
        raise ValueError(f"unknown fake board {model!r}: choose from {', '.join(BOARDS)}")
    layout = ALIASES.get(layout, layout)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose from {', '.join(LAYOUTS)}")
    board = BOARDS[model]
    lay = {key: value.replace("{node}", board.get("gpu_node", "")) for key, value in LAYOUTS[layout].items()}
    if (layout == "l4t32") != ("gpu_node" in board):
        raise ValueError(f"fake board {model!r} runs on {'l4t32' if 'gpu_node' in board else 'l4t35 and later'}")
    rng = random.Random(seed)
    root = Path(root)
    cpus = sum(len(c) for c in board["clusters"])
    gpu_hz = board.get("grid") or (GRIDS[grid] if model == "orin-agx" else NANO_GRID)
    dlas = _dla_count(board)
    gpu_device, devfreq = root / lay["gpu"], root / lay["devfreq"]

    _write(devfreq / "available_frequencies", " ".join(map(str, gpu_hz)) + " ")
    _write(devfreq / "available_governors", GOVERNORS_GPU)
    _write(devfreq / "min_freq", min(gpu_hz))
    for name in ("max_freq", "cur_freq"):
        _write(devfreq / name, max(gpu_hz))
    _write(devfreq / "governor", "nvhost_podgov")
    _link(devfreq / "device", gpu_device)
    _link(root / "sys/class/devfreq" / lay["class"], devfreq)
    if layout == "l4t36.4":
        _link(gpu_device / "devfreq_dev", devfreq)
    if board["tpcs"] is not None:
        _write(gpu_device / "tpc_pg_mask", 0)
    _write(gpu_device / "railgate_enable", 1)
    _write(gpu_device / "power" / "control", "auto")
    node = root / "sys/firmware/devicetree/base" / f"gpu@17000000-{lay['node']}"
    (node).mkdir(parents=True, exist_ok=True)
    (node / "name").write_bytes(lay["node"].encode() + b"\0")
    _link(gpu_device / "of_node", node)
    _link(root / lay["parent"] / "gpu.0", gpu_device)
    others = (("15340000.vic", "vic", [115200000, 729600000]), ("15480000.nvdec", "nvdec", [115200000]))
    for unit, name, rates in others:
        dev = root / lay["host1x"] / unit
        other = dev / "devfreq" / unit
        _write(other / "available_frequencies", " ".join(map(str, rates)) + " ")
        _write(other / "min_freq", min(rates))
        _write(other / "max_freq", max(rates))
        _link(other / "device", dev)
        on = root / "sys/firmware/devicetree/base" / f"{name}@{unit.split('.')[0]}"
        on.mkdir(parents=True, exist_ok=True)
        (on / "name").write_bytes(name.encode() + b"\0")
        _link(dev / "of_node", on)
        _link(root / "sys/class/devfreq" / unit, other)

    cpu_base = root / "sys/devices/system/cpu"
    for cpu in range(cpus):
        _write(cpu_base / f"cpu{cpu}" / "online", 1)
    for cluster in board["clusters"]:
        pol = cpu_base / "cpufreq" / f"policy{cluster[0]}"
        _write(pol / "scaling_available_frequencies", " ".join(map(str, board["cpu_khz"])) + " ")
        _write(pol / "scaling_available_governors", GOVERNORS_CPU)
        _write(pol / "related_cpus", " ".join(map(str, cluster)))
        _write(pol / "affected_cpus", " ".join(map(str, cluster)))
        _write(pol / "cpuinfo_min_freq", min(board["cpu_khz"]))
        _write(pol / "cpuinfo_max_freq", max(board["cpu_khz"]))
        _write(pol / "scaling_governor", "schedutil")
        _write(pol / "scaling_min_freq", min(board["cpu_khz"]))
        _write(pol / "scaling_max_freq", max(board["cpu_khz"]))
        _write(pol / "scaling_cur_freq", max(board["cpu_khz"]))
        for cpu in cluster:
            _link(cpu_base / f"cpu{cpu}" / "cpufreq", pol)

    _write(root / lay["emc_cap"], 0)
    (root / lay["emc_cap"]).chmod(0o600)  # root-only, as the probe of a board found it
    for core in range(dlas):
        _write(root / _dla_cap(lay, core), board["dla_max_hz"])
    bpmp = root / "sys/kernel/debug/bpmp/debug/clk"
    emc = bpmp / "emc"
    _write(emc / "rate", max(board["emc_khz"]) * 1000)
    _write(emc / "mrq_rate_locked", 0)
    _write(root / "sys/kernel/debug/bpmp/debug/emc/possible_rates", " ".join(map(str, board["emc_khz"])) + " ")
    # BPMP's view of the running clocks (NVIDIA's MLPerf Orin harness reads these with sudo cat)
    _write(bpmp / "gpusysclk" / "rate", max(gpu_hz))
    for core in range(dlas):
        _write(bpmp / (_dla_rate(board, core)) / "rate", board["dla_max_hz"])
    (root / "sys/kernel/debug").chmod(0o700)  # debugfs is mounted root-only (mode 0700)
    _oc_hwmon(root, rng)
    (root / "proc/device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc/device-tree/compatible").write_bytes(board["compatible"])
    (root / "proc/device-tree/model").write_bytes(board["model"].encode() + b"\0")
    _write(root / "etc/nv_tegra_release", lay["release"])
    _write(root / "etc/nvpmodel" / board["conf"], _conf_text(board, lay))
    _link(root / "etc/nvpmodel.conf", f"/etc/nvpmodel/{board['conf']}")

    rails: dict[str, list[Any]] = {}
    hwmon_dirs: dict[str, Path] = {}
    numbers = rng.sample(range(1, 10), len(board["ina"]))  # hwmon numbers are the kernel's, unique
    for number, (address, channels) in zip(numbers, board["ina"].items(), strict=True):
        if board.get("iio"):
            rails.update(_iio_rails(root, address, number - 1, channels, board.get("rails_root_only", False)))
            continue
        folder = f"sys/bus/i2c/drivers/ina3221/{address}/hwmon/hwmon{number}"
        hwmon_dirs[address] = root / folder
        _write(root / folder / "name", "ina3221")
        _link(root / "sys/class/hwmon" / Path(folder).name, root / folder)
        for channel in (1, 2, 3):
            label = channels.get(channel)
            _write(root / folder / f"in{channel}_label", label or "NC")
            _write(root / folder / f"in{channel}_input", 0)
            _write(root / folder / f"curr{channel}_input", 0)
            _write(root / folder / f"in{channel + 3}_input", 0)  # shunt voltage (uV) of channel 1-3
            _write(root / folder / f"shunt{channel}_resistor", SHUNT_MOHM * 1000)
            if label:
                rails[label] = [folder, channel, 1800 if "1V8" in label else 5000]
        if layout != "l4t35":
            # the summation channel of newer kernels: in7 (sum of shunt voltages) and curr4 (sum of currents)
            _write(root / folder / "in7_label", "sum of shunt voltages")
            _write(root / folder / "in7_input", 0)
            _write(root / folder / "curr4_input", 0)

    _cooling_devices(root, board, layout)
    for index, (zone, celsius) in enumerate(board["zones"].items()):
        folder = root / f"sys/class/thermal/thermal_zone{index}"
        _write(folder / "type", zone)
        _write(folder / "temp", round(celsius * 1000))

    conf = {
        "cpus": cpus,
        "policies": [c[0] for c in board["clusters"]],
        "tpcs": board["tpcs"],
        "gpu": lay["gpu"],
        "devfreq": lay["devfreq"],
        "emc_cap": lay["emc_cap"],
        "rails": rails,
        "modes": {name: mode_id for mode_id, name, *_ in board["modes"]},
        "dla_max_hz": board.get("dla_max_hz", 0),
        "dla_caps": [_dla_cap(lay, core) for core in range(dlas)],
        "dla_rates": [_dla_rate(board, core) for core in range(dlas)],
        "desktop": desktop,
        "iio": board.get("iio", False),
        "model": model,
    }
    tool_dir = root / "etc" / "fake-nvpmodel"
    tool_dir.mkdir(parents=True, exist_ok=True)
    (tool_dir / "fake.json").write_text(json.dumps(conf))
    script = tool_dir / "nvpmodel"
    script.write_text(f"#!{sys.executable} -S\n{_SCRIPT.format(tests=str(TESTS)).lstrip()}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    fakekernel.register(root)
    fakekernel.settle(root)

    fake = FakeBoard(
        root=root,
        model=model,
        layout=layout,
        grid=grid,
        nvpmodel=script,
        gpu_dir=devfreq,
        gpu_device=gpu_device,
        hwmon_dirs=hwmon_dirs,
        conf=conf,
    )
    fake.boot_sysfs = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / "sys").rglob("*"))
        if p.is_file() and not p.is_symlink() and not p.as_posix().endswith(SENSOR_SUFFIXES)
    }
    fake.set_mode(conf["modes"][start] if start is not None else board["default_mode"])
    if desktop:
        fake.create_gpu_context()
    return fake


# -- the golden context (see the module docstring) --------------------------------------------------


def gpu_context_created(root: Path) -> None:
    """A process opened the GPU on the fake board at ``root``: nvpmodel's golden-context rule applies until reboot.

    A no-op for a tree that is not a fake board (the wrapper below sees every JetsonDevice).
    """
    tool_dir = Path(root) / "etc" / "fake-nvpmodel"
    if tool_dir.is_dir():
        (tool_dir / "gpu-context").touch()


def every_mode(device: Any) -> Any:
    """``device`` (a JetsonDevice) with every mode of its board named, as ``tune run --modes`` would name them.

    For tests of switching itself (clocks, cores, caps per mode): without names, a board offers only the
    modes of its current TPC mask.
    """
    device.offer_modes(_mode_labels(device.board.modes))
    return device


def _mode_labels(modes: Any) -> list[str]:
    return [m.name[len("MODE_") :] if m.name.startswith("MODE_") else m.name for m in modes]


def windows_create_context(measure: Any) -> Any:
    """``JetsonDevice.measure`` that first creates the GPU context on the device's board, as a real window does.

    On a real board the runner's CUDA context is the golden context nvpmodel checks; the fakes have
    no GPU, so the window's start stands for it. Installed in this process by :meth:`FakeBoard.install`
    and in child processes by tests/fakes/fakekernel_site/sitecustomize.py (FAKE_GPU_CONTEXT=window).
    """

    def measure_on_gpu(self: Any, model: str, config: Config, settings: WindowSettings) -> Measurement:
        gpu_context_created(self.root)
        return measure(self, model, config, settings)

    measure_on_gpu.creates_context = True  # type: ignore[attr-defined]
    return measure_on_gpu


def quick_window(self: Any, model: str, config: Config, settings: WindowSettings, monitors: list[Any]) -> Measurement:
    """A stand-in for JetsonDevice._window: quick_measure's 0.1 s rail window with the device's monitors
    (the clocks that ran) sampled through it, so what the device makes of a window is the real code's."""
    for monitor in monitors:
        monitor.start()
    try:
        measurement = quick_measure(self, model, config, settings)
    finally:
        for monitor in monitors:
            monitor.stop()
    return measurement.model_copy(update={"temps_c": self.temperatures()})


def unprivileged_access(path: Path | str, mode: int) -> bool:
    """``os.access`` for a user other than root, on a fake board's tree where every file stands for a root-owned one.

    The kernel's generic_permission for a uid that neither owns the file nor is in
    its group: the "other" bits decide, search (x) on every folder on the way and
    the bits asked of the file itself. Outside a fake board the real answer stands.
    """
    path = Path(path)
    real = Path(os.path.realpath(path))
    roots = [Path(r) for r in fakekernel._ROOTS if str(real).startswith(r + "/")]
    if not roots:
        return os.access(path, mode)
    root = roots[0]
    folder = real.parent
    while folder != root and root in folder.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return False
        folder = folder.parent
    if not real.exists():
        return False
    bits = real.stat().st_mode
    wanted = {os.R_OK: stat.S_IROTH, os.W_OK: stat.S_IWOTH, os.X_OK: stat.S_IXOTH}
    return all(bits & bit for flag, bit in wanted.items() if mode & flag)


def as_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run this test's tuner as a user other than root (tests may run as root, for whom file modes stop nothing)."""
    from tuner.devices.jetson import sysfs

    monkeypatch.setattr(sysfs, "access", unprivileged_access)


def quick_measure(self: Any, model: str, config: Config, settings: WindowSettings) -> Measurement:
    """A stand-in for JetsonDevice.measure in end-to-end tests of board state: the board's own rail
    meter over a 0.1 s window and made-up latencies, no model and no LoadGen. What these tests check
    is what a run does to the board, not the measurement (tests/measure/test_loadgen_e2e.py covers that)."""
    import time

    gpu_context_created(self.root)  # the window's model would have opened the GPU
    self.check_thermal()
    meter = self.make_meter(settings.meter)
    meter.start()
    time.sleep(0.1)
    reading = meter.stop()
    queries = 50 * config.batch_size
    return Measurement(
        j_per_query=reading.energy_j / queries,
        p50_ms=5,
        p90_ms=6,
        p99_ms=7,
        qps=queries / reading.duration_s,
        avg_w=reading.avg_w,
        energy_j=reading.energy_j,
        queries=queries,
        duration_s=reading.duration_s,
        meter=reading.meter,
        rails=reading.rails,
    )


def board_export(
    knobs: dict[str, Any] | None = None,
    model: str = "resnet50",
    batch_size: int = 8,
    device: str = "orin",
    device_kind: str = "orin-agx",
) -> dict[str, Any]:
    """A `tune export` file for a real Jetson backend (``--device orin`` by default) as a mapping to dump as YAML.

    ``knobs`` default to the installed fake board's default configuration; a
    test that needs another value (a frequency the board lacks) passes its own.
    It carries no digest, as an export from before digests: apply accepts it.
    """
    if knobs is None:
        from tuner.devices.registry import open_device

        knobs = open_device(device).space().default_config().knobs
    return {
        "version": 1,
        "device_kind": device_kind,
        "device": device,
        "twin": False,
        "model": model,
        "batch_size": batch_size,
        "knobs": knobs,
        "max_latency_ms": 50.0,
        "percentile": "p99",
        "metrics": {},
        "provenance": {"study": "s", "storage": "x", "trial": 0, "exported_at": "now"},
    }
