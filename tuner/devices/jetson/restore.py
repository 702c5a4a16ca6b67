"""Checking a journaled Jetson state against the board before a single value is written back.

A journal is a file on disk: it may be old, hand-edited or hostile. Every value
in it is checked against what this board itself reports (its mode ids, its CPU
numbers, its frequency ranges, its governors) and only file paths found by
discovery are ever written; a journal names values, never paths. A key that is
missing or wrong is reported and the rest of the restore goes on, so one bad
entry does not leave the board half-way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.devices.jetson.board import Board
from tuner.devices.jetson.sysfs import is_file, read

STATE_VERSIONS = (1,)
_NAME = re.compile(r"^[A-Za-z0-9_]{1,32}$")


@dataclass
class PolicyState:
    """Saved limits of one CPU cluster (None where the journal had nothing usable)."""

    cpu: int
    min_khz: int | None
    max_khz: int | None
    governor: str | None


@dataclass
class Plan:
    """What a restore will write, every value checked; ``problems`` lists what was refused."""

    mode: int | None = None
    online: dict[int, str] = field(default_factory=dict)
    policies: list[PolicyState] = field(default_factory=list)
    gpu_min: int | None = None
    gpu_max: int | None = None
    gpu_governor: str | None = None
    railgate: str | None = None
    emc_rate: int | None = None
    emc_locked: str | None = None
    dla: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _in_range(value: Any, table: list[int], what: str, problems: list[str], slack: int = 0) -> int | None:
    """An integer within the table's range (caps such as 612 MHz sit between table steps)."""
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        problems.append(f"{what}={value!r} is not a number")
        return None
    if table and not (min(table) - slack <= number <= max(table) + slack):
        problems.append(f"{what}={number} is outside the board's range {min(table)}..{max(table)}")
        return None
    return number


def _flag(value: Any, what: str, problems: list[str]) -> str | None:
    if str(value) in ("0", "1"):
        return str(value)
    problems.append(f"{what}={value!r} is not 0 or 1")
    return None


def _governor(value: Any, available: Path, what: str, problems: list[str]) -> str | None:
    text = str(value)
    allowed = read(available).split() if is_file(available) else None
    if not _NAME.match(text) or (allowed is not None and text not in allowed):
        problems.append(f"{what}={value!r} is not a governor this board offers")
        return None
    return text


def plan_restore(state: Any, board: Board, mode_ids: list[int], kind: str, dla_hz: list[int] | None = None) -> Plan:
    """Turn a journaled state into a checked plan; nothing here touches the board.

    ``dla_hz`` is the range a DLA clock cap may be put back to (the space's
    DLA clocks and the modes' caps); a journal from before the DLA knobs has
    no ``dla`` entry and restores without one.
    """
    plan = Plan()
    problems = plan.problems
    if not isinstance(state, dict):
        problems.append("the saved state is not a mapping")
        return plan
    if state.get("kind", kind) != kind:
        problems.append(f"the saved state is of a {state.get('kind')!r} board, not this {kind}: nothing restored")
        return plan
    if state.get("version") not in STATE_VERSIONS:
        problems.append(f"saved state version {state.get('version')!r} is not one of {STATE_VERSIONS}")
        return plan
    mode = state.get("nvpmodel_id")
    if isinstance(mode, int) and not isinstance(mode, bool) and mode in mode_ids:
        plan.mode = mode
    else:
        problems.append(f"nvpmodel_id={mode!r} is not a mode of this board ({', '.join(map(str, mode_ids))})")

    online = state.get("online")
    if isinstance(online, dict):
        for cpu, value in online.items():
            if not str(cpu).isdigit() or int(cpu) not in board.online:
                problems.append(f"online: cpu{cpu} is not a CPU of this board that can go offline")
                continue
            flag = _flag(value, f"cpu{cpu}/online", problems)
            if flag is not None:
                plan.online[int(cpu)] = flag
    else:
        problems.append("online: missing or not a mapping")

    cpufreq = state.get("cpufreq")
    if isinstance(cpufreq, dict):
        policies = {str(p.cpu): p for p in board.policies}
        for cpu, saved in cpufreq.items():
            policy = policies.get(str(cpu))
            if policy is None or not isinstance(saved, dict):
                problems.append(f"cpufreq: policy{cpu} is not a CPU cluster of this board")
                continue
            what = f"policy{cpu}"
            plan.policies.append(
                PolicyState(
                    policy.cpu,
                    _in_range(saved.get("min"), policy.available_khz, f"{what}/scaling_min_freq", problems),
                    _in_range(saved.get("max"), policy.available_khz, f"{what}/scaling_max_freq", problems),
                    _governor(
                        saved["governor"],
                        policy.folder / "scaling_available_governors",
                        f"{what}/scaling_governor",
                        problems,
                    )
                    if "governor" in saved
                    else None,
                )
            )
    else:
        problems.append("cpufreq: missing or not a mapping")

    gpu = state.get("gpu")
    if isinstance(gpu, dict):
        plan.gpu_min = _in_range(gpu.get("min"), board.gpu_hz, "gpu min_freq", problems)
        plan.gpu_max = _in_range(gpu.get("max"), board.gpu_hz, "gpu max_freq", problems)
        if "governor" in gpu:
            plan.gpu_governor = _governor(gpu["governor"], board.gpu / "available_governors", "gpu governor", problems)
        if "railgate_enable" in gpu:
            plan.railgate = _flag(gpu["railgate_enable"], "railgate_enable", problems)
    else:
        problems.append("gpu: missing or not a mapping")

    emc = state.get("emc", {})
    if isinstance(emc, dict) and "rate" in emc:
        plan.emc_rate = _in_range(emc.get("rate"), board.emc_hz, "emc rate", problems)
        plan.emc_locked = _flag(emc.get("locked"), "emc mrq_rate_locked", problems)
    elif not isinstance(emc, dict):
        problems.append("emc: not a mapping")

    dla = state.get("dla", {})
    if isinstance(dla, dict):
        for core, value in dla.items():
            if not str(core).isdigit() or int(core) >= len(board.dla_caps):
                problems.append(f"dla: core {core} is not a DLA of this board")
                continue
            hz = _in_range(value, dla_hz or [], f"dla{core}_core clk_cap", problems)
            if hz is not None and not dla_hz:
                problems.append(f"dla{core}_core clk_cap: this board's space names no DLA clock to check it against")
            elif hz is not None:
                plan.dla[int(core)] = hz
    else:
        problems.append("dla: not a mapping")
    return plan
