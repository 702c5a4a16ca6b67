"""The Python face of powertune: tune a model, measure one configuration, open a device.

``tune run`` and ``tune measure`` call these functions; a script calls them the
same way and gets typed results back instead of printed tables::

    import tuner

    result = tuner.tune("resnet50", "sim:orin", max_latency="50ms", trials=20)
    print(result.answer.config.knobs, result.answer.j_per_query)

Every mistake a caller can make is raised as a :class:`tuner.errors.UserError`
subclass (:class:`~tuner.errors.ConfigurationError`,
:class:`~tuner.errors.DeviceError`, ...) whose message names the fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.devices.base import Device
from tuner.devices.registry import check_meter
from tuner.devices.registry import open_device as _open_device
from tuner.errors import ConfigurationError, DeviceError, UserError, did_you_mean
from tuner.measure.settings import DEFAULT_MIN_WINDOW_S, WindowSettings
from tuner.measurement import TOKEN_KEYS, Measurement
from tuner.models import check_model
from tuner.plumbing.units import parse_latency_ms
from tuner.records import trial_record
from tuner.run_options import RunOptions
from tuner.scenario import split
from tuner.space import Config, KnobValue
from tuner.study import StudyRequest, TrialCallback, measure_space, tune_study
from tuner.study import StudyResult as RunReport
from tuner.sweep import measure_repeats

__all__ = ["Answer", "StudyResult", "configuration", "measure", "measure_repeats_of", "open_device", "tune"]


class Answer(BaseModel):
    """A measured configuration and what it costs: a study's recommended one, or a point of its front.

    ``j_per_query`` is device energy per query in joules; latencies are in
    milliseconds (per batch in Offline, per query in Server and SingleStream);
    ``windows`` says how many measured windows the figures are the mean of.
    An LLM's answer has ``tokens`` too (tuner.measurement.TOKEN_KEYS: J per
    output token, tokens/s, TTFT and TPOT percentiles in ms).
    """

    model_config = ConfigDict(extra="forbid")

    trial: int
    config: Config
    j_per_query: float
    tokens: dict[str, float] = Field(default_factory=dict)
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    qps: float | None = None
    avg_w: float | None = None
    feasible: bool
    windows: int = 1
    verdict: str | None = None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> Answer:
        """The answer a completed trial gives, read as every result file reads it (tuner.records)."""
        record = trial_record(trial)
        return cls(
            trial=record["trial"],
            config=Config(knobs=record["config"], batch_size=record["batch_size"]),
            **{key: record[key] for key in ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")},
            feasible=record["feasible"],
            windows=record["windows"],
            verdict=record["verdict"],
            tokens={key: float(record[key]) for key in TOKEN_KEYS if record.get(key) is not None},
        )


class StudyResult(RunReport):
    """What :func:`tune` returns: the recommended configuration, the front, the study and the run's report.

    ``answer`` is the study's one recommended configuration (Optuna's best
    trial, the one ``tune export`` writes), None while no trial meets the
    bound. ``front`` is the energy/latency Pareto front within the bound,
    cheapest first. ``study`` is the Optuna study itself, for anything else
    (``study.trials``, optuna.visualization). The inherited fields are the
    report ``tune run`` prints: ``summary``, ``device``, ``twin``, ``results``
    (the folder of pareto.json, trials.csv, ...), ``seconds``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    answer: Answer | None = Field(default=None, exclude=True)
    front: list[Answer] = Field(default_factory=list, exclude=True)


def open_device(
    name: str,
    *,
    allow_clock_changes: bool = False,
    sysfs_root: str | Path | None = None,
    space_file: str | Path | None = None,
) -> Device:
    """Open a device by the name ``--device`` takes.

    Opening reads the device (its search space, its meters) and writes
    nothing: hardware is changed only while a measurement holds it, and put
    back afterwards.

    Args:
        name: ``sim:orin``, ``sim:orin-nano``, ``sim:h200`` (digital twins), ``cuda:0``, ``cpu``,
            ``orin``, ``orin-nano``, ``xavier``, ``tx2``, or ``py:package.module:Class``.
        allow_clock_changes: a datacenter GPU's clocks and power limit become knobs (needs root);
            without it they are read and pinned.
        sysfs_root: a Jetson board's sysfs tree elsewhere than ``/`` (containers, tests).
        space_file: a search-space YAML file to use instead of the device's own.

    Returns:
        The device, with ``name``, ``kind``, ``simulated`` and ``space()``.

    Raises:
        DeviceError: an unknown name, or a device that cannot be opened here.
        ConfigurationError: an option this kind of device does not take, or a bad space file.

    Example:
        >>> import tuner
        >>> board = tuner.open_device("sim:orin")
        >>> board.simulated
        True
    """
    options: dict[str, Any] = {}
    if sysfs_root is not None:
        options["sysfs_root"] = Path(sysfs_root)
    try:
        return _open_device(
            name,
            allow_clock_changes=allow_clock_changes,
            space_file=None if space_file is None else str(space_file),
            **options,
        )
    except UserError as exc:
        if type(exc) is not UserError:
            raise
        raise DeviceError(str(exc)) from exc  # what opening a device refuses is the device's, unless said otherwise


def tune(
    model: str,
    device: str,
    max_latency: str | float | None = "50ms",
    *,
    on_trial: TrialCallback | None = None,
    on_note: Callable[[str], None] | None = None,
    allow_clock_changes: bool = False,
    sysfs_root: str | Path | None = None,
    space_file: str | Path | None = None,
    **options: Any,
) -> StudyResult:
    """Find the configuration with the least energy per query whose tail latency meets ``max_latency``.

    Runs (or resumes: the same model, device, scenario and bound is the same
    study) an Optuna study over the device's power knobs and batch size, holds
    the device while it measures and restores it however the run ends, and
    writes the result files (pareto.json, pareto.csv, trials.csv, pareto.png).

    Args:
        model: a zoo model (``resnet50``, ``bert-base``, ...), ``py:package.module:factory``,
            an ``.onnx`` file or a TensorRT engine.
        device: a device name, as :func:`open_device` takes it.
        max_latency: the bound, with a unit (``"50ms"``, ``"0.05s"``) or as milliseconds; None for an LLM
            bounded by its token latencies only (``window``'s ``max_ttft_ms``/``max_tpot_ms``).
        on_trial: called after every trial with the study, the trial and the count measured so far.
        on_note: gets one line for each thing worth saying (a board that disagrees with its space file,
            where the results of an interrupted run were written).
        allow_clock_changes: see :func:`open_device`.
        sysfs_root: see :func:`open_device`.
        space_file: see :func:`open_device`.
        **options: the run's options, as :class:`tuner.run_options.RunOptions` names them:
            ``trials`` (40), ``seed``, ``timeout_s``, ``knobs``, ``batch_sizes``, ``sampler``
            (``auto``, ``gp``, ``tpe``, ``random``, ``two-phase``), ``out`` (``studies``),
            ``storage`` (an Optuna storage URL; default ``<out>/tune.db``), ``window``
            (a :class:`tuner.measure.settings.WindowSettings`), ``study_trials``, ``worker_id``,
            ``heartbeat_s``, ``baseline`` (``default``: what the answer is compared against, see
            tuner.baseline; a mode such as ``MAXN``, ``knob=value,...``, or None for no baseline).

    Returns:
        The answer (None when no configuration met the bound), the front, the study and the run's report.

    Raises:
        ConfigurationError: a bad bound, an unknown option, model or knob, a space with nothing to tune.
        DeviceError: the device cannot be opened or measured here, or refused a configuration.
        StorageError: the study storage cannot be opened or holds a study of another space.
        KeyboardInterrupt: Ctrl-C or a termination signal; the device was restored first.

    Example:
        >>> import tuner
        >>> result = tuner.tune("resnet50", "sim:orin", "50ms", trials=8, out="studies")
        >>> result.answer.p99_ms <= 50
        True
    """
    if max_latency is None:
        bound_ms = math.inf
    else:
        bound_ms = parse_latency_ms(max_latency if isinstance(max_latency, str) else f"{float(max_latency)!r}ms")
    # tune run's window: adaptive from 2 s, seeded like the run, noisy on a twin as hardware is
    options.setdefault("window", WindowSettings(min_window_s=DEFAULT_MIN_WINDOW_S, seed=options.get("seed")))
    options.setdefault("baseline", "default")  # what the answer saved, against the device as it comes
    try:
        run_options = RunOptions(model=model, max_latency_ms=bound_ms, **options)
    except ValidationError as exc:
        problem = _first_problem(exc, [*RunOptions.model_fields])
        raise ConfigurationError(f"tune: {problem}: see help(tuner.tune) for the options") from None
    request = StudyRequest(
        device=device,
        options=run_options,
        allow_clock_changes=allow_clock_changes,
        sysfs_root=None if sysfs_root is None else Path(sysfs_root),
        space_file=None if space_file is None else Path(space_file),
    )
    report = tune_study(request, on_trial=on_trial, on_note=on_note)
    study = report.study
    assert study is not None  # tune_study always returns the study it ran
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    front = [] if report.pareto is None else report.pareto.fronts.get("global", [])
    return StudyResult(
        **{name: getattr(report, name) for name in RunReport.model_fields},
        answer=None if report.summary.best_trial is None else Answer.of(trials[report.summary.best_trial]),
        front=sorted((Answer.of(trials[p.trial]) for p in front if p.feasible), key=lambda a: (a.j_per_query, a.trial)),
    )


def configuration(device: Device, config: Config | Mapping[str, KnobValue], model: str | None = None) -> Config:
    """The configuration a device runs for ``config``: knobs not named at their default, the mode's caps applied.

    Args:
        device: an open device.
        config: a :class:`tuner.space.Config`, or a mapping of knob values with ``batch_size``
            (``{"gpu_mhz": 1300.5, "batch_size": 8}``); the largest batch size when it is left out.

    Returns:
        The effective configuration: what is applied is exactly what is measured.

    Raises:
        ConfigurationError: an unknown knob, a value the device does not offer, a batch size it does not list.

    Given ``model``, a causal LM's configuration is read in its space (tuner.study.measure_space: the LLM
    runner's knobs, ``kv_cache`` and ``max_batch_tokens`` among them, channels_last pinned).

    Example:
        >>> import tuner
        >>> board = tuner.open_device("sim:orin")
        >>> tuner.configuration(board, {"batch_size": 8}).batch_size
        8
    """
    space = device.space() if model is None else measure_space(device, model)
    if not isinstance(config, Config):
        knobs = dict(config)
        batch_size = knobs.pop("batch_size", None)
        base = space.default_config(None if batch_size is None else int(batch_size))
        config = Config(knobs={**base.knobs, **knobs}, batch_size=base.batch_size)
    space.validate_config(config)
    return space.effective(config)


def measure_repeats_of(
    model: str, device: str | Device, config: Config | Mapping[str, KnobValue], repeat: int, **window: Any
) -> list[Measurement]:
    """Apply one configuration once, measure ``repeat`` windows, restore the device: what ``tune measure`` runs.

    Args and Raises are :func:`measure`'s; ``repeat`` windows each draw their own noise on a twin
    (seed, seed + 1, ...).

    Returns:
        One measurement per window, in order.

    Example:
        >>> import tuner
        >>> rows = tuner.api.measure_repeats_of("resnet50", "sim:orin", {"batch_size": 8}, 3, seed=1)
        >>> len(rows)
        3
    """
    dev = open_device(device) if isinstance(device, str) else device
    settings = _window(window)
    check_meter(settings.meter, dev.name)
    check_model(model, settings.runtime, dev.simulated, dev)
    hardware, serving = split(configuration(dev, config, model))
    settings = settings.model_copy(update={"options": {**settings.options, **serving}})
    return measure_repeats(dev, model, hardware, settings, repeat)


def measure(model: str, device: str | Device, config: Config | Mapping[str, KnobValue], **window: Any) -> Measurement:
    """Measure one configuration in one window: energy per query, tail latency, throughput, power.

    The device is put in ``config`` for the window and restored afterwards.
    On a twin the figures are noise-free unless ``seed`` is given, and the
    measurement says ``twin=True``.

    Args:
        model: as :func:`tune` takes it.
        device: a device name, or a device from :func:`open_device`.
        config: as :func:`configuration` takes it.
        **window: how to measure, as :class:`tuner.measure.settings.WindowSettings` names it
            (``window_s`` 10, ``min_window_s`` 2, ``ci`` 0.01, ``percentile``, ``meter``, ``seed``,
            ``scenario``, ``runtime``), or ``window=`` a WindowSettings; the defaults are ``tune measure``'s.

    Returns:
        The window's :class:`tuner.measurement.Measurement`; ``valid`` False with a ``reason`` when
        it must not be trusted (throttling, a runner error).

    Raises:
        ConfigurationError: an unknown model, knob or value, or a bad window option.
        DeviceError: the device cannot be opened or measured here, or refused the configuration.

    Example:
        >>> import tuner
        >>> m = tuner.measure("resnet50", "sim:orin", {"batch_size": 8})
        >>> m.twin and m.j_per_query > 0
        True
    """
    return measure_repeats_of(model, device, config, 1, **window)[0]


def _window(window: dict[str, Any]) -> WindowSettings:
    """The window options as WindowSettings: one given whole (``window=``), or its fields; seeded twins add noise."""
    if "window" in window:
        given = window.pop("window")
        if window or not isinstance(given, WindowSettings):
            raise ConfigurationError("measure: pass either window=WindowSettings(...) or its fields, not both")
        return given
    # tune measure's window: adaptive from 2 s; a twin is noise-free unless seeded
    window.setdefault("noise", window.get("seed") is not None)
    window.setdefault("min_window_s", min(DEFAULT_MIN_WINDOW_S, window.get("window_s", WindowSettings().window_s)))
    try:
        return WindowSettings(**window)
    except ValidationError as exc:
        problem = _first_problem(exc, [*WindowSettings.model_fields])
        raise ConfigurationError(f"measure: {problem}: see help(tuner.measure) for the options") from None


def _first_problem(exc: ValidationError, fields: list[str]) -> str:
    """One line from pydantic's report: the first field it refused, and why (a misspelt one named as such)."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "options"
    if error["type"] == "extra_forbidden":
        return f"unknown option {where!r}{did_you_mean(where, fields)}"
    return f"{where}: {error['msg']}"
