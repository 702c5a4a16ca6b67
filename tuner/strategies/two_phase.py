"""The two-phase strategy (PolyThrottle-style): CPU knobs first, then the device knobs and batch size jointly."""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna

from tuner.space import Config, knob_roles
from tuner.strategies.base import GuidedSampler, measured_trials, trial_config


class TwoPhaseSampler(GuidedSampler):
    """PolyThrottle-style: CPU knobs first (others at their defaults), then GPU, memory and batch jointly.

    Phase one measures a spread of CPU settings at the default device knobs
    and the middle batch size and keeps the cheapest feasible one (the
    fastest if none meets the bound). Phase two pins the CPU knobs there and
    lets the GP sampler search the remaining knobs and the batch size.
    """

    def __init__(self, seed: int | None = None, phase_one: int = 6) -> None:
        super().__init__(seed)
        self.phase_one = phase_one
        self.pinned: dict[str, Any] = {}

    def _cpu_knobs(self) -> list[str]:
        roles = knob_roles(self.space)
        return [
            k for k in (roles.get("cpu_mhz"), roles.get("cpu_cores")) if k is not None and k in self.space.tuned_knobs
        ]

    def _phase_one_configs(self) -> list[Config]:
        cpu = self._cpu_knobs()
        base = self.space.default_config(self.space.batch_sizes[len(self.space.batch_sizes) // 2])
        if not cpu:
            return []
        axes = [self.space.knobs[k].values for k in cpu]
        picks = np.linspace(0, 1, self.phase_one)
        configs = []
        for j, frac in enumerate(picks):
            knobs = dict(base.knobs)
            for a, (name, values) in enumerate(zip(cpu, axes, strict=True)):
                spread = frac if a == 0 else (picks[(j * 2 + 1) % len(picks)])
                knobs[name] = values[round(spread * (len(values) - 1))]
            configs.append(self.space.effective(Config(knobs=knobs, batch_size=base.batch_size)))
        return configs

    def propose(self, study: optuna.Study) -> Config | None:
        plan = self._phase_one_configs()
        done = measured_trials(study)
        if len(done) < len(plan):
            for config in plan:
                fresh = self._fresh(study, config)
                if fresh is not None:
                    self.reason = ("two-phase:cpu", "phase one: a spread of CPU settings at the default device knobs")
                    return fresh
        if not self.pinned and plan:
            phase = done[: len(plan)]
            feasible = [t for t in phase if t.constraints and all(c <= 0 for c in t.constraints.values())]
            pick = (
                min(feasible, key=lambda t: t.value)
                if feasible
                else min(phase, key=lambda t: t.user_attrs[f"{self.percentile}_ms"])
            )
            params = self.space.params_for(trial_config(pick))
            self.pinned = {k: v for k, v in params.items() if k in self._cpu_knobs()}
        self.reason = ("", "phase two: the inner sampler searches the device knobs, CPU knobs pinned")
        return None

    def adjust(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**params, **self.pinned}
