"""The search space of a board: its own frequency tables and nvpmodel modes over the committed YAML."""

from __future__ import annotations

from typing import Any

from tuner.devices.jetson.board import Board
from tuner.devices.jetson.dla import for_runtime
from tuner.devices.jetson.modes import BoardMode
from tuner.space import Knob, Mode, SearchSpace


def mhz(hz: int, per_mhz: float) -> int | float:
    """A table value in MHz as the spaces write it: 1300500000 Hz -> 1300.5, 3199000 kHz -> 3199."""
    value = round(hz / per_mhz, 3)
    return int(value) if value == int(value) else value


def mode_label(name: str) -> str:
    """The conf's MODE_30W is the space's 30W; MAXN stays MAXN."""
    return name[len("MODE_") :] if name.startswith("MODE_") else name


def same_mask(board: Board, mode_id: int) -> list[BoardMode]:
    """The board's modes that nvpmodel can switch to from ``mode_id`` and back without a reboot.

    nvpmodel refuses to change the GPU's TPC power-gating mask once a GPU
    context exists since boot (it warns "Reboot required for changing to this
    power mode" and asks on stdin); jetson-stats refuses such a switch before
    calling nvpmodel (jtop/core/nvpmodel.py: "has a different mask ..., is not
    compatible"). A mode whose conf sets no mask, on a conf that gates no TPCs,
    is always reachable.
    """
    current = next((m for m in board.modes if m.id == mode_id), None)
    if current is None:
        return list(board.modes)
    return [m for m in board.modes if m.tpc_pg_mask == current.tpc_pg_mask]


def board_space(
    base: SearchSpace,
    board: Board,
    runtime: str | None = None,
    current_mode: int | None = None,
    named: tuple[int, ...] = (),
) -> tuple[SearchSpace, str | None]:
    """The search space of this board for a runtime: its own tables and modes; the YAML fills in the rest.

    Knobs for another runtime are left out (the DLA knobs and the TensorRT
    precision stay only with ``runtime="tensorrt"``), and the DLA knobs only
    stay where the board has DLAs. With ``current_mode`` (the mode the board is
    in) the mode knob starts there and offers only the modes of the same TPC
    mask (:func:`same_mask`) plus the ids in ``named`` (modes the user asked for
    by name); without it, every mode, starting at the conf's default. Returns
    the space and, where the board disagrees with the committed YAML, one line
    saying so (the board's values are used).
    """
    base = for_runtime(base, runtime, dlas=bool(board.dla_caps))
    knobs = dict(base.knobs)
    differs: list[str] = []
    tables: dict[str, list[int | float]] = {
        "gpu_mhz": [mhz(f, 1e6) for f in board.gpu_hz],
        "cpu_mhz": [mhz(f, 1e3) for f in board.cpu_khz],
        "emc_mhz": [mhz(f, 1e6) for f in board.emc_hz],
    }
    for name, table in tables.items():
        if name not in knobs or not table:
            continue
        if [float(v) for v in knobs[name].values] != [float(v) for v in table]:
            differs.append(f"{name} {_span(table)} (file: {_span(knobs[name].values)})")
        knobs[name] = _knob(knobs[name], table)
    if "emc_mhz" in knobs and board.emc_rate is None:
        pinned = tables["emc_mhz"][-1] if tables["emc_mhz"] else knobs["emc_mhz"].default
        knobs["emc_mhz"] = _knob(knobs["emc_mhz"], [pinned])
    if "cpu_cores" in knobs:
        cores = sorted({int(v) for v in knobs["cpu_cores"].values if int(v) <= board.cpus} | {board.cpus})
        knobs["cpu_cores"] = _knob(knobs["cpu_cores"], cores)
    modes = dict(base.modes)
    mode_knob = base.mode_knob
    if board.modes and mode_knob is not None:
        every = {mode_label(m.name): _space_mode(m, board, tables, knobs) for m in board.modes}
        file_caps = {n: (m.id, m.caps) for n, m in base.modes.items()}
        board_caps = {n: (m.id, m.caps) for n, m in every.items()}
        if file_caps != board_caps:
            differs.append(f"nvpmodel modes {', '.join(every)} (file: {', '.join(base.modes)})")
        start = board.default_mode if current_mode is None else current_mode
        offered = {m.id for m in (board.modes if current_mode is None else same_mask(board, current_mode))}
        offered |= set(named)
        modes = {name: mode for name, mode in every.items() if mode.id in offered}
        names = list(modes)
        default = next((m.name for m in board.modes if m.id == start and m.id in offered), board.modes[0].name)
        knobs[mode_knob] = Knob(**{**knobs[mode_knob].model_dump(), "values": names, "default": mode_label(default)})
    note = None
    if differs:
        note = f"the board's tables differ from search_spaces/{base.kind}.yaml, using the board's: " + "; ".join(
            differs
        )
    space = base.model_copy(update={"knobs": knobs, "modes": modes})
    return SearchSpace.model_validate(space.model_dump()), note


def _span(values: list[Any]) -> str:
    return f"{values[0]}..{values[-1]} ({len(values)} values)" if len(values) > 1 else str(values[0])


def _knob(knob: Knob, values: list[Any]) -> Knob:
    default = knob.default if any(float(knob.default) == float(v) for v in values) else max(values)
    default = next((v for v in values if float(v) == float(default)), default)
    return Knob(**{**knob.model_dump(), "values": values, "default": default})


def _space_mode(mode: BoardMode, board: Board, tables: dict[str, list[int | float]], knobs: dict[str, Knob]) -> Mode:
    caps: dict[str, float] = {}
    if mode.cores:
        caps["cpu_cores"] = mode.cores
    top = {name: max(t) for name, t in tables.items() if t}
    if mode.cpu_max_khz is not None:
        caps["cpu_mhz"] = mode.cpu_max_khz / 1e3
    elif "cpu_mhz" in top:
        caps["cpu_mhz"] = float(top["cpu_mhz"])
    if mode.gpu_max_hz is not None:
        caps["gpu_mhz"] = mode.gpu_max_hz / 1e6
    elif "gpu_mhz" in top:
        caps["gpu_mhz"] = float(top["gpu_mhz"])
    if mode.emc_max_hz is not None:
        caps["emc_mhz"] = mode.emc_max_hz / 1e6
    elif "emc_mhz" in top:
        caps["emc_mhz"] = float(top["emc_mhz"])
    if "dla_mhz" in knobs:
        caps["dla_mhz"] = mode.dla_max_hz / 1e6 if mode.dla_max_hz is not None else float(max(knobs["dla_mhz"].values))
    properties = {"tpc_pg_mask": float(mode.tpc_pg_mask)} if mode.tpc_pg_mask is not None else {}
    return Mode(id=mode.id, caps=caps, properties=properties)
