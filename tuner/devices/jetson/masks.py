"""The TPC-mask rule: which nvpmodel modes the board reaches without a reboot, and the modes a user named."""

from __future__ import annotations

from pathlib import Path

from tuner.devices.jetson.board import Board
from tuner.devices.jetson.errors import MaskChangeRefused
from tuner.devices.jetson.nvpmodel import NvpmodelControl
from tuner.devices.jetson.spaces import board_space, mode_label
from tuner.errors import UserError
from tuner.space import Config, SearchSpace


class TpcMaskRule(NvpmodelControl):
    """The modes offered and refused by their TPC mask (part of JetsonDevice)."""

    name: str
    root: Path
    board: Board
    notes: list[str]
    start_mode: int | None
    _base_space: SearchSpace
    _space: SearchSpace
    _space_runtime: str | None
    _named: tuple[int, ...]

    def _board_space(self, runtime: str | None) -> tuple[SearchSpace, str | None]:
        """The board's space from the mode it is in: the modes of its TPC mask, and those the user named."""
        self._space_runtime = runtime
        return board_space(self._base_space, self.board, runtime, self.start_mode, self._named)

    def _mask(self, mode_id: int | None) -> int | None:
        return next((m.tpc_pg_mask for m in self.board.modes if m.id == mode_id), None)

    def offer_modes(self, names: list[str]) -> list[str]:
        """Let a study tune the modes the user named, other TPC masks included; the lines to say before any write.

        A named mode with another mask than the board's is entered (nvpmodel allows
        it while no GPU context exists yet), but the tool's own first window makes
        the context, so coming back to the board's mode needs a reboot: the returned
        line says so, and the restore at the end refuses, before its first write,
        with how to finish.
        """
        every = {mode_label(m.name): m for m in self.board.modes}
        unknown = [n for n in names if n not in every]
        if unknown:
            raise UserError(
                f"unknown nvpmodel mode(s) {', '.join(unknown)} for this board: choose from {', '.join(every)}"
            )
        start = self._mask(self.start_mode)
        self._named = tuple(every[n].id for n in names)
        self._space, _ = self._board_space(self._space_runtime)
        other = [n for n in names if every[n].tpc_pg_mask != start]
        if not other:
            return []
        line = (
            f"nvpmodel mode(s) {', '.join(other)} gate other GPU TPCs than the board's mode "
            f"{self._mode_name(self.start_mode)} (TPC_PG_MASK {', '.join(str(every[n].tpc_pg_mask) for n in other)} "
            f"vs {start}): once the GPU has run, nvpmodel changes the mask only through a reboot, so restoring "
            f"the board will need one (afterwards: sudo nvpmodel -m {self.start_mode}, answer yes, then "
            f"tune restore --device {self.name})"
        )
        if line not in self.notes:
            self.notes.append(line)
        return [line]

    def _mode_name(self, mode_id: int | None) -> str:
        return next((mode_label(m.name) for m in self.board.modes if m.id == mode_id), str(mode_id))

    def check_config_reachable(self, config: Config) -> None:
        """:meth:`check_reachable` for a configuration's mode, named as the space names it (``tune apply``)."""
        knob = self._space.mode_knob
        mode = next((m for m in self.board.modes if knob and mode_label(m.name) == config.knobs.get(knob)), None)
        if mode is not None:
            self.check_reachable(mode.id)

    def check_reachable(self, mode_id: int) -> None:
        """Refuse, before any write, a switch to a mode of another TPC mask that the user did not name.

        The check jetson-stats makes before it calls nvpmodel (jtop/core/nvpmodel.py,
        NVPModelService.set_nvpmodel_id: "The new nvpmodel N has a different mask M,
        is not compatible"), against the mode the board is in now.
        """
        current = self.query_mode()
        if mode_id == current or mode_id in self._named:
            return
        now, then = self._mask(current), self._mask(mode_id)
        if now == then:
            return
        raise MaskChangeRefused(
            f"nvpmodel mode {self._mode_name(mode_id)} has TPC_PG_MASK {then}, the board's mode "
            f"{self._mode_name(current)} has {now}: the masks are not compatible without a reboot (once the GPU "
            "has run, nvpmodel asks to reboot, and coming back needs another); nothing was written. To use it: "
            f"sudo nvpmodel -m {mode_id}, answer yes to reboot, then run the command again in that mode"
        )
