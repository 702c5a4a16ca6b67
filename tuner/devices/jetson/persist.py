"""A tuned configuration as a custom nvpmodel mode of the board's own conf, made the mode it boots in.

Why nvpmodel, not a systemd unit running ``tune apply`` at boot: nvpmodel is
how every Jetson already keeps its power mode across power cycles (the mode
last set with ``nvpmodel -m`` is applied again at boot by nvpmodel's own
service; the conf's PM_CONFIG DEFAULT covers a board with no mode set yet),
so the tuned mode is in force before any user service starts, needs neither
Python nor this tool at boot, shows by name in ``nvpmodel -q`` and jtop, and
an operator can leave it with ``nvpmodel -m`` as with any mode. NVIDIA's
MLPerf harness sets its tuned Orin points the same way (a conf with the
tuned POWER_MODEL, then ``nvpmodel -m``). What nvpmodel cannot hold (the EMC
rate locked through debugfs, rather than capped; the batch size and
precision) is said by the nvpmodel export's one line, and stays with the
runtime.

The mode is added to the conf file /etc/nvpmodel.conf leads to (written
whole, through tuner.plumbing.atomicfile, keeping its permission bits), made the
DEFAULT, and set with ``nvpmodel -m``. The conf's bytes and mode bits, and
the mode the board was in, are journaled first (tuner.devices.journal, key
``persist``), so ``tune restore --persist`` writes the file back byte for byte
and sets the earlier mode again. An L4T upgrade that replaces the conf drops
the mode; nvpmodel then boots the conf's default, and ``tune apply
--persist`` adds it again.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Protocol

from tuner.devices.jetson.board import Board
from tuner.devices.jetson.modes import conf_path
from tuner.devices.jetson.nvpconf import ConfMode, NvpConf, check_mode, fresh_id, read_conf, tuned_mode, with_mode
from tuner.errors import UserError
from tuner.plumbing import atomicfile
from tuner.space import Config

PREFIX = "POWERTUNE_"


class ModeBoard(Protocol):
    """What a custom mode needs of a Jetson device (tuner.devices.jetson.device.JetsonDevice is one).

    Named here rather than imported: the device restores a persisted conf
    through this module, so this module must not depend on the device.
    """

    root: Path
    board: Board

    def targets(self, config: Config) -> dict[str, Any]:
        """What the configuration asks of the board: nvpmodel mode id, cores, kHz, Hz."""
        ...

    def set_mode(self, mode_id: int) -> None:
        """Switch nvpmodel to the mode and wait until the board reports it."""
        ...


def mode_name(model: str, digest: str) -> str:
    """A mode name nvpmodel takes (one token) that says what it is for: POWERTUNE_<MODEL>_<6 hex digits>."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", model).strip("_").upper()[:24] or "MODEL"
    return f"{PREFIX}{slug}_{digest[:6]}"


def _conf(device: ModeBoard) -> tuple[Path, str]:
    path = conf_path(device.root)
    if path is None:
        raise UserError(
            f"no /etc/nvpmodel.conf under {device.root}: a custom nvpmodel mode needs the board's conf; "
            "run on the board, or point --sysfs-root at its tree"
        )
    return path, path.read_text(errors="replace")


def _tables(device: ModeBoard, conf: NvpConf) -> dict[str, list[int]]:
    """Each clock PARAM's table on this board (what nvpmodel would round a value to)."""
    b = device.board
    tables: dict[str, list[int]] = {"GPU": b.gpu_hz}
    if b.emc_hz:
        tables["EMC"] = b.emc_hz
    firsts = {p.cpus[0]: p.available_khz for p in b.policies}
    for param, first in conf.clusters().items():
        if first in firsts:
            tables[param] = firsts[first]
    return tables


def custom_mode(device: ModeBoard, config: Config, name: str) -> tuple[Path, str, ConfMode]:
    """The board's conf path, its text with the tuned mode added as the default, and that mode, read back.

    The mode is built on the lines of the nvpmodel mode the configuration
    was tuned under and checked by parsing the whole conf again with the
    reader board discovery uses (tuner.devices.jetson.nvpconf.check_mode).
    """
    path, text = _conf(device)
    conf = read_conf(text)
    taken = [m.name for m in conf.modes if m.name.startswith(PREFIX)]
    if taken:
        raise UserError(
            f"the board's nvpmodel.conf already holds the tuned mode {taken[0]}: "
            "remove it first with tune restore --persist"
        )
    targets = device.targets(config)
    mode = tuned_mode(conf, targets["mode"], targets, fresh_id(conf), name)
    new_text = with_mode(text, mode, default=True)
    return path, new_text, check_mode(new_text, mode, _tables(device, conf))


def saved_conf(device: ModeBoard) -> dict[str, Any]:
    """What ``restore`` needs to undo :func:`persist`: the conf's path, bytes (as text) and permission bits."""
    path, text = _conf(device)
    return {"conf": str(path), "text": text, "mode": stat.S_IMODE(os.stat(path).st_mode)}


def persist(device: ModeBoard, mode: ConfMode, path: Path, text: str) -> None:
    """Write the conf with the tuned mode (same permission bits), then switch to it with nvpmodel."""
    bits = stat.S_IMODE(os.stat(path).st_mode)
    atomicfile.write_text(path, text, mode=bits)
    device.set_mode(mode.id)


def unpersist(device: ModeBoard, saved: dict[str, Any]) -> list[str]:
    """Put the conf back as journaled, byte for byte; the problems found (none: done).

    The journal may name only the conf this board reads, and its text must be
    a conf nvpmodel takes (a PM_CONFIG naming one of its modes): a journal is
    a file, and must not be able to write elsewhere or leave a board that
    cannot boot a mode.
    """
    path = conf_path(device.root)
    if path is None or str(path) != str(saved.get("conf")):
        return [f"journal: the saved nvpmodel conf {saved.get('conf')!r} is not this board's ({path}): not written"]
    text, bits = saved.get("text"), saved.get("mode")
    if not isinstance(text, str) or not isinstance(bits, int) or not 0 <= bits <= 0o777:
        return ["journal: the saved nvpmodel conf is not text with permission bits: not written"]
    conf = read_conf(text)
    if conf.default is None or conf.mode(conf.default) is None:
        return ["journal: the saved nvpmodel conf has no PM_CONFIG default mode: not written"]
    if path.read_text(errors="replace") != text or stat.S_IMODE(os.stat(path).st_mode) != bits:
        try:
            atomicfile.write_text(path, text, mode=bits)
        except UserError as exc:
            return [str(exc)]
    return []
