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

from runners.llm_spec import ENGINE_PREFIX, is_llm, parse_llm, weights_note
from tuner import baseline, llm_study
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session, hold
from tuner.devices.registry import check_meter, open_device
from tuner.devices.runner_cache import releasing_runner
from tuner.engine import engine_space
from tuner.errors import NeedsReboot, UserError
from tuner.explorer import REPEATS_BEFORE_EXPLORING, Explorer
from tuner.llm import bounds_label, check_bounds, llm_sampler, llm_serving_space, llm_space
from tuner.measure.prompts import load_prompts
from tuner.measure.settings import WindowSettings
from tuner.models import check_model, fixed_knobs, model_slug
from tuner.objective import MeasurementRejected, Objective
from tuner.pareto import results_dir, write_results
from tuner.plumbing import atomicfile, interrupts
from tuner.plumbing.units import format_ms
from tuner.provenance import twin_note
from tuner.records import recommended, trial_record, unmet_bound, unmet_bounds
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
from tuner.strategies.stopping import StopDecision, StopRule, decide, decide_settled, stored_decision
from tuner.study_results import RunSummary, StudyRequest, StudyResult, TrialCallback
from tuner.study_space import check_same_space, stamp
from tuner.warm_start import WARM_ATTR, warm_start


def default_storage(out: Path) -> str:
    atomicfile.ensure_folder(out)
    return f"sqlite:///{(out / 'tune.db').as_posix()}"


def study_name(model: str, device: Device, scenario: str, bound_ms: float, window: WindowSettings | None = None) -> str:
    """A study per model, device, scenario (with its rate, see tuner.scenario.label) and bound(s).

    An LLM study's name carries its token bounds too (``ttft500ms,tpot30ms``: tuner.llm.bounds_label).
    """
    bounds = format_ms(bound_ms) if window is None else bounds_label(bound_ms, window)
    return f"{model}|{device.slug}|{scenario}|{bounds}"


def narrowed_space(
    device: Device,
    knobs: list[str] | None,
    batch_sizes: list[int] | None,
    modes: list[str] | None = None,
    model: str | None = None,
    runtime: str = "auto",
) -> SearchSpace:
    """The device's space narrowed to ``knobs``, ``batch_sizes`` and the power ``modes`` named (``--modes``),
    and, given the model, with what it fixes pinned.

    A device that keeps some of its modes out of its space (a Jetson board: modes of
    another TPC mask need a reboot) offers a named one through ``offer_modes``,
    which says what that costs in the device's notes.
    """
    if modes:
        offer = getattr(device, "offer_modes", None)
        if offer is not None:
            offer(modes)
    space = model_base_space(device, model).narrow(knobs=knobs, batch_sizes=batch_sizes)
    if modes:
        space = space.only_modes(modes)
    if model is not None:
        space = model_space(space, model, runtime)
    if not space.tuned_knobs and len(space.batch_sizes) < 2:
        raise UserError(
            "the narrowed space is empty (a single configuration): use tune measure, or widen --knobs/--batch-sizes"
        )
    return space


def model_base_space(device: Device, model: str | None) -> SearchSpace:
    """The device's space, or for a causal LM the LLM runner's space on it (tuner.llm.llm_space)."""
    space = device.space()
    if model is not None and model.startswith(ENGINE_PREFIX):
        return engine_space(space, model)
    return llm_space(space) if model is not None and is_llm(model) else space


def measure_space(device: Device, model: str, runtime: str = "auto") -> SearchSpace:
    """The space one configuration of ``model`` is read in (tune measure): the device's, or an LLM's with its pins."""
    if not is_llm(model):
        return device.space()
    return model_space(model_base_space(device, model), model, runtime)


def model_space(space: SearchSpace, model: str, runtime: str) -> SearchSpace:
    """``space`` with the runner knobs ``model`` leaves no choice in pinned (tuner.models.fixed_knobs)."""
    for name, (value, why) in fixed_knobs(model, runtime, space.knobs).items():
        allowed = [v for v in space.knobs[name].values if str(v).lower() == str(value).lower()]
        if not allowed:
            shown = ", ".join(str(v) for v in space.knobs[name].values)
            raise UserError(f"{why}, but {space.kind} allows {name} {shown} here: export the model to match")
        space = space.pin(name, allowed[0])
    return space


def pinned_note(space: SearchSpace, model: str, runtime: str) -> str | None:
    """One line naming the knobs pinned for ``model`` in ``space`` and why, or None when none is."""
    fixed = fixed_knobs(model, runtime, space.tuned_knobs)
    if not fixed:
        return None
    said = "; ".join(f"{name}={value} ({why})" for name, (value, why) in fixed.items())
    return f"pinned for {model}: {said}"


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


def study_folder(options: RunOptions, device: Device) -> Path:
    """Where a study's result files go: <out>/<device>/<model>, and a folder per rate for Server."""
    folder = results_dir(options.out, device.slug, options.model)
    if options.window.scenario != "offline":
        folder = folder / label(options.window).replace("@", "-")
    return folder


def open_checked(request: StudyRequest, on_note: Callable[[str], None] | None = None) -> Device:
    """The device a request names, opened once its meter, model, space and sampler are known to be usable."""
    options = request.options
    check_bounds(options.model, options.max_latency_ms, options.window)
    llm_sampler(options.model, options.sampler)
    if is_llm(options.model):
        load_prompts(options.window.prompts)  # a bad --prompts file is refused before anything is opened
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
        model_base_space(device, options.model).narrow(options.knobs, options.batch_sizes),
        options.model,
        options.window.runtime,
    )
    notes += [pinned] if pinned is not None else []
    if is_llm(options.model) and not options.model.startswith(ENGINE_PREFIX):
        weights = weights_note(parse_llm(options.model))
        notes += [weights] if weights is not None else []
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
    """All of ``tune run``: open the device, run the study holding it, free its model, write the result files.

    ``on_trial`` sees every finished trial; ``on_note`` what the device says when it opens and, on a signal,
    where the completed trials' results were written (the study itself resumes).
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

    with releasing_runner(device):
        study, summary = run_study(device, options, on_trial=on_trial, on_interrupt=partial, on_note=on_note)
    pareto = write_results(study, folder)
    return StudyResult(
        summary=summary,
        device=device.name,
        twin=device.simulated,
        twin_note=twin_note(device),
        model=options.model,
        max_latency_ms=options.max_latency_ms,
        max_ttft_ms=options.window.max_ttft_ms,
        max_tpot_ms=options.window.max_tpot_ms,
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
    llm = is_llm(options.model)
    narrowed = narrowed_space(
        device, options.knobs, options.batch_sizes, options.modes, options.model, options.window.runtime
    )
    space = llm_serving_space(narrowed, options.window) if llm else serving_space(narrowed, options.window)
    storage = options.storage or default_storage(options.out)
    name = study_name(options.model, device, label(options.window), options.max_latency_ms, options.window)
    sampler = sampler or make_sampler(llm_sampler(options.model, options.sampler), options.seed)
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
        # Earlier studies' answers are J/query under a query bound: an LLM study starts from its own trials.
        if fresh and options.warm_start and storage != MEMORY_STORAGE and not llm:
            warm_start(study, storage, space, options, device)
        if fresh and llm:
            llm_study.enqueue_first(study, space, options.window)
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
    # A strategy may confirm only close calls (LearnedSampler's ``confirm_within``); others confirm every contender.
    objective = Objective(device, space, options, study, getattr(sampler, "confirm_within", None))
    done_before = stored_decision(study) if options.early_stop else None
    target = 0 if done_before else min(options.trials, max(space.size() - len(objective.cache), 0))
    state: dict = {"reused_in_row": 0, "failed": 0, "why": ""}
    explorer = Explorer(space, lambda: objective.cache, options.seed)
    rule = llm_study.stop_rule(options.window.ci) if llm else StopRule(resolution=options.window.ci)

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
            state["why"] = _early_stop(study, rule, decide_settled if llm else decide)
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
        unmet=None if best else _unmet(study, options, llm),
        saved=None
        if best is None or record is None
        else baseline.saved(float(best.value), record, options.max_latency_ms, options.window.percentile),
    )
    return study, summary


def _unmet(study: optuna.Study, options: RunOptions, llm: bool) -> str:
    """What a study says when no configuration met its bound(s)."""
    trials = study.get_trials(deepcopy=False)
    if not llm:
        return unmet_bound(trials, options.max_latency_ms, options.window.percentile)
    return unmet_bounds(trials, options.bounds(), options.window.percentile)


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
    if record is None and is_llm(options.model):
        record = llm_study.measured_baseline(study, device, space, options.baseline, batch)
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


# How a study that stopped by itself is widened.
WIDEN = "to measure more, run it with --no-early-stop (up to --trials more), or tune other knobs or batch sizes "
WIDEN += "with another --out or --storage"


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


def _early_stop(study: optuna.Study, rule: StopRule, rule_of: Callable = decide) -> str:
    """Stop on a decision a worker stored, or one the trials support (``rule_of``: headroom, or an LLM's plateau)."""
    decision = stored_decision(study)
    if decision is None:
        decision = rule_of(study.get_trials(deepcopy=False), rule)
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
