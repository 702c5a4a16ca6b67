"""Applying a configuration in the kernel's order, and reading every value back (see :mod:`.device`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.devices.jetson import sysfs
from tuner.devices.jetson.errors import ApplyError
from tuner.devices.jetson.masks import TpcMaskRule
from tuner.devices.jetson.spaces import board_space
from tuner.devices.jetson.thermal import ThermalGuard, thermal_caps
from tuner.devices.jetson.writes import Write, _floor, _pair, _try_int, _try_read
from tuner.errors import UserError
from tuner.space import Config


class ConfigApplier(TpcMaskRule, ThermalGuard):
    """Plans, writes and verifies a configuration's values (part of JetsonDevice)."""

    last_switch_s: float | None
    _asked: dict[str, Any]
    _writable: Callable[[Path], bool]

    def _online_now(self) -> set[int]:
        return {0} | {cpu for cpu, path in self.board.online.items() if sysfs.read(path) == "1"}

    def targets(self, config: Config) -> dict[str, Any]:
        """What a configuration asks of the board after the mode's caps: mode id, cores, kHz, Hz."""
        space = self._space
        mode_knob = space.mode_knob
        outside = mode_knob is not None and config.knobs.get(mode_knob) not in space.knobs[mode_knob].values
        if set(config.knobs) - set(space.knobs):
            # A configuration a TensorRT study exported (DLA knobs) applied by a command that runs no model.
            space, _ = board_space(self._base_space, self.board, "tensorrt")
        elif outside:
            # A mode of another TPC mask: check_reachable refuses it before any write unless the user named it.
            space, _ = board_space(self._base_space, self.board, self._space_runtime)
        space.validate_config(config)
        mode = space.mode_of(config)
        assert mode is not None
        eff = space.effective(config).knobs
        b = self.board
        out: dict[str, Any] = {"mode": mode.id}
        if "cpu_cores" in eff:
            out["cores"] = int(eff["cpu_cores"])
        if "cpu_mhz" in eff:
            out["cpu_khz"] = _floor(b.cpu_khz, round(float(eff["cpu_mhz"]) * 1000))
        if "gpu_mhz" in eff:
            out["gpu_hz"] = _floor(b.gpu_hz, round(float(eff["gpu_mhz"]) * 1e6))
        if "emc_mhz" in eff and b.emc_rate is not None:
            want = round(float(eff["emc_mhz"]) * 1e6)
            out["emc_hz"] = _floor(b.emc_hz, want) if b.emc_hz else want
        if "dla_mhz" in eff and b.dla_caps:
            out["dla_hz"] = round(float(eff["dla_mhz"]) * 1e6)
        return out

    def plan_writes(self, config: Config) -> list[Write]:
        """Every step apply() would take from the current state, in order (for ``--dry-run``).

        Steps already in effect are left out, which is what makes apply()
        idempotent; after a mode change every later step is listed, since
        nvpmodel resets the clocks.
        """
        t = self.targets(config)
        self.check_reachable(t["mode"])
        return self._plan(t, mode_change=self.query_mode() != t["mode"])

    def _plan(self, t: dict[str, Any], mode_change: bool) -> list[Write]:
        current = self._current(assume_mode=t["mode"] if mode_change else None)
        return self._steps(t, current, include_all=mode_change)

    def apply(self, config: Config) -> None:
        """Apply in the fixed order and read every value back; ApplyError if the board refused.

        ``last_switch_s`` is how long it took, from the mode check to the last
        value read back: seconds when nvpmodel changes the mode, milliseconds
        for clock writes alone (a trial's setup includes it).
        """
        started = time.monotonic()
        self.last_switch_s = None
        self._asked = {}
        t = self.targets(config)
        self.check_reachable(t["mode"])
        self.check_thermal()
        mode_change = self.query_mode() != t["mode"]
        planned = self._plan(t, mode_change)
        self.check_privilege([Path(w.path) for w in planned if not w.value.startswith("-m ")])
        if mode_change:
            self.set_mode(t["mode"])
        # Re-plan against the board as it is after the mode change: min/max order depends on it.
        for step in self._steps(t, self._current(), include_all=False):
            self._write(Path(step.path), step.value)
        self._verify(t)
        self._asked = t
        self.last_switch_s = time.monotonic() - started

    def _current(self, assume_mode: int | None = None) -> dict[str, Any]:
        """Current values; with ``assume_mode``, what nvpmodel will leave after switching to it."""
        b = self.board
        cur: dict[str, Any] = {
            "online": {cpu: sysfs.read(p) for cpu, p in b.online.items()},
            "cpu": {p.cpu: (_try_int(p.min_path), _try_int(p.max_path)) for p in b.policies},
            "gpu": (int(sysfs.read(b.gpu / "min_freq")), int(sysfs.read(b.gpu / "max_freq"))),
            "emc": (sysfs.read(b.emc_locked), int(sysfs.read(b.emc_rate)))
            if b.emc_rate is not None and b.emc_locked is not None
            else None,
            "dla": [_try_int(p) for p in b.dla_caps],
        }
        if assume_mode is not None:
            every, _ = board_space(self._base_space, self.board, "tensorrt")
            mode = next(m for m in every.modes.values() if m.id == assume_mode)
            cpu_cap = round(mode.caps.get("cpu_mhz", 1e9) * 1000)
            gpu_cap = _floor(b.gpu_hz, round(mode.caps.get("gpu_mhz", 1e9) * 1e6))
            cur["cpu"] = {
                c: (lo, _floor(next(p.available_khz for p in b.policies if p.cpu == c), cpu_cap))
                for c, (lo, _hi) in cur["cpu"].items()
            }
            cur["gpu"] = (min(b.gpu_hz), gpu_cap)
            if "dla_mhz" in mode.caps:
                cur["dla"] = [round(mode.caps["dla_mhz"] * 1e6)] * len(b.dla_caps)
        return cur

    def _steps(self, t: dict[str, Any], cur: dict[str, Any], include_all: bool) -> list[Write]:
        b = self.board
        steps: list[Write] = []
        if include_all:
            steps.append(Write(self.nvpmodel, f"-m {t['mode']}"))
        online_after: set[int] = {0}
        if "cores" in t:
            for cpu, path in b.online.items():
                want = "1" if cpu < t["cores"] else "0"
                if want == "1":
                    online_after.add(cpu)
                if include_all or cur["online"][cpu] != want:
                    steps.append(Write(str(path), want))
        else:
            online_after.update(c for c, v in cur["online"].items() if v == "1")
        if "cpu_khz" in t:
            for p in b.policies:
                if not online_after.intersection(p.cpus):
                    continue  # the kernel refuses the limits of a cluster with every core offline
                steps += _pair(p.min_path, p.max_path, t["cpu_khz"], cur["cpu"][p.cpu], include_all)
        if "gpu_hz" in t:
            steps += _pair(b.gpu / "min_freq", b.gpu / "max_freq", t["gpu_hz"], cur["gpu"], include_all)
        if "emc_hz" in t and b.emc_rate is not None and b.emc_locked is not None:
            locked, rate = cur["emc"]
            if include_all or locked != "1":
                steps.append(Write(str(b.emc_locked), "1"))
            if include_all or rate != t["emc_hz"]:
                steps.append(Write(str(b.emc_rate), str(t["emc_hz"])))
        if "dla_hz" in t:
            for path, now in zip(b.dla_caps, cur["dla"], strict=True):
                if include_all or now != t["dla_hz"]:
                    steps.append(Write(str(path), str(t["dla_hz"])))
        return steps

    def _verify(self, t: dict[str, Any]) -> None:
        b = self.board
        wrong: list[str] = []
        if self.query_mode() != t["mode"]:
            wrong.append(f"nvpmodel mode {self.query_mode()} (wanted {t['mode']})")
        online = self._online_now()
        if "cores" in t:
            for cpu, path in b.online.items():
                want = "1" if cpu < t["cores"] else "0"
                if sysfs.read(path) != want:
                    wrong.append(f"cpu{cpu}/online={sysfs.read(path)} (wanted {want})")
        if "cpu_khz" in t:
            for p in b.policies:
                if online.intersection(p.cpus):
                    for path in (p.min_path, p.max_path):
                        if _try_int(path) != t["cpu_khz"]:
                            wrong.append(f"{path}={_try_int(path)} (wanted {t['cpu_khz']})")
        if "gpu_hz" in t:
            for path in (b.gpu / "min_freq", b.gpu / "max_freq"):
                if int(sysfs.read(path)) != t["gpu_hz"]:
                    wrong.append(f"{path}={sysfs.read(path)} (wanted {t['gpu_hz']})")
        if "emc_hz" in t and b.emc_rate is not None and int(sysfs.read(b.emc_rate)) != t["emc_hz"]:
            wrong.append(f"{b.emc_rate}={sysfs.read(b.emc_rate)} (wanted {t['emc_hz']})")
        if "dla_hz" in t:
            for path in b.dla_caps:
                if _try_int(path) != t["dla_hz"]:
                    wrong.append(f"{path}={_try_read(path)} (wanted {t['dla_hz']})")
        if wrong:
            capped = thermal_caps(self.root)
            cause = f" (a thermal cap is in force: {'; '.join(capped)})" if capped else ""
            raise ApplyError("the board did not take the configuration: " + "; ".join(wrong) + cause)

    def _write(self, path: Path, value: str) -> None:
        try:
            sysfs.write(self.root, path, value)
        except sysfs.BoardWriteError as exc:
            raise ApplyError(f"writing {value} to {path} failed: {exc.strerror} ({exc.rule})") from None

    def check_privilege(self, paths: list[Path]) -> None:
        """Refuse before the first write if a file is not writable, naming the privilege needed."""
        denied = [p for p in paths if not self._writable(p)]
        if denied:
            raise UserError(
                f"cannot write {denied[0]}"
                f"{f' and {len(denied) - 1} more' if len(denied) > 1 else ''}: "
                "changing Jetson clocks needs root; run the command with sudo (nothing was changed)"
            )
