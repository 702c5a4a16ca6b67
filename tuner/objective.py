"""One trial: suggest a configuration, reduce it to what the hardware runs, reuse or measure it.

Energy per query is the objective; the latency bound is an Optuna constraint
(<= 0 is feasible). A re-measurement trial carries the mean of every window of
its configuration and a noise margin on its constraint.
"""

from __future__ import annotations

import json
import math
import os
import socket
import zlib
from typing import Any

import optuna

from tuner import interrupts
from tuner.devices.base import Device
from tuner.measurement import Measurement
from tuner.models import model_slug
from tuner.run_options import RunOptions
from tuner.scenario import label, split
from tuner.space import Config, SearchSpace
from tuner.storage import set_user_attrs

METRIC_KEYS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w", "energy_j", "queries", "duration_s")
# What a measurement leaves on its trial besides the metrics; a reuse copies exactly these and the metrics.
ORIGIN_KEYS = ("meter", "rails", "twin", "throttled", "temps_c", "extra")
NOISE_Z = 1.645
NOISE_FLOOR = 0.01


class MeasurementRejected(Exception):
    """A trial whose number must not be trusted (invalid window, throttling, failed apply)."""


def trial_seed(seed: int | None, number: int) -> int | None:
    """Per-trial measurement seed: reproducible runs, but a fresh noise draw per trial."""
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{number}".encode())


def measurement_attrs(m: Measurement) -> dict[str, Any]:
    """The user attributes a trial carries for one measurement (empty temperatures and extras left off)."""
    attrs: dict[str, Any] = {key: getattr(m, key) for key in (*METRIC_KEYS, *ORIGIN_KEYS)}
    return {key: value for key, value in attrs.items() if value or key not in ("temps_c", "extra")}


def record_measurement(trial: optuna.Trial, m: Measurement, **more: Any) -> None:
    set_user_attrs(trial, {**measurement_attrs(m), **more})


class Objective:
    """The function Optuna calls per trial; also counts how many trials really measured."""

    def __init__(self, device: Device, space: SearchSpace, options: RunOptions, study: optuna.Study) -> None:
        self.device = device
        self.space = space
        self.options = options
        self.worker = options.worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.measured = 0
        self.cache: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            key = t.user_attrs.get("effective_key")
            if key is not None and "j_per_query" in t.user_attrs:
                self.cache.setdefault(key, t.number)
        self.study = study

    def __call__(self, trial: optuna.Trial) -> float:
        config = self.space.suggest(trial)
        effective = self.space.effective(config)
        key = json.dumps(effective.key())
        # Written before measuring, so peers and tune status see who runs what while it runs.
        identity = {
            "config": config.knobs,
            "batch_size": config.batch_size,
            "effective": effective.knobs,
            "effective_key": key,
            "device": self.device.name,
            "device_kind": self.device.kind,
            "host": socket.gethostname(),
            "worker": self.worker,
            "latency_key": f"{self.options.window.percentile}_ms",
        }
        set_user_attrs(trial, identity)
        repeat_of = trial.user_attrs.get("repeat_of")
        if key in self.cache and repeat_of is None:
            return self._reuse(trial, self.cache[key])
        measurement = self.measure(trial, effective)
        if repeat_of is not None:
            self.measured += 1
            return self._repeat(trial, key, measurement)
        record_measurement(trial, measurement)
        self.measured += 1
        self.cache[key] = trial.number
        bound = self.options.max_latency_ms
        trial.set_constraint("latency", measurement.latency_ms(self.options.window.percentile) - bound)
        return measurement.j_per_query

    def measure(self, trial: optuna.Trial, effective: Config) -> Measurement:
        update: dict = {"seed": trial_seed(self.options.seed, trial.number)}
        if not self.device.simulated:
            folder = self.options.out / self.device.slug / model_slug(self.options.model) / "loadgen"
            if self.options.window.scenario != "offline":
                folder = folder / label(self.options.window).replace("@", "-")
            folder = folder / f"trial-{trial.number:04d}"
            update["log_dir"] = str(folder)
            trial.set_user_attr("loadgen_logs", str(folder))
        hardware, serving = split(effective)
        settings = self.options.window
        settings = settings.model_copy(update={**update, "options": {**settings.options, **serving}})
        try:
            interrupts.check()
            self.device.apply(hardware)
            interrupts.check()
            measurement = self.device.measure(self.options.model, hardware, settings)
            interrupts.check()
        except MeasurementRejected as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        if not measurement.valid:
            record_measurement(trial, measurement, fail_reason=measurement.reason or "measurement not trustworthy")
            raise MeasurementRejected(measurement.reason)
        return measurement

    def _repeat(self, trial: optuna.Trial, key: str, measurement: Measurement) -> float:
        """A re-measurement: the trial carries the mean of every window of this configuration.

        Its constraint adds a noise margin (z x the relative spread of the
        latency, for one future window and the error of the mean), so a
        configuration only counts as feasible if a fresh measurement would
        also meet the bound with about 95% probability.
        """
        windows = [
            t.user_attrs.get("raw", t.user_attrs)
            for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("effective_key") == key and "reused_from" not in t.user_attrs
        ]
        raw = {k: getattr(measurement, k) for k in METRIC_KEYS}
        windows.append(raw)
        mean = {k: sum(float(w[k]) for w in windows) / len(windows) for k in METRIC_KEYS}
        lat_key = f"{self.options.window.percentile}_ms"
        lats = [float(w[lat_key]) for w in windows]
        spread = max(self._pooled_spread(lat_key, key, lats), NOISE_FLOOR)
        margin = NOISE_Z * spread * math.sqrt(1 + 1 / len(lats))
        record_measurement(trial, measurement, **mean, raw=raw, measurements=len(windows), latency_margin=margin)
        trial.set_constraint("latency", mean[lat_key] * (1 + margin) - self.options.max_latency_ms)
        return mean["j_per_query"]

    def _pooled_spread(self, lat_key: str, key: str, lats: list[float]) -> float:
        """Relative spread of the latency, pooled over every configuration measured more than once.

        Three windows of one configuration say little about the noise; the
        noise of one device and model is much the same across configurations.
        """
        groups: dict[str, list[float]] = {key: lats}
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            other = t.user_attrs.get("effective_key")
            if other != key and "reused_from" not in t.user_attrs and lat_key in t.user_attrs:
                groups.setdefault(other, []).append(float(t.user_attrs.get("raw", t.user_attrs)[lat_key]))
        squares, dof = 0.0, 0
        for values in groups.values():
            if len(values) >= 2:
                squares += rel_std(values) ** 2 * (len(values) - 1)
                dof += len(values) - 1
        return math.sqrt(squares / dof) if dof else 0.0

    def _reuse(self, trial: optuna.Trial, source: int) -> float:
        """Copy an earlier trial's measurement of the same effective configuration."""
        earlier = self.study.get_trials(deepcopy=False)[source]
        copied = {key: value for key, value in earlier.user_attrs.items() if key in (*METRIC_KEYS, *ORIGIN_KEYS)}
        set_user_attrs(trial, {**copied, "reused_from": source})
        for key, value in earlier.constraints.items():
            trial.set_constraint(key, value)
        return float(earlier.value)


def rel_std(values: list[float]) -> float:
    """Sample standard deviation relative to the mean (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean
