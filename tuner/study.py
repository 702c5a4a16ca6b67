"""One tuning study end to end: open or resume it, run trials, record every metric.

A study is keyed by model, device, scenario and latency bound, so running the
same command again resumes it and adds trials. A trial suggests a
configuration, reduces it to what the hardware will really run, reuses an
earlier measurement of that effective configuration if there is one, and
otherwise applies it and measures a window. Energy per query is the objective;
the latency bound is an Optuna constraint (<= 0 is feasible).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import socket
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import optuna
from pydantic import BaseModel, ConfigDict, Field

from tuner.devices.base import Device, WindowSettings
from tuner.devices.journal import hardware_session
from tuner.errors import UserError
from tuner.measurement import Measurement
from tuner.sampling import DEFAULT_SAMPLER, make_sampler
from tuner.space import Config, SearchSpace
from tuner.storage import DEFAULT_HEARTBEAT_S, QuotaStudy, StudyFull, open_storage, redact, storage_errors, storage_lock
from tuner.units import format_ms

METRIC_KEYS = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w", "energy_j", "queries", "duration_s")
NOISE_Z = 1.645
NOISE_FLOOR = 0.01
SINGLE_WINDOW_MARGIN = math.sqrt(2) / math.sqrt(1 + 1 / 3)


class MeasurementRejected(Exception):
    """A trial whose number must not be trusted (invalid window, throttling, failed apply)."""


class RunOptions(BaseModel):
    """Everything ``tune run`` needs; the CLI only fills this in."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_latency_ms: float
    trials: int = 40
    timeout_s: float | None = None
    seed: int | None = None
    batch_sizes: list[int] | None = None
    knobs: list[str] | None = None
    sampler: str = DEFAULT_SAMPLER
    storage: str | None = None
    study_trials: int | None = None
    worker_id: str | None = None
    heartbeat_s: int = DEFAULT_HEARTBEAT_S
    out: Path = Path("studies")
    window: WindowSettings = Field(default_factory=WindowSettings)


def default_storage(out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / 'tune.db').as_posix()}"


def study_name(model: str, device: Device, scenario: str, bound_ms: float) -> str:
    return f"{model}|{device.slug}|{scenario}|{format_ms(bound_ms)}"


def narrowed_space(device: Device, knobs: list[str] | None, batch_sizes: list[int] | None) -> SearchSpace:
    space = device.space().narrow(knobs=knobs, batch_sizes=batch_sizes)
    if not space.tuned_knobs and len(space.batch_sizes) < 2:
        raise UserError(
            "the narrowed space is empty (a single configuration): use tune measure, or widen --knobs/--batch-sizes"
        )
    return space


MEMORY_STORAGE = ":memory:"


def open_study(
    name: str, storage: str, sampler: optuna.samplers.BaseSampler | None = None, heartbeat_s: int | None = None
) -> optuna.Study:
    """Create or resume a study; a bad storage URL is a user error, not a traceback.

    Runs pass ``heartbeat_s`` so a worker that dies mid-trial has that trial
    failed and retried (see tuner.storage); readers leave it out. ``:memory:``
    keeps the study in process memory (benchmarks run thousands of short
    studies through the same loop users get, without a database each).
    """
    optuna.logging.set_verbosity(logging.ERROR)
    with storage_errors(storage):
        return optuna.create_study(
            study_name=name,
            storage=None if storage == MEMORY_STORAGE else open_storage(storage, heartbeat_s),
            sampler=sampler,
            direction="minimize",
            load_if_exists=True,
        )


def trial_seed(seed: int | None, number: int) -> int | None:
    """Per-trial measurement seed: reproducible runs, but a fresh noise draw per trial."""
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{number}".encode())


def record_measurement(trial: optuna.Trial, m: Measurement) -> None:
    for key in METRIC_KEYS:
        trial.set_user_attr(key, getattr(m, key))
    trial.set_user_attr("meter", m.meter)
    trial.set_user_attr("rails", m.rails)
    trial.set_user_attr("twin", m.twin)
    trial.set_user_attr("throttled", m.throttled)
    if m.temps_c:
        trial.set_user_attr("temps_c", m.temps_c)
    if m.extra:
        trial.set_user_attr("extra", m.extra)


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
        trial.set_user_attr("config", config.knobs)
        trial.set_user_attr("batch_size", config.batch_size)
        trial.set_user_attr("effective", effective.knobs)
        trial.set_user_attr("effective_key", key)
        trial.set_user_attr("device", self.device.name)
        trial.set_user_attr("device_kind", self.device.kind)
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("latency_key", f"{self.options.window.percentile}_ms")
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
            folder = (
                self.options.out
                / self.device.slug
                / Path(self.options.model).stem
                / "loadgen"
                / f"trial-{trial.number:04d}"
            )
            update["log_dir"] = str(folder)
            trial.set_user_attr("loadgen_logs", str(folder))
        settings = self.options.window.model_copy(update=update)
        try:
            self.device.apply(effective)
            measurement = self.device.measure(self.options.model, effective, settings)
        except MeasurementRejected as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        if not measurement.valid:
            trial.set_user_attr("fail_reason", measurement.reason or "measurement not trustworthy")
            record_measurement(trial, measurement)
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
        record_measurement(trial, measurement)
        mean = {k: sum(float(w[k]) for w in windows) / len(windows) for k in METRIC_KEYS}
        for k, v in mean.items():
            trial.set_user_attr(k, v)
        trial.set_user_attr("raw", raw)
        trial.set_user_attr("measurements", len(windows))
        lat_key = f"{self.options.window.percentile}_ms"
        lats = [float(w[lat_key]) for w in windows]
        spread = max(self._pooled_spread(lat_key, key, lats), NOISE_FLOOR)
        margin = NOISE_Z * spread * math.sqrt(1 + 1 / len(lats))
        trial.set_user_attr("latency_margin", margin)
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
                squares += _rel_std(values) ** 2 * (len(values) - 1)
                dof += len(values) - 1
        return math.sqrt(squares / dof) if dof else 0.0

    def _reuse(self, trial: optuna.Trial, source: int) -> float:
        """Copy an earlier trial's measurement of the same effective configuration."""
        earlier = self.study.get_trials(deepcopy=False)[source]
        for key, value in earlier.user_attrs.items():
            if key in METRIC_KEYS or key in ("meter", "rails", "twin", "throttled", "temps_c", "extra"):
                trial.set_user_attr(key, value)
        trial.set_user_attr("reused_from", source)
        for key, value in earlier.constraints.items():
            trial.set_constraint(key, value)
        return float(earlier.value)


REPEATS_BEFORE_EXPLORING = 2


class Explorer:
    """Breaks a sampler's loop of re-proposing measured configurations.

    Model-based samplers on a small discrete space keep suggesting the
    incumbent; each repeat is free (the measurement is reused) but teaches
    nothing. After a few repeats in a row the next trial is an unmeasured
    configuration drawn at random, so every trial budget buys new points. Not
    in a fleet with a study quota: a queued trial in shared storage would be
    left waiting when the quota ends the study.
    """

    def __init__(self, space: SearchSpace, objective: Objective, seed: int | None) -> None:
        self.space = space
        self.objective = objective
        self.rng = random.Random(seed)
        self._grid: list[Config] | None = None

    def enqueue_unmeasured(self, study: optuna.Study) -> bool:
        """Queue a random unmeasured configuration; False when every one has been measured."""
        if self._grid is None:
            self._grid = self.space.grid()
        left = [c for c in self._grid if json.dumps(c.key()) not in self.objective.cache]
        if not left:
            return False
        why = "the sampler re-proposed measured configurations: a random unmeasured one"
        study.enqueue_trial(
            self.space.params_for(self.rng.choice(left)),
            user_attrs={"proposed_by": "explorer", "why": why},
            skip_if_exists=False,
        )
        return True


class RunSummary(BaseModel):
    """What a run reports back: the study, how many trials ran, and the best feasible trial."""

    study: str
    storage: str
    measured: int
    total_trials: int
    best_trial: int | None
    best: dict | None


def run_study(
    device: Device,
    options: RunOptions,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None] | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> tuple[optuna.Study, RunSummary]:
    """Run ``options.trials`` measured trials (reused ones are free), holding the device safely.

    The loop ends when the requested number of configurations has been
    measured, the timeout passes, every configuration has been measured, or
    too many trials failed to measure. With ``options.study_trials`` it also
    ends once the study (every worker together) holds that many completed
    trials, and never starts one beyond.
    """
    space = narrowed_space(device, options.knobs, options.batch_sizes)
    storage = options.storage or default_storage(options.out)
    name = study_name(options.model, device, options.window.scenario, options.max_latency_ms)
    sampler = sampler or make_sampler(options.sampler, options.seed)
    if hasattr(sampler, "bind"):
        sampler.bind(space, options.model, options.max_latency_ms, options.window.percentile, device=device)
    deadline = None if options.timeout_s is None else time.monotonic() + options.timeout_s
    with storage_errors(storage), storage_lock(storage, name):
        study = open_study(name, storage, sampler, options.heartbeat_s)
        _stamp(study, device, options, space)
    if options.study_trials is not None:
        poll_s = min(2.0, options.heartbeat_s / 2)
        study = QuotaStudy(study, storage, options.study_trials, deadline, poll_s)
    objective = Objective(device, space, options, study)
    distinct = space.size()
    target = min(options.trials, max(distinct - len(objective.cache), 0))
    top, repeats = getattr(sampler, "remeasure", (0, 0))
    if target < 4 * top * repeats:
        top = 0
    target -= top * repeats
    state = {"reused_in_row": 0, "failed": 0}
    explorer = Explorer(space, objective, options.seed)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        state["reused_in_row"] = state["reused_in_row"] + 1 if "reused_from" in trial.user_attrs else 0
        state["failed"] += trial.state == optuna.trial.TrialState.FAIL
        if on_trial is not None:
            on_trial(study, trial, objective.measured)
        exhausted = False
        if state["reused_in_row"] >= REPEATS_BEFORE_EXPLORING and options.study_trials is None:
            exhausted = not explorer.enqueue_unmeasured(study)
        if objective.measured >= target or exhausted or state["failed"] >= max(10, target):
            study.stop()

    if target > 0:
        with hardware_session(device):
            _optimize(study, objective, callback, deadline)
            if top:
                remeasure_top(study, objective, space, top, repeats, on_trial)
    best = best_feasible(study)
    summary = RunSummary(
        study=name,
        storage=redact(storage),
        measured=objective.measured,
        total_trials=len(study.trials),
        best_trial=best.number if best else None,
        best=trial_record(best) if best else None,
    )
    return study, summary


def remeasure_top(
    study: optuna.Study,
    objective: Objective,
    space: SearchSpace,
    top: int,
    repeats: int,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None] | None = None,
) -> None:
    """Re-measure the best feasible configurations, best first, ``repeats`` more windows each.

    A candidate whose mean (with its noise margin) misses the bound does not
    count: the next one is re-measured instead, until ``top`` candidates
    passed or ``top x repeats`` windows are spent.
    """
    ranked = sorted(_representatives(study), key=lambda t: (t.value, t.number))
    budget, passed = top * repeats, 0
    callbacks = [] if on_trial is None else [lambda s, tr: on_trial(s, tr, objective.measured)]
    for t in [t for t in ranked if is_feasible(t)]:
        if budget < repeats or passed >= top:
            break
        config = Config(knobs=t.user_attrs["config"], batch_size=t.user_attrs["batch_size"])
        for _ in range(repeats):
            why = f"re-measure of trial {t.number}: the best is judged on a mean, not one window"
            attrs = {"repeat_of": t.number, "proposed_by": "remeasure", "why": why}
            study.enqueue_trial(space.params_for(config), user_attrs=attrs, skip_if_exists=False)
        study.optimize(
            objective, n_trials=repeats, callbacks=callbacks, catch=(MeasurementRejected,), gc_after_trial=False
        )
        budget -= repeats
        last = study.get_trials(deepcopy=False)[-1]
        passed += last.state == optuna.trial.TrialState.COMPLETE and is_feasible(last)


def _rel_std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / mean


def _optimize(study: optuna.Study, objective: Objective, callback: Callable, deadline: float | None) -> None:
    """Optuna's loop, ended quietly when the study quota is full.

    If this worker stalled for longer than the heartbeat grace period (a
    suspended laptop, a frozen board), another worker has failed its running
    trial and queued a retry; Optuna then refuses to record the result. That
    trial is lost to this worker but not to the study, so the loop goes on.
    """
    while deadline is None or time.monotonic() < deadline:
        try:
            study.optimize(
                objective,
                n_trials=None,
                timeout=None if deadline is None else deadline - time.monotonic(),
                callbacks=[callback],
                catch=(MeasurementRejected,),
                gc_after_trial=False,
            )
            return
        except StudyFull:
            return
        except ValueError as exc:
            if not str(exc).startswith("Cannot tell a"):
                raise


def _stamp(study: optuna.Study, device: Device, options: RunOptions, space: SearchSpace) -> None:
    """Study-level attributes so results and exports can say what was tuned, and how."""
    study.set_user_attr("model", options.model)
    study.set_user_attr("device", device.name)
    study.set_user_attr("device_kind", device.kind)
    study.set_user_attr("device_slug", device.slug)
    study.set_user_attr("twin", device.simulated)
    study.set_user_attr("max_latency_ms", options.max_latency_ms)
    study.set_user_attr("percentile", options.window.percentile)
    study.set_user_attr("scenario", options.window.scenario)
    study.set_user_attr("tuned_knobs", space.tuned_knobs)
    if options.study_trials is not None:
        study.set_user_attr("study_trials", options.study_trials)


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return bool(trial.constraints) and all(v <= 0 for v in trial.constraints.values())


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The completed feasible trial with the lowest energy per query (ties: earliest).

    A configuration measured more than once is judged on its latest
    re-measurement trial, which carries the mean of all its windows; once any
    configuration was re-measured, only re-measured ones are candidates (if
    one of them is feasible), so a single lucky window cannot win.
    """
    return best_of(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def best_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """best_feasible over a list of completed trials (a study, or the first n trials of one)."""
    done = [t for t in representatives(trials) if t.value is not None and math.isfinite(t.value) and is_feasible(t)]
    repeats = [t for t in representatives(trials) if "repeat_of" in t.user_attrs]
    if repeats:
        passed = [t for t in done if "repeat_of" in t.user_attrs]
        if passed:
            done = passed
        else:
            margin = max(t.user_attrs.get("latency_margin", 0.0) for t in repeats) * SINGLE_WINDOW_MARGIN
            done = [t for t in done if _meets_with_margin(t, margin)]
    return min(done, key=lambda t: (t.value, t.number)) if done else None


def _meets_with_margin(trial: optuna.trial.FrozenTrial, margin: float) -> bool:
    """A single-window trial whose latency, raised by the noise margin, still meets the bound."""
    latency = trial.user_attrs.get(trial.user_attrs.get("latency_key", "p99_ms"))
    slack = trial.constraints.get("latency")
    if latency is None or slack is None:
        return False
    return slack + latency * margin <= 0


def representatives(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """One trial per effective configuration where it was re-measured (the latest repeat); others unchanged."""
    latest: dict[str, optuna.trial.FrozenTrial] = {}
    for t in trials:
        if "repeat_of" in t.user_attrs:
            key = t.user_attrs.get("effective_key")
            if key not in latest or t.number > latest[key].number:
                latest[key] = t
    return [
        t
        for t in trials
        if t.user_attrs.get("effective_key") not in latest or latest[t.user_attrs.get("effective_key")] is t
    ]


def _representatives(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return [t for t in representatives(done) if t.value is not None and math.isfinite(t.value)]


def trial_record(trial: optuna.trial.FrozenTrial) -> dict:
    """A flat, JSON-ready view of a trial: configuration, metrics and feasibility."""
    attrs = trial.user_attrs
    record = {
        "trial": trial.number,
        "batch_size": attrs.get("batch_size"),
        "config": attrs.get("effective", attrs.get("config", {})),
        "feasible": is_feasible(trial),
        "twin": attrs.get("twin", False),
        "meter": attrs.get("meter"),
        "device": attrs.get("device"),
        "host": attrs.get("host"),
        "worker": attrs.get("worker"),
    }
    for key in METRIC_KEYS:
        record[key] = attrs.get(key)
    return record
