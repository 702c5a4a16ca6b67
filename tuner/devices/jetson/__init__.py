"""NVIDIA Jetson backend: nvpmodel modes, CPU/GPU/EMC clocks, INA3221 rails, thermal guard.

Split by concern: :mod:`.board` finds the board and reads its own tables and
nvpmodel modes, :mod:`.device` applies and restores configurations,
:mod:`.restore` checks a journal against the board, :mod:`.meters` reads the
rails, and :mod:`.sysfs` is the only code that opens the board's files.
"""

from tuner.devices.jetson.board import (
    MODEL_NAMES,
    MODULES,
    Board,
    BoardMode,
    Policy,
    Rail,
    board_space,
    board_title,
    detect_kind,
    discover,
    parse_nvpmodel_conf,
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
