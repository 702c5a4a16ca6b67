"""NVIDIA Jetson backend: nvpmodel modes, CPU/GPU/EMC clocks, INA3221 rails, thermal guard.

Split by concern: :mod:`.board` finds the board and reads its own tables,
:mod:`.modes` its nvpmodel modes, :mod:`.spaces` turns both into the search
space, :mod:`.device` drives the board (applying through :mod:`.apply`,
switching modes through :mod:`.nvpmodel` under the TPC-mask rule of
:mod:`.masks`, guarding the zones of :mod:`.thermal`) and restores it,
:mod:`.restore` checks a journal against the board, :mod:`.meters` reads the
rails, and :mod:`.sysfs` is the only code that opens the board's files.
"""

from tuner.devices.jetson.board import (
    MODEL_NAMES,
    MODULES,
    Board,
    Policy,
    Rail,
    board_title,
    detect_kind,
    discover,
)
from tuner.devices.jetson.device import (
    DEVICE_KINDS,
    ApplyError,
    JetsonDevice,
    JetsonError,
    MaskChangeRefused,
    ModeNeedsReboot,
    RestoreIncomplete,
    ThermalLimitError,
    Write,
    jetson_device,
)
from tuner.devices.jetson.meters import JtopMeter, RailMeter
from tuner.devices.jetson.modes import BoardMode, parse_nvpmodel_conf
from tuner.devices.jetson.spaces import board_space

__all__ = [
    "DEVICE_KINDS",
    "MODEL_NAMES",
    "MODULES",
    "ApplyError",
    "Board",
    "BoardMode",
    "JetsonDevice",
    "JetsonError",
    "JtopMeter",
    "MaskChangeRefused",
    "ModeNeedsReboot",
    "Policy",
    "Rail",
    "RailMeter",
    "RestoreIncomplete",
    "ThermalLimitError",
    "Write",
    "board_space",
    "board_title",
    "detect_kind",
    "discover",
    "jetson_device",
    "parse_nvpmodel_conf",
]
