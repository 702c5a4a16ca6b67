"""``tune plan``: the cheapest feasible Server configuration at each arrival rate, as a policy.

Each planned rate is its own study (model, device, ``server@<rate>qps``,
bound), so a plan reuses every study already in the storage and measures only
the rates it lacks: a rate whose study holds a feasible trial is taken from it,
any other is tuned with ``run_study`` (the same loop as ``tune run``). Bands
then run from one planned rate to the next, each with the configuration chosen
at its upper edge; neighbouring bands with the same configuration merge.
Rates above the last feasible one have no band: the governor runs the top
band there and says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from pydantic import BaseModel, ConfigDict, Field

from tuner.devices.base import Device
from tuner.errors import ConfigurationError
from tuner.measure.settings import WindowSettings
from tuner.plumbing.units import check_rate
from tuner.records import is_feasible, recommended, tail_latency_ms, trial_record
from tuner.run_options import RunOptions
from tuner.scenario import TIMEOUT_KNOB, TIMEOUTS_MS, format_rate, label, serving_space, window_for
from tuner.serve.policy import Band, BandPoint, BandProvenance, PlanPoint, Policy, stamp
from tuner.serve.validate import MAX_PLAN_RATES
from tuner.space import Config, SearchSpace
from tuner.storage import open_storage, redact, storage_errors
from tuner.study import (
    TrialCallback,
    default_storage,
    narrowed_space,
    open_study,
    run_study,
    study_name,
)
from tuner.study_space import check_same_space

# The sampler a plan uses unless told: the roofline-guided default models
# Offline physics, not queueing, and a plan runs a study per rate.
PLAN_SAMPLER = "tpe"
SEED_TIMEOUTS_MS = (0.1, 10.0)
# How many of the rate below's best feasible configurations start a rate's
# study: neighbouring rates have similar cheapest configurations, so a plan
# over a fine grid of rates hands each short search what the last one found.
SEED_FROM_BELOW = 5
# Trials per rate spent walking from the best configuration to its neighbours
# after the sampler's search (see ``refine``).
REFINE_TRIALS = 30
# The cheapest few configurations of each rate are measured this many more
# windows before one becomes a band (see ``verify``).
VERIFY_TOP = 3
VERIFY_REPEATS = 2


class PlanOptions(BaseModel):
    """Everything ``tune plan`` needs; the CLI only fills this in."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_latency_ms: float
    rates: list[float] = Field(min_length=1)
    trials: int = 40
    refine_trials: int = REFINE_TRIALS
    verify_repeats: int = VERIFY_REPEATS
    seed: int | None = None
    sampler: str = PLAN_SAMPLER
    batch_sizes: list[int] | None = None
    knobs: list[str] | None = None
    storage: str | None = None
    out: Path = Path("studies")
    window: WindowSettings = Field(default_factory=WindowSettings)
    on_trial: TrialCallback | None = Field(default=None, exclude=True)
    """Progress: every finished trial of every rate's study (the rate is the study's ``target_qps``)."""

    def trials_per_rate(self) -> int:
        """The most trials one rate's study can take: search, refine, two rounds of verify, the cross-check."""
        return self.trials + self.refine_trials + 2 * VERIFY_TOP * self.verify_repeats + len(self.rates) - 1

    def run_options(self, storage: str, rate: float, trials: int) -> RunOptions:
        """The study options of one arrival rate: the Server window at that rate, ``trials`` measured.

        Each round measures exactly its trials (search, refine, verify), and
        the plan seeds its own rates: no early stop, no warm start.
        """
        return RunOptions(
            model=self.model,
            max_latency_ms=self.max_latency_ms,
            trials=trials,
            seed=self.seed,
            sampler=self.sampler,
            batch_sizes=self.batch_sizes,
            knobs=self.knobs,
            storage=storage,
            out=self.out,
            window=window_for(self.window, "server", rate),
            early_stop=False,
            warm_start=False,
        )


@dataclass
class RateResult:
    """One planned rate: the best feasible trial of its study, if any."""

    rate: float
    study: str
    record: dict | None
    measured_by_plan: bool


def parse_rates(text: str) -> list[float]:
    """``50,100,200`` or ``start:stop:step`` (inclusive), in queries/s, each within the serving rate limits.

    The count is checked before a list is made, so ``1:1e12:1`` is a one-line
    error naming the limit, not a MemoryError.
    """
    example = "write e.g. 25:300:25 (start:stop:step) or 50,100,200"
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            for value, what in ((start, "start"), (stop, "stop")):
                check_rate(value, f"--rates {what}")
            if not (math.isfinite(step) and step > 0) or stop < start:
                raise ValueError
            count = math.floor((stop - start) / step + 0.5) + 1
            if count > MAX_PLAN_RATES:
                raise ConfigurationError(
                    f"--rates {text!r} names {count} rates, more than {MAX_PLAN_RATES}: use a larger step"
                )
            rates = [start + i * step for i in range(count)]
        else:
            rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigurationError(f"cannot read --rates {text!r}: {example}") from None
    if not rates:
        raise ConfigurationError(f"--rates {text!r} must be positive arrival rates, e.g. 25:300:25")
    if len(rates) > MAX_PLAN_RATES:
        raise ConfigurationError(f"--rates {text!r} names {len(rates)} rates, more than {MAX_PLAN_RATES}: plan fewer")
    for rate in rates:
        check_rate(rate, "--rates")
    return sorted(set(rates))


def plan_rates(
    device: Device,
    options: PlanOptions,
    on_rate: Callable[[RateResult], None] | None = None,
    on_start: Callable[[list[float]], None] | None = None,
) -> list[RateResult]:
    """Best feasible configuration per rate: from an existing study, else by running one.

    ``on_start`` hears, before anything is measured, which rates have no
    feasible study yet (the ones the plan tunes); ``on_rate`` each rate's result.
    """
    storage = options.storage or default_storage(options.out)
    with storage_errors(storage):
        existing = set(optuna.get_all_study_names(storage=open_storage(storage, None)))
    results: list[RateResult] = []
    space = serving_space(
        narrowed_space(device, options.knobs, options.batch_sizes, model=options.model, runtime=options.window.runtime),
        window_for(options.window, "server", 1.0),
    )
    names = [
        study_name(options.model, device, label(window_for(options.window, "server", r)), options.max_latency_ms)
        for r in options.rates
    ]
    for name in names:  # before anything is measured: a study tuned over another space is never reused
        if name in existing:
            check_same_space(open_study(name, storage), space)
    if on_start is not None:
        on_start(
            [
                r
                for r, n in zip(options.rates, names, strict=True)
                if n not in existing or not recommended(open_study(n, storage))
            ]
        )
    for rate, name in zip(options.rates, names, strict=True):
        best = recommended(open_study(name, storage)) if name in existing else None
        measured = False
        if best is None:
            previous = next((r.study for r in reversed(results) if r.record is not None), None)
            below = top_feasible(open_study(previous, storage), SEED_FROM_BELOW) if previous else []
            seed_study(open_study(name, storage), space, below)
            study, _ = run_study(device, options.run_options(storage, rate, options.trials), on_trial=options.on_trial)
            study = refine(device, options, storage, space, rate, study)
            study = verify(device, options, storage, space, rate, study)
            best = recommended(study)
            measured = True
        result = RateResult(rate, name, trial_record(best) if best else None, measured)
        results.append(result)
        if on_rate is not None:
            on_rate(result)
    return cross_check(device, options, storage, space, results)


def cross_check(
    device: Device, options: PlanOptions, storage: str, space: SearchSpace, results: list[RateResult]
) -> list[RateResult]:
    """Measure each rate's winner at every other planned rate too, and keep the cheaper.

    A configuration that serves a higher rate within the bound is a strong
    candidate at a lower one, and a study per rate can miss it (each search
    is short); a lower rate's winner may also serve the next rate up more
    cheaply than what that rate's own search found. Measured once per pair,
    in the other rate's own study, so a re-run finds them there and measures
    nothing.
    """
    out = list(results)
    for i, here in enumerate(results):
        study = open_study(here.study, storage)
        measured = {t.user_attrs.get("effective_key") for t in study.trials}
        queued = 0
        for j, other in enumerate(results):
            if j == i or other.record is None or (here.record is None and j < i):
                continue
            config = space.effective(
                Config(knobs=dict(other.record["config"]), batch_size=int(other.record["batch_size"]))
            )
            if json.dumps(config.key()) in measured:
                continue
            study.enqueue_trial(space.params_for(config), skip_if_exists=True)
            measured.add(json.dumps(config.key()))
            queued += 1
        if queued:
            study, _ = run_study(device, options.run_options(storage, here.rate, queued), on_trial=options.on_trial)
            study = verify(device, options, storage, space, here.rate, study)
            best = recommended(study)
            out[i] = RateResult(here.rate, here.study, trial_record(best) if best else None, True)
    return out


def refine(
    device: Device, options: PlanOptions, storage: str, space: SearchSpace, rate: float, study: optuna.Study
) -> optuna.Study:
    """Walk from the study's best feasible configuration to unmeasured neighbours while one is cheaper.

    A short model-based search lands near the cheapest configuration but
    often not on it (in these spaces, typically one CPU-core count or one
    clock step away). Each round measures every neighbour of the best (one
    step of one knob, the batch size or the batching timeout) not yet
    measured, until none is cheaper or ``options.refine_trials`` are spent.
    """
    budget = options.refine_trials
    while budget > 0:
        best = recommended(study)
        if best is None:
            return study
        measured = {t.user_attrs.get("effective_key") for t in study.trials}
        record = trial_record(best)
        centre = Config(knobs=dict(record["config"]), batch_size=int(record["batch_size"]))
        fresh = [c for c in neighbours(space, centre) if json.dumps(c.key()) not in measured][:budget]
        if not fresh:
            return study
        for config in fresh:
            study.enqueue_trial(space.params_for(config), skip_if_exists=True)
        study, _ = run_study(device, options.run_options(storage, rate, len(fresh)), on_trial=options.on_trial)
        budget -= len(fresh)
        after = recommended(study)
        if after is None or after.number == best.number:
            return study
    return study


def verify(
    device: Device, options: PlanOptions, storage: str, space: SearchSpace, rate: float, study: optuna.Study
) -> optuna.Study:
    """Measure the cheapest feasible configurations again before one becomes a band.

    A tail percentile from one short Server window is noisy (at 20 queries/s a
    10 s window holds 200 queries, so its p99 is about its second-worst), and
    the cheapest of many such windows is the one whose luck was best: a band
    chosen on it breaks the bound more often than 1% once it serves for
    hours. Each of the ``VERIFY_TOP`` cheapest is measured ``VERIFY_REPEATS``
    more windows (fresh arrivals), as ``tune run`` confirms a new best; the
    re-measured trial carries their mean and the noise margin, and the band
    is the study's recommended trial (tuner.records), what ``tune export
    --scenario server@RATEqps``, pareto and status name. Called again after
    the cross-check, it measures only single-window configurations cheaper
    than the verified best.
    """
    if options.verify_repeats <= 0:
        return study
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    checked = {t.user_attrs.get("effective_key") for t in trials if "repeat_of" in t.user_attrs}
    best = recommended(study)
    top = sorted(
        (
            t
            for t in trials
            if is_feasible(t)
            and t.value is not None
            and "repeat_of" not in t.user_attrs
            and "reused_from" not in t.user_attrs
            and t.user_attrs.get("effective_key") not in checked
            and (best is None or "repeat_of" not in best.user_attrs or t.value < best.value)
        ),
        key=lambda t: (t.value, t.number),
    )[:VERIFY_TOP]
    for trial in top:
        config = Config(knobs=dict(trial.user_attrs["config"]), batch_size=int(trial.user_attrs["batch_size"]))
        why = f"re-measure of trial {trial.number}: a band is chosen on a mean, not one window"
        attrs = {"repeat_of": trial.number, "proposed_by": "plan-verify", "why": why}
        for _ in range(options.verify_repeats):
            study.enqueue_trial(space.params_for(config), user_attrs=attrs, skip_if_exists=False)
    if top:
        study, _ = run_study(
            device, options.run_options(storage, rate, len(top) * options.verify_repeats), on_trial=options.on_trial
        )
    return study


def neighbours(space: SearchSpace, config: Config) -> list[Config]:
    """Distinct effective configurations one step away: an ordered knob or the batch size one value up or
    down, or an unordered knob (a power mode) at another value."""
    out: dict[tuple, Config] = {}
    base = space.effective(config)

    def add(knobs: dict, batch: int) -> None:
        candidate = space.effective(Config(knobs=knobs, batch_size=batch))
        if candidate.key() != base.key():
            out.setdefault(candidate.key(), candidate)

    for name in space.tuned_knobs:
        knob = space.knobs[name]
        values = list(knob.values)
        at = next((i for i, v in enumerate(values) if str(v) == str(config.knobs[name])), None)
        if at is None:
            continue
        steps = [at - 1, at + 1] if knob.ordered else [i for i in range(len(values)) if i != at]
        for i in steps:
            if 0 <= i < len(values):
                add({**config.knobs, name: values[i]}, config.batch_size)
    if config.batch_size in space.batch_sizes:
        at = space.batch_sizes.index(config.batch_size)
        for i in (at - 1, at + 1):
            if 0 <= i < len(space.batch_sizes):
                add(dict(config.knobs), space.batch_sizes[i])
    return list(out.values())


def top_feasible(study: optuna.Study, count: int) -> list[dict]:
    """The ``count`` cheapest feasible trials of a study, cheapest first, as records."""
    done = [t for t in study.get_trials(deepcopy=False) if is_feasible(t) and t.value is not None]
    return [trial_record(t) for t in sorted(done, key=lambda t: (t.value, t.number))[:count]]


def seed_study(study: optuna.Study, space: SearchSpace, below: list[dict]) -> None:
    """Queue the first trials of a rate's study: the full-speed default at every batch size, and the best below.

    The default (MAXN, the card's default clocks) is the configuration most
    likely to be feasible, so every rate the device can serve starts with a
    feasible point; the best configurations of the rate below are often
    close to this one's.
    """
    if study.trials:
        return
    default = space.default_config()
    timeouts = [t for t in SEED_TIMEOUTS_MS if t in TIMEOUTS_MS]
    for batch in space.batch_sizes:
        for timeout in timeouts:
            config = Config(knobs={**default.knobs, TIMEOUT_KNOB: timeout}, batch_size=batch)
            study.enqueue_trial(space.params_for(config), skip_if_exists=True)
    for record in below:
        config = Config(knobs=dict(record["config"]), batch_size=int(record["batch_size"]))
        study.enqueue_trial(space.params_for(config), skip_if_exists=True)


def build_policy(device: Device, options: PlanOptions, results: list[RateResult], percentile: str) -> Policy:
    """Bands from the per-rate winners, up to the highest feasible rate."""
    storage = redact(options.storage or default_storage(options.out))
    feasible = [r for r in results if r.record is not None]
    if not feasible:
        raise ConfigurationError(
            f"no configuration met the bound at any planned rate (lowest {format_rate(results[0].rate)} queries/s): "
            "relax --max-latency, plan lower --rates, or run more --trials"
        )
    measured = measurements(options, results)
    bands: list[Band] = []
    for r in results:
        if r.record is None:
            break
        rec = r.record
        knobs = {k: v for k, v in rec["config"].items() if k != TIMEOUT_KNOB}
        band = Band(
            min_qps=bands[-1].max_qps if bands else 0.0,
            max_qps=r.rate,
            knobs=knobs,
            batch_size=int(rec["batch_size"]),
            batch_timeout_ms=float(rec["config"].get(TIMEOUT_KNOB, 0.0)),
            j_per_query=float(rec["j_per_query"]),
            latency_ms=float(rec[f"{percentile}_ms"]),
            avg_w=float(rec["avg_w"]),
            provenance=BandProvenance(
                study=r.study, storage=storage, trial=int(rec["trial"]), measured_by_plan=r.measured_by_plan
            ),
            measured=measured.get(_key(rec), []),
        )
        if bands and bands[-1].label() == band.label():
            band = band.model_copy(update={"min_qps": bands[-1].min_qps})
            bands[-1] = band
        else:
            bands.append(band)
    points = [
        PlanPoint(
            rate_qps=r.rate,
            feasible=r.record is not None,
            j_per_query=None if r.record is None else float(r.record["j_per_query"]),
            latency_ms=None if r.record is None else float(r.record[f"{percentile}_ms"]),
            label="" if r.record is None else _label(r.record),
            study=r.study,
            trial=None if r.record is None else int(r.record["trial"]),
        )
        for r in results
    ]
    return Policy(
        model=options.model,
        device=device.name,
        device_kind=device.kind,
        twin=device.simulated,
        percentile=percentile,
        max_latency_ms=options.max_latency_ms,
        bands=bands,
        points=points,
        created_at=stamp(),
    )


def representatives(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """One trial per re-measured configuration (its latest repeat, the mean of its windows); others unchanged."""
    latest: dict[str, optuna.trial.FrozenTrial] = {}
    for t in trials:
        key = t.user_attrs.get("effective_key")
        if "repeat_of" in t.user_attrs and (key not in latest or t.number > latest[key].number):
            latest[key] = t
    return [t for t in trials if latest.get(t.user_attrs.get("effective_key"), t) is t]


def _key(record: dict) -> str:
    return json.dumps([record["config"], record["batch_size"]], sort_keys=True)


def measurements(options: PlanOptions, results: list[RateResult]) -> dict[str, list[BandPoint]]:
    """Each winner's energy per query and tail latency at every planned rate where a study measured it.

    The cross-check measured every rate's winner in every other rate's study;
    a verified configuration counts by its latest repeat (its windows' mean).
    """
    storage = options.storage or default_storage(options.out)
    wanted = {_key(r.record) for r in results if r.record is not None}
    found: dict[str, list[BandPoint]] = {key: [] for key in wanted}
    for r in results:
        study = open_study(r.study, storage)
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        for trial in representatives(done):
            record = trial_record(trial)
            key = _key(record)
            j = record.get("j_per_query")
            if key in found and j is not None and math.isfinite(j) and j > 0:
                latency = tail_latency_ms(trial)
                point = BandPoint(rate_qps=r.rate, j_per_query=float(j), latency_ms=latency or math.inf)
                found[key].append(point)
    return found


def _label(record: dict) -> str:
    return " ".join([*(f"{k}={v}" for k, v in record["config"].items()), f"bs={record['batch_size']}"])
