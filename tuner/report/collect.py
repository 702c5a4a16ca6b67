"""Measure a report's points: each device's power modes (or runner-knob combinations) against batch size.

A device with power modes (nvpmodel) is characterized per mode, its other
knobs at their defaults capped by the mode; ``knobs`` adds runner or device
knobs to vary on top (precision, CUDA graphs). Points a study already holds
for the same device, model, scenario and effective configuration are reused
instead of measured again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import optuna

from tuner.baseline import saved_of
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session, hold
from tuner.errors import ConfigurationError, did_you_mean
from tuner.measure.poller import Poller
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.objective import METRIC_KEYS, ORIGIN_KEYS
from tuner.provenance import provenance
from tuner.records import recommended as study_recommended
from tuner.records import windows
from tuner.report.analysis import recommended
from tuner.report.data import TWIN_LABEL, DeviceInfo, Point, ReportData, StudyAnswer, Trace
from tuner.scenario import label as scenario_label
from tuner.space import Config, SearchSpace, spelling
from tuner.storage import prepare_sqlite
from tuner.sweep import run_sweep

TRACE_PERIOD_S = 0.05
# What an external meter says about itself (analyzer, ranges) and the device meter read beside it.
METER_DETAILS = ("analyzer", "ptd_version", "amps_range", "volts_range", "objective", "also", "also_rails", "server")


@dataclass(frozen=True)
class Plan:
    """One device's narrowed space and the knobs whose values name a point's group."""

    device: Device
    space: SearchSpace
    group_knobs: list[str]
    note: str = ""

    def group(self, config: Config) -> str:
        """``15W``, ``precision=fp16 graph=eager``, or ``default`` when nothing but the batch size varies."""
        parts = [
            str(config.knobs[k]) if k == self.space.mode_knob else f"{k}={spelling(config.knobs[k])}"
            for k in self.group_knobs
        ]
        return " ".join(parts) or "default"


def check_modes(modes: list[str], devices: list[Device]) -> None:
    """Every listed mode must be a mode of at least one device: a typo is not silently skipped."""
    known = {m for d in devices for m in d.space().modes}
    unknown = [m for m in modes if m not in known]
    if unknown:
        shown = ", ".join(sorted(known)) or "none (no device here has power modes)"
        raise ConfigurationError(
            f"unknown mode {unknown[0]!r}{did_you_mean(unknown[0], sorted(known))}: modes here are {shown}"
        )


def plan(
    device: Device,
    modes: list[str] | None,
    knobs: list[str] | None,
    batch_sizes: list[int] | None,
    settings: WindowSettings,
) -> Plan:
    """The space a device is characterized over: its listed modes (all if none listed) times ``knobs``.

    SingleStream runs one sample per query, so its batch size is 1; Server
    keeps the batching timeout fixed (the window's options), so a row is one
    maximum batch size.
    """
    space = device.space()
    tuned = list(knobs or [])
    if space.mode_knob is not None and space.mode_knob not in tuned:
        listed = [str(v) for v in space.knobs[space.mode_knob].values]
        keep = listed if modes is None else [m for m in modes if m in listed]
        if modes is not None and not keep:
            raise ConfigurationError(
                f"none of --modes {','.join(modes)} is a mode of {device.name}: its modes are {', '.join(listed)}"
            )
        values = [v for v in space.knobs[space.mode_knob].values if str(v) in keep]
        space = space.model_copy(deep=True)
        space.knobs[space.mode_knob] = space.knobs[space.mode_knob].model_copy(
            update={"values": values, "default": values[0]}
        )
        tuned.insert(0, space.mode_knob)
    space = space.narrow(knobs=tuned, batch_sizes=batch_sizes)
    if settings.scenario == "singlestream":
        space = space.narrow(batch_sizes=[1])
    note = ""
    if modes is not None and space.mode_knob is None:
        note = f"{device.name} has no power modes: --modes does not apply to it, its group is its default configuration"
    return Plan(device, space, tuned, note)


def study_points(
    storage: str, device: Device, model: str, settings: WindowSettings
) -> dict[str, tuple[Measurement, str]]:
    """Measurements a study storage already holds for this device, model and scenario, by effective configuration.

    Only completed trials that measured count (a failed trial has no figure; a
    reused one copies a trial that is already counted); a configuration
    measured by several trials gives the one holding most windows (its mean).
    """
    found: dict[str, tuple[Measurement, str]] = {}
    for study in matching_studies(storage, device, model, settings):
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        most: dict[str, optuna.trial.FrozenTrial] = {}
        for t in done:
            held = most.get(t.user_attrs.get("effective_key", ""))
            if held is None or windows(t) >= windows(held):
                most[t.user_attrs.get("effective_key", "")] = t
        for trial in most.values():
            a = trial.user_attrs
            if "reused_from" in a or "effective" not in a or "meter" not in a or any(k not in a for k in METRIC_KEYS):
                continue
            key = _key(Config(knobs=a["effective"], batch_size=int(a["batch_size"])))
            found[key] = (trial_measurement(trial), f"study {study.study_name} trial {trial.number}")
    return found


def matching_studies(storage: str, device: Device, model: str, settings: WindowSettings) -> list[optuna.Study]:
    """The studies of a storage for this device, model and scenario (Server: at this rate)."""
    from tuner.study import open_study

    prepare_sqlite(storage, readonly=True)
    try:
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as exc:
        raise ConfigurationError(f"cannot read --from-study {storage}: {type(exc).__name__}: {exc}") from None
    rate = settings.options.get("server_target_qps")
    out = []
    for summary in summaries:
        attrs = summary.user_attrs
        if attrs.get("device") != device.name or attrs.get("model") != model:
            continue
        if attrs.get("scenario", "offline") != settings.scenario or attrs.get("target_qps") != rate:
            continue
        out.append(open_study(summary.study_name, storage, readonly=True))
    return out


def trial_measurement(trial: optuna.trial.FrozenTrial) -> Measurement:
    """A measured trial's figures as a Measurement (a confirmed trial's are the mean of its windows)."""
    a = trial.user_attrs
    figures = {k: a[k] for k in (*METRIC_KEYS, *ORIGIN_KEYS) if k in a}
    return Measurement(**{**figures, "queries": round(figures["queries"])})


def study_answers(storage: str, device: Device, model: str, settings: WindowSettings) -> list[StudyAnswer]:
    """Each matching study's recommended configuration: tuner.records' answer, the one every command names."""
    answers = []
    for study in matching_studies(storage, device, model, settings):
        best = study_recommended(study)
        if best is None or any(k not in best.user_attrs for k in METRIC_KEYS):
            continue
        attrs = best.user_attrs
        answers.append(
            StudyAnswer(
                device=device.name,
                model=model,
                study=study.study_name,
                trial=best.number,
                max_latency_ms=float(study.user_attrs.get("max_latency_ms", 0.0)),
                percentile=str(study.user_attrs.get("percentile", "p99")),
                config=Config(
                    knobs=dict(attrs.get("effective", attrs.get("config", {}))), batch_size=int(attrs["batch_size"])
                ),
                measurement=trial_measurement(best),
                saved=saved_of(study),
            )
        )
    return answers


def _key(config: Config) -> str:
    return json.dumps(config.key())


def measure_plan(
    p: Plan,
    model: str,
    settings: WindowSettings,
    reuse: dict[str, tuple[Measurement, str]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Point]:
    """Every configuration of the plan: reused where a study has it, measured otherwise."""
    reuse = reuse or {}
    configs = p.space.grid()
    missing = [c for c in configs if _key(c) not in reuse]
    measured: dict[str, Point] = {}
    if missing:
        rows = run_sweep(p.device, p.space, model, settings, progress, configs=missing)
        for row in rows:
            measured[_key(row.config)] = Point(
                device=p.device.name,
                model=model,
                group=p.group(row.config),
                config=row.config,
                measurement=row.measurement,
                error=row.error,
                source=TWIN_LABEL if p.device.simulated else "measured",
            )
    points = []
    for c in configs:
        key = _key(c)
        if key in measured:
            points.append(measured[key])
        else:
            m, source = reuse[key]
            points.append(
                Point(device=p.device.name, model=model, group=p.group(c), config=c, measurement=m, source=source)
            )
    return points


def power_trace(device: Device, model: str, point: Point, settings: WindowSettings) -> Trace | None:
    """Power over time of one window of ``point``'s configuration.

    Hardware that reads instantaneous power (``read_power_w``) is sampled
    every 50 ms while one window of the configuration runs (warm-up
    included). A twin models a window's mean power only, so its trace is
    that mean, labelled as such. Other devices give no trace.
    """
    if point.measurement is None:
        return None
    base = {"device": device.name, "model": model, "group": point.group, "batch_size": point.config.batch_size}
    if device.simulated:
        m = point.measurement
        return Trace(
            **base,
            kind="twin-mean",
            t_s=[0.0, m.duration_s],
            watts=[m.avg_w, m.avg_w],
            note="digital twin: the modelled mean power of the window (the twin models no variation within it)",
        )
    read = getattr(device, "read_power_w", None)
    if read is None:
        return None
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()

    def sample() -> None:
        samples.append((time.monotonic() - t0, float(read())))

    poller = Poller(sample, TRACE_PERIOD_S, "report-trace")
    with hardware_session(device):
        device.apply(point.config)
        sample()
        poller.start()
        try:
            device.measure(model, point.config, settings)
        finally:
            poller.stop()
        sample()
    finite = [(t, w) for t, w in samples if math.isfinite(w)]
    return Trace(
        **base,
        kind="sampled",
        t_s=[t for t, _ in finite],
        watts=[w for _, w in finite],
        note=f"sampled every {TRACE_PERIOD_S * 1e3:.0f} ms over one measurement (warm-up and window)",
    )


def device_info(device: Device, points: list[Point], note: str = "") -> DeviceInfo:
    """The device's provenance plus the meters and rails its measurements name, and an outside meter's details."""
    measured = [p.measurement for p in points if p.measurement is not None]
    details = {
        key.removeprefix("meter_"): str(value)
        for m in measured
        for key, value in m.extra.items()
        if key.removeprefix("meter_") in METER_DETAILS
    }
    return DeviceInfo(
        device=device.name,
        twin=bool(device.simulated),
        provenance=provenance(device),
        meters=sorted({m.meter for m in measured}),
        rails=sorted({r for m in measured for r in m.rails}),
        meter_details=details,
        notes=[note] if note else [],
    )


def plans_for(
    devices: list[Device],
    settings: WindowSettings,
    modes: list[str] | None = None,
    knobs: list[str] | None = None,
    batch_sizes: list[int] | None = None,
) -> list[Plan]:
    """Each device's plan, every mistake (a mode no device has, a knob or batch size a space lacks) found first."""
    if modes is not None:
        check_modes(modes, devices)
    return [plan(d, modes, knobs, batch_sizes, settings) for d in devices]


def make_report(
    plans: list[Plan],
    models: list[str],
    settings: WindowSettings,
    command: str,
    max_latency_ms: float | None = None,
    from_study: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> ReportData:
    """Measure (or reuse) every device x model x group x batch size, and one power trace per device and model.

    The trace is of the recommended configuration, the one a reader acts on.
    """
    points: list[Point] = []
    traces: list[Trace] = []
    infos: list[DeviceInfo] = []
    answers: list[StudyAnswer] = []
    for p in plans:
        mine: list[Point] = []
        with hold(p.device):
            for model in models:
                reuse = study_points(from_study, p.device, model, settings) if from_study else None
                label = f"{model} on {p.device.name}"
                tick = None if progress is None else (lambda done, total, label=label: progress(label, done, total))
                found = measure_plan(p, model, settings, reuse, tick)
                theirs = study_answers(from_study, p.device, model, settings) if from_study else []
                answers += theirs
                best = answer_point(theirs, settings.percentile, max_latency_ms) or recommended(
                    found, settings.percentile, max_latency_ms
                )
                trace = None if best is None else power_trace(p.device, model, best, settings)
                if trace is not None:
                    traces.append(trace)
                mine += found
        points += mine
        infos.append(device_info(p.device, mine, p.note))
    return ReportData(
        created=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        scenario=scenario_label(settings),
        percentile=settings.percentile,
        max_latency_ms=max_latency_ms,
        models=models,
        devices=infos,
        points=points,
        traces=traces,
        answers=answers,
    )


def answer_point(answers: list[StudyAnswer], percentile: str, bound_ms: float | None) -> Point | None:
    """The study answer at the report's bound and percentile, as a point; None when no study has that bound."""
    for a in answers:
        if a.max_latency_ms == bound_ms and a.percentile == percentile:
            return a.point()
    return None
