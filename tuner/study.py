"""One tuning study end to end: open or resume it, run trials until done, summarise.

A study is keyed by model, device, scenario and latency bound, so running the
same command again resumes it and adds trials. What one trial does lives in
tuner.objective; the study's answer (Optuna's best trial) and flat records
in tuner.records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from pydantic import BaseModel

from tuner import interrupts
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session, hold
from tuner.errors import UserError
from tuner.objective import MeasurementRejected, Objective
from tuner.provenance import provenance
from tuner.records import recommended, trial_record
from tuner.run_options import RunOptions
from tuner.sampling import make_sampler
from tuner.scenario import label, serving_space
from tuner.space import Grid, SearchSpace
from tuner.storage import QuotaStudy, StudyFull, open_storage, redact, storage_errors, storage_lock
from tuner.units import format_ms


def default_storage(out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(out / 'tune.db').as_posix()}"


def study_name(model: str, device: Device, scenario: str, bound_ms: float) -> str:
    """A study per model, device, scenario (with its rate, see tuner.scenario.label) and bound."""
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

    def enqueue_unmeasured(self, study: optuna.Study) -> bool:
        """Queue a random unmeasured configuration; False when every one has been measured."""
        grid = Grid(self.space)
        measured = {grid.position(key) for key in self.objective.cache} - {None}
        left = len(grid) - len(measured)
        if left <= 0:
            return False
        # Draw by position; once most of the grid is measured, pick among the few left instead.
        if left * 4 >= len(grid):
            pick = next(i for i in iter(lambda: self.rng.randrange(len(grid)), None) if i not in measured)
        else:
            pick = self.rng.choice([i for i in range(len(grid)) if i not in measured])
        why = "the sampler re-proposed measured configurations: a random unmeasured one"
        study.enqueue_trial(
            self.space.params_for(grid[pick]),
            user_attrs={"proposed_by": "explorer", "why": why},
            skip_if_exists=False,
        )
        return True


class RunSummary(BaseModel):
    """What a run reports back: the study, how many trials ran, and its recommended trial.

    ``previous_best`` is the recommended trial before this run (a resumed
    study), so a change of answer is said, never hidden. ``trial_seconds`` says
    where this run's trials spent their time: ``setup_s`` (apply, model load
    and preparation, warm-up), ``windows_s`` and ``search_s`` (the rest: the
    sampler, storage writes and progress between and around windows).
    """

    study: str
    storage: str
    measured: int
    total_trials: int
    best_trial: int | None
    best: dict | None
    previous_best: dict | None = None
    trial_seconds: dict[str, float] = {}


def run_study(
    device: Device,
    options: RunOptions,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None] | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    on_interrupt: Callable[[optuna.Study], None] | None = None,
) -> tuple[optuna.Study, RunSummary]:
    """Run ``options.trials`` measured trials (reused ones are free), holding the device safely.

    The loop ends when the requested number of configurations has been
    measured, the timeout passes, every configuration has been measured, or
    too many trials failed to measure. With ``options.study_trials`` it also
    ends once the study (every worker together) holds that many completed
    trials, and never starts one beyond.

    The device is locked against other tuners, and Ctrl-C and SIGTERM are
    recorded, from the start: a signal ends the run at the next safe point
    (a trial's apply or window, or between trials), never in the middle of
    Optuna's bookkeeping, so no trial is left RUNNING. The hardware is
    restored, then ``on_interrupt`` gets the study (to write the results of
    the trials that completed) and the signal is raised.
    """
    with interrupts.held(), hold(device):
        return _run_study(device, options, on_trial, sampler, on_interrupt)


def _run_study(
    device: Device,
    options: RunOptions,
    on_trial: Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None] | None,
    sampler: optuna.samplers.BaseSampler | None,
    on_interrupt: Callable[[optuna.Study], None] | None,
) -> tuple[optuna.Study, RunSummary]:
    space = serving_space(narrowed_space(device, options.knobs, options.batch_sizes), options.window)
    storage = options.storage or default_storage(options.out)
    name = study_name(options.model, device, label(options.window), options.max_latency_ms)
    sampler = sampler or make_sampler(options.sampler, options.seed)
    if hasattr(sampler, "bind"):
        sampler.bind(space, options.model, options.max_latency_ms, options.window.percentile, device=device)
    deadline = None if options.timeout_s is None else time.monotonic() + options.timeout_s
    with storage_errors(storage), storage_lock(storage, name):
        study = open_study(name, storage, sampler, options.heartbeat_s)
        check_same_space(study, space)
        _stamp(study, device, options, space)
    if options.study_trials is not None:
        study = QuotaStudy(
            study,
            storage,
            options.study_trials,
            deadline,
            poll_s=min(2.0, options.heartbeat_s / 2),
            propose=space.suggest,
        )
    before = recommended(study)
    objective = Objective(device, space, options, study)
    target = min(options.trials, max(space.size() - len(objective.cache), 0))
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
        if objective.measured >= target or exhausted or state["failed"] >= max(10, target) or interrupts.pending():
            study.stop()

    try:
        if target > 0:
            with hardware_session(device):
                _optimize(study, objective, callback, deadline)
        interrupts.check()
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt(study)
        raise
    best = recommended(study)
    summary = RunSummary(
        study=name,
        storage=redact(storage),
        measured=objective.measured,
        total_trials=len(study.trials),
        best_trial=best.number if best else None,
        best=trial_record(best) if best else None,
        previous_best=trial_record(before) if before else None,
        trial_seconds={key: round(value, 2) for key, value in objective.seconds.items()},
    )
    return study, summary


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


def space_key(space: SearchSpace) -> str:
    """A short hash of what a trial's parameters mean: each tuned knob's values in order, and the batch sizes.

    Pinned knobs are left out (they are not parameters), so an observe-only
    GPU whose clocks were changed between runs still resumes its study.
    """
    meaning = {
        "knobs": {n: [str(v) for v in space.knobs[n].values] for n in space.tuned_knobs},
        "batch_sizes": space.batch_sizes,
    }
    return hashlib.sha256(json.dumps(meaning, sort_keys=True).encode()).hexdigest()[:10]


def _space_flags(tuned: list[str], batch_sizes: list[int] | None) -> str:
    flags = f"--knobs {','.join(tuned)}"
    return flags + (f" --batch-sizes {','.join(map(str, batch_sizes))}" if batch_sizes else "")


def check_same_space(study: optuna.Study, space: SearchSpace) -> None:
    """Refuse to resume a study with another space: its parameter indexes would change meaning.

    Studies from before the key was recorded are compared by their tuned knobs,
    the only part of the space they recorded.
    """
    attrs = study.user_attrs
    if any(name.endswith("_index") for t in study.get_trials(deepcopy=False) for name in t.params):
        raise UserError(
            f"study {study.study_name} was written by an older powertune that stored knob positions, not values: "
            "give another --out or --storage to start afresh (tune pareto, export and status still read it)"
        )
    recorded = attrs.get("space_key")
    if recorded is None and "tuned_knobs" not in attrs:
        return
    same = recorded == space_key(space) if recorded is not None else attrs["tuned_knobs"] == space.tuned_knobs
    if not same:
        before = _space_flags(attrs.get("tuned_knobs", []), attrs.get("batch_sizes"))
        raise UserError(
            f"study {study.study_name} was tuned over another space ({before}, or another --space file): "
            "run with the same flags to resume it, or give another --out or --storage for this space"
        )


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
    if options.window.scenario == "server":
        study.set_user_attr("target_qps", options.window.options["server_target_qps"])
    study.set_user_attr("tuned_knobs", space.tuned_knobs)
    study.set_user_attr("batch_sizes", space.batch_sizes)
    study.set_user_attr("space_key", space_key(space))
    study.set_user_attr("provenance", provenance(device))
    if options.study_trials is not None:
        study.set_user_attr("study_trials", options.study_trials)
