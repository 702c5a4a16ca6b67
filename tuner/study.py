"""One tuning study end to end: open or resume it, run trials until done, summarise.

A study is keyed by model, device, scenario and latency bound, so running the
same command again resumes it and adds trials. ``tune_study`` is all of
``tune run`` (open and check the device, hold it, run, write the result
files); ``run_study`` is its loop on an open device, which ``tune plan`` runs
per rate. What one trial does lives in tuner.objective; the study's answer
(Optuna's best trial) and flat records in tuner.records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from pydantic import BaseModel, ConfigDict, Field

from tuner import atomicfile, baseline, interrupts
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session, hold
from tuner.devices.registry import check_meter, open_device
from tuner.errors import NeedsReboot
from tuner.explorer import REPEATS_BEFORE_EXPLORING, Explorer
from tuner.models import check_model, model_slug
from tuner.objective import MeasurementRejected, Objective
from tuner.pareto import ParetoFile, results_dir, write_results
from tuner.provenance import twin_note
from tuner.records import recommended, trial_record, unmet_bound
from tuner.run_options import RunOptions
from tuner.sampling import make_sampler
from tuner.scenario import label, serving_space
from tuner.space import SearchSpace
from tuner.storage import (
    EARLY_STOP_ATTR,
    QuotaStudy,
    StudyFull,
    open_storage,
    redact,
    storage_errors,
    storage_lock,
)
from tuner.strategies import proposal_counts
from tuner.strategies.stopping import StopDecision, StopRule, decide, stored_decision
from tuner.study_space import check_same_space, narrowed_space, pinned_note, stamp
from tuner.units import format_ms
from tuner.warm_start import WARM_ATTR, warm_start


def default_storage(out: Path) -> str:
    atomicfile.ensure_folder(out)
    return f"sqlite:///{(out / 'tune.db').as_posix()}"


def study_name(model: str, device: Device, scenario: str, bound_ms: float) -> str:
    """A study per model, device, scenario (with its rate, see tuner.scenario.label) and bound."""
    return f"{model}|{device.slug}|{scenario}|{format_ms(bound_ms)}"


MEMORY_STORAGE = ":memory:"


def open_study(
    name: str,
    storage: str,
    sampler: optuna.samplers.BaseSampler | None = None,
    heartbeat_s: int | None = None,
    readonly: bool = False,
) -> optuna.Study:
    """Create or resume a study; a bad storage URL is a user error, not a traceback.

    Runs pass ``heartbeat_s`` so a worker that dies mid-trial has that trial
    failed and retried (see tuner.storage); readers leave it out. ``:memory:``
    keeps the study in process memory (benchmarks run thousands of short
    studies through the same loop users get, without a database each).
    ``readonly``: a reading command's (see tuner.storage.prepare_sqlite).
    """
    optuna.logging.set_verbosity(logging.ERROR)
    with storage_errors(storage):
        return optuna.create_study(
            study_name=name,
            storage=None if storage == MEMORY_STORAGE else open_storage(storage, heartbeat_s, readonly),
            sampler=sampler,
            direction="minimize",
            load_if_exists=True,
        )


class RunSummary(BaseModel):
    """What a run reports back: the study, how many trials ran, and its recommended trial.

    ``previous_best`` is the recommended trial before this run (a resumed
    study), so a change of answer is said, never hidden. ``trial_seconds`` says
    where this run's trials spent their time: ``setup_s`` (apply, model load
    and preparation, warm-up), ``windows_s`` and ``search_s`` (the rest: the
    sampler, storage writes and progress between and around windows).
    ``unmet``: when no trial met the bound, the line that names the fastest
    one measured and the bound that would admit it (tuner.records.unmet_bound).
    ``saved``: the answer against its baseline (tuner.baseline), when one was asked for.
    """

    study: str
    storage: str
    measured: int
    total_trials: int
    best_trial: int | None
    best: dict | None
    previous_best: dict | None = None
    trial_seconds: dict[str, float] = {}
    stopped: str = ""
    early_stop: StopDecision | None = None
    reused: list[str] = []
    unmet: str | None = None
    saved: baseline.Saved | None = None


class StudyRequest(BaseModel):
    """What ``tune run`` asks for: a device by name (and how to open it) and the run's options."""

    model_config = ConfigDict(extra="forbid")

    device: str
    options: RunOptions
    allow_clock_changes: bool = False
    sysfs_root: Path | None = None
    space_file: Path | None = None


class StudyResult(BaseModel):
    """What ``tune run`` reports: the run's summary, the device it ran on, and where its result files are.

    ``study`` and ``pareto`` (the Optuna study and the fronts written to pareto.json) are for the
    library's callers (tuner.api) and left out of the report's JSON.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    summary: RunSummary
    device: str
    twin: bool
    twin_note: str = ""
    model: str
    max_latency_ms: float
    percentile: str
    scenario: str
    results: Path
    seconds: float
    pareto_points: int
    strategy_notes: list[str] = Field(default_factory=list)
    proposed_by: dict[str, int] = Field(default_factory=dict)
    study: optuna.Study | None = Field(default=None, exclude=True, repr=False)
    pareto: ParetoFile | None = Field(default=None, exclude=True, repr=False)


TrialCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial, int], None]


def study_folder(options: RunOptions, device: Device) -> Path:
    """Where a study's result files go: <out>/<device>/<model>, and a folder per rate for Server."""
    folder = results_dir(options.out, device.slug, options.model)
    if options.window.scenario != "offline":
        folder = folder / label(options.window).replace("@", "-")
    return folder


def open_checked(request: StudyRequest, on_note: Callable[[str], None] | None = None) -> Device:
    """The device a request names, opened once its meter, model, space and sampler are known to be usable."""
    options = request.options
    check_meter(options.window.meter, request.device, options.model)
    extra: dict = {} if request.sysfs_root is None else {"sysfs_root": request.sysfs_root}
    device = open_device(
        request.device,
        allow_clock_changes=request.allow_clock_changes,
        space_file=None if request.space_file is None else str(request.space_file),
        **extra,
    )
    check_model(options.model, options.window.runtime, device.simulated, device)
    narrowed_space(device, options.knobs, options.batch_sizes, options.modes, options.model, options.window.runtime)
    notes = [*getattr(device, "notes", [])]
    pinned = pinned_note(
        device.space().narrow(options.knobs, options.batch_sizes), options.model, options.window.runtime
    )
    notes += [pinned] if pinned is not None else []
    if options.baseline is not None:
        space = narrowed_space(
            device, options.knobs, options.batch_sizes, options.modes, options.model, options.window.runtime
        )
        baseline.baseline_config(device, space, options.baseline, space.batch_sizes[-1])
    for note in notes:
        if on_note is not None:
            on_note(f"note: {note}")
    make_sampler(options.sampler, options.seed)
    return device


def tune_study(
    request: StudyRequest,
    on_trial: TrialCallback | None = None,
    on_note: Callable[[str], None] | None = None,
) -> StudyResult:
    """All of ``tune run``: check and open the device, run the study holding it, write its result files.

    ``on_trial`` sees every finished trial (progress); ``on_note`` gets what
    the device says when it opens and, on Ctrl-C or SIGTERM, where the
    results of the completed trials were written (the study itself resumes).
    """
    started = time.monotonic()
    device = open_checked(request, on_note)
    options = request.options
    folder = study_folder(options, device)
    atomicfile.check_writable(folder, "--out")

    def partial(study: optuna.Study) -> None:
        done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
        if done:
            write_results(study, folder)
            if on_note is not None:
                on_note(f"{done} completed trials kept; results: {folder}/; run the same command to resume")

    study, summary = run_study(device, options, on_trial=on_trial, on_interrupt=partial, on_note=on_note)
    pareto = write_results(study, folder)
    return StudyResult(
        summary=summary,
        device=device.name,
        twin=device.simulated,
        twin_note=twin_note(device),
        model=options.model,
        max_latency_ms=options.max_latency_ms,
        percentile=options.window.percentile,
        scenario=label(options.window),
        results=folder,
        seconds=round(time.monotonic() - started, 2),
        pareto_points=len(pareto.fronts.get("global", [])),
        strategy_notes=study.user_attrs.get("strategy_notes", []),
        proposed_by=proposal_counts(study),
        study=study,
        pareto=pareto,
    )


def run_study(
    device: Device,
    options: RunOptions,
    on_trial: TrialCallback | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    on_interrupt: Callable[[optuna.Study], None] | None = None,
    on_note: Callable[[str], None] | None = None,
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
    the trials that completed) and the signal is raised. ``on_note`` hears
    that a study resumes, and how many trials its storage holds.

    Once the loop ends with an answer, the baseline ``options.baseline``
    names is measured at the answer's batch size, unless the study already
    holds it (tuner.baseline).
    """
    with interrupts.held(), hold(device):
        return _run_study(device, options, on_trial, sampler, on_interrupt, on_note)


def _run_study(
    device: Device,
    options: RunOptions,
    on_trial: TrialCallback | None,
    sampler: optuna.samplers.BaseSampler | None,
    on_interrupt: Callable[[optuna.Study], None] | None,
    on_note: Callable[[str], None] | None = None,
) -> tuple[optuna.Study, RunSummary]:
    space = serving_space(
        narrowed_space(
            device, options.knobs, options.batch_sizes, options.modes, options.model, options.window.runtime
        ),
        options.window,
    )
    storage = options.storage or default_storage(options.out)
    name = study_name(options.model, device, label(options.window), options.max_latency_ms)
    sampler = sampler or make_sampler(options.sampler, options.seed)
    if hasattr(sampler, "bind"):
        sampler.bind(space, options.model, options.max_latency_ms, options.window.percentile, device=device)
    deadline = None if options.timeout_s is None else time.monotonic() + options.timeout_s
    with storage_errors(storage), storage_lock(storage, name):
        study = open_study(name, storage, sampler, options.heartbeat_s)
        check_same_space(study, space)
        held = len(study.get_trials(deepcopy=False))
        fresh = not held
        if held and on_note is not None:
            on_note(f"resuming: {held} trials in storage (study {name})")
        stamp(study, device, options, space)
        if fresh and options.warm_start and storage != MEMORY_STORAGE:
            warm_start(study, storage, space, options, device)
    if options.study_trials is not None:
        study = QuotaStudy(
            study,
            storage,
            options.study_trials,
            deadline,
            poll_s=min(2.0, options.heartbeat_s / 2),
            propose=space.suggest,
            early_stop=options.early_stop,
        )
    before = recommended(study)
    objective = Objective(device, space, options, study)
    done_before = stored_decision(study) if options.early_stop else None
    target = 0 if done_before else min(options.trials, max(space.size() - len(objective.cache), 0))
    state: dict = {"reused_in_row": 0, "failed": 0, "why": ""}
    explorer = Explorer(space, lambda: objective.cache, options.seed)
    rule = StopRule(resolution=options.window.ci)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        state["reused_in_row"] = state["reused_in_row"] + 1 if "reused_from" in trial.user_attrs else 0
        state["failed"] += trial.state == optuna.trial.TrialState.FAIL
        if on_trial is not None:
            on_trial(study, trial, objective.measured)
        exhausted = False
        if state["reused_in_row"] >= REPEATS_BEFORE_EXPLORING and options.study_trials is None:
            exhausted = not explorer.enqueue_unmeasured(study)
        state["why"] = _ending(options, objective.measured, target, exhausted, state["failed"])
        if options.early_stop and not state["why"]:
            state["why"] = _early_stop(study, rule)
        if state["why"] or interrupts.pending():
            study.stop()

    try:
        if target > 0:
            with hardware_session(device), storage_errors(storage):
                _optimize(study, objective, callback, deadline)
        interrupts.check()
        record = _baseline(study, device, options, space, storage)
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt(study)
        raise
    best = recommended(study)
    decision = stored_decision(study)
    if done_before is not None:
        stopped = f"the study is done: {_done_line(done_before)}"
    elif decision is not None and options.early_stop:
        stopped = f"stopped early after trial {decision.trial}: {decision.line}"
    else:
        stopped = state["why"] or _ending(options, objective.measured, target, False, state["failed"])
        if not stopped:
            quota = options.study_trials
            stopped = "timeout" if quota is None else f"the study holds its {quota} completed trials (--study-trials)"
    percentile = options.window.percentile
    summary = RunSummary(
        study=name,
        storage=redact(storage),
        measured=objective.measured,
        total_trials=len(study.trials),
        best_trial=best.number if best else None,
        best=trial_record(best) if best else None,
        previous_best=trial_record(before) if before else None,
        trial_seconds={key: round(value, 2) for key, value in objective.seconds.items()},
        stopped=stopped,
        early_stop=decision if options.early_stop else None,
        reused=list(study.user_attrs.get(WARM_ATTR, [])),
        unmet=None if best else unmet_bound(study.get_trials(deepcopy=False), options.max_latency_ms, percentile),
        saved=None
        if best is None or record is None
        else baseline.saved(float(best.value), record, options.max_latency_ms, percentile),
    )
    return study, summary


def _baseline(
    study: optuna.Study, device: Device, options: RunOptions, space: SearchSpace, storage: str
) -> baseline.BaselineRecord | None:
    """The baseline at the answer's batch size: read from the study, or measured now (in its own hardware session).

    None when no baseline was asked for or no configuration met the bound
    (there is nothing to compare).
    """
    best = recommended(study)
    if options.baseline is None or best is None:
        return None
    batch = int(best.user_attrs["batch_size"])
    record = baseline.stored(study, options.baseline, batch)
    if record is None:
        config = baseline.baseline_config(device, space, options.baseline, batch)
        named = baseline.label_of(options.baseline, device, space)
        settings = options.window
        if not device.simulated:
            folder = options.out / device.slug / model_slug(options.model) / "loadgen"
            if options.window.scenario != "offline":
                folder = folder / label(options.window).replace("@", "-")
            settings = settings.model_copy(update={"log_dir": str(folder / f"baseline-b{batch}")})
        with hardware_session(device), storage_errors(storage):
            try:
                record = baseline.measure(device, options.model, config, settings, options.baseline, named)
            except (MeasurementRejected, NeedsReboot) as exc:
                record = baseline.failed(config, options.baseline, named, str(exc))
            interrupts.check()
        baseline.store(study, record)
    elif study.user_attrs.get(baseline.SPEC_ATTR) != record.spec:
        study.set_user_attr(baseline.SPEC_ATTR, record.spec)
    return record


WIDEN = (
    "to measure more, run it with --no-early-stop (up to --trials more configurations), "
    "or tune other knobs or batch sizes with another --out or --storage"
)


def _done_line(decision: StopDecision) -> str:
    """What a resumed study that had stopped by itself says, and how to widen it."""
    return f"it stopped by itself after trial {decision.trial} ({decision.line}); {WIDEN}"


def _ending(options: RunOptions, measured: int, target: int, exhausted: bool, failed: int) -> str:
    """Why the loop ends now apart from an early stop (a line), or "" to go on."""
    if target <= 0 or exhausted:
        return "every configuration of the space has been measured"
    if measured >= target:
        cap = "--trials" if options.trials == target else "the space's unmeasured configurations"
        return f"ran to its cap: {target} configurations measured ({cap})"
    if failed >= max(10, target):
        return f"{failed} trials failed to measure"
    return ""


def _early_stop(study: optuna.Study, rule: StopRule) -> str:
    """Stop when another worker stored a decision, or when this study's trials support one (stored for all)."""
    decision = stored_decision(study)
    if decision is None:
        decision = decide(study.get_trials(deepcopy=False), rule)
        if decision is None:
            return ""
        study.set_user_attr(EARLY_STOP_ATTR, decision.model_dump())
    return f"stopped early after trial {decision.trial}: {decision.line}"


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
