"""What a study saved: its answer against the configuration the user runs today, measured once per study.

The baseline is the device as it comes, at the answer's batch size and the
runtime's defaults: every knob of the study's space at its default (a twin:
its modelled default, MAXN on the Jetson twins; a Jetson board: the mode it
is in when the run starts, else its conf's default, at that mode's top
clocks; an NVIDIA GPU: no clock locked, the driver's boost, and the power
limit the space defaults to). ``--baseline`` names another one: a power mode
(``MAXN``) or ``knob=value`` items (``nvpmodel=50W,gpu_mhz=816``), the other
knobs at their defaults, checked against the device's tables before the run
starts.

It is measured like a trial (one window of the run's settings, the
configuration applied inside a hardware session that journals the device
first and restores it after), but with no early cut, since its figure is
the one compared against. It is stored in the study's user attributes
(``BASELINES_ATTR``: one record per baseline and batch size), never as a
trial, so it is never a candidate answer and samplers never see it; resume,
``tune pareto``, ``tune export`` and ``tune report`` read it back without
measuring again. A resumed study whose answer moved to another batch size
measures the baseline once more, at that size.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.devices.base import Device
from tuner.errors import ConfigurationError
from tuner.measure.settings import WindowSettings
from tuner.measurement import TOKEN_KEYS, Measurement
from tuner.records import recommended
from tuner.space import Config, KnobValue, SearchSpace, parse_assignments

DEFAULT = "default"
BASELINES_ATTR = "baselines"
SPEC_ATTR = "baseline_spec"
RECORD_VERSION = 1
FIGURES = ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")


class BaselineRecord(BaseModel):
    """One measured baseline of a study: which one, at which batch size, what it ran and measured."""

    model_config = ConfigDict(extra="forbid")

    version: int = RECORD_VERSION
    spec: str
    label: str
    batch_size: int
    config: dict[str, Any]
    valid: bool
    reason: str = ""
    figures: dict[str, float] = Field(default_factory=dict)
    meter: str = ""
    twin: bool = False


class Saved(BaseModel):
    """The answer against its baseline, as an export carries it (``tune export``'s ``saved``).

    ``less_energy_pct``: how much less energy per query the answer takes than
    the baseline (negative: more); None when the baseline could not be
    measured. ``baseline_meets_bound``: whether the baseline's own tail
    latency met the study's bound (a baseline that misses it is said so).
    """

    model_config = ConfigDict(extra="forbid")

    baseline: str
    batch_size: int
    config: dict[str, Any]
    j_per_query: float | None = None
    latency_ms: float | None = None
    baseline_meets_bound: bool | None = None
    less_energy_pct: float | None = None
    line: str


def parse_spec(text: str | None, space: SearchSpace) -> dict[str, KnobValue]:
    """The knobs a ``--baseline`` names: a power mode by name, or ``knob=value`` items, comma-separated.

    ``default`` (or nothing) names none: every knob at its default. A bad
    knob or value is a one-line error naming what the space offers.
    """
    if text is None or text.strip().lower() in ("", DEFAULT):
        return {}
    items = [item.strip() for item in text.split(",") if item.strip()]
    assignments = [item for item in items if "=" in item]
    modes = [item for item in items if "=" not in item]
    if modes:
        if space.mode_knob is None:
            raise ConfigurationError(
                f"--baseline {modes[0]}: {space.kind} has no power modes; write knob=value, "
                f"e.g. --baseline {next(iter(space.knobs), 'knob')}=VALUE"
            )
        if len(modes) > 1:
            raise ConfigurationError(f"--baseline names two power modes ({', '.join(modes)}): name one")
        assignments.append(f"{space.mode_knob}={modes[0]}")
    return parse_assignments(assignments, space)


def label_of(text: str | None, device: Device, space: SearchSpace) -> str:
    """How a line names the baseline: the default by what it is, the user's own by what they wrote."""
    if text is not None and text.strip().lower() not in ("", DEFAULT):
        items = [item.strip() for item in text.split(",") if item.strip()]
        return ", ".join(item if "=" in item else f"mode {item}" for item in items)
    full = device.space()
    if full.mode_knob is not None:
        return f"the default mode {full.knobs[full.mode_knob].default}"
    if getattr(device, "lock_knobs", ()):
        return "the default clocks (none locked)"
    return "the default configuration"


def baseline_config(device: Device, space: SearchSpace, text: str | None, batch_size: int) -> Config:
    """The configuration a baseline runs at ``batch_size``: the study space's defaults, with what ``text`` names.

    The device's part is checked against its own space and tables before
    anything is written (a Jetson mode of another TPC mask is refused with
    its reboot named) and lowered to the mode's caps; serving knobs (a
    Server study's batching) stay at the study's defaults. The default on a
    GPU leaves its clock locks out: the driver's boost runs, as on a card
    nobody tuned.
    """
    full = device.space()
    named = parse_spec(text, full)
    defaults = space.default_config(batch_size).knobs
    if full.mode_knob is not None:  # the device's own mode, whatever --modes the study searched
        defaults[full.mode_knob] = full.knobs[full.mode_knob].default
    own = {k: v for k, v in {**defaults, **named}.items() if k in full.knobs}
    if not named:
        own = {k: v for k, v in own.items() if k not in getattr(device, "lock_knobs", ())}
    config = Config(knobs=own, batch_size=batch_size)
    reachable = getattr(device, "check_config_reachable", None)
    if reachable is not None:
        reachable(config)
    getattr(device, "check_config", full.validate_config)(config)
    if full.mode_knob is not None and set(full.knobs) <= set(own):
        config = full.effective(config)
    serving = {k: v for k, v in defaults.items() if k not in full.knobs}
    return Config(knobs={**config.knobs, **serving}, batch_size=batch_size)


def measure(
    device: Device, model: str, config: Config, settings: WindowSettings, text: str | None, label: str
) -> BaselineRecord:
    """Apply the baseline and measure one window of it (the caller holds the device in a hardware session).

    The window is the run's, without its early cuts: the baseline's figure
    is what the answer is judged against, so it runs whole.
    """
    own = set(device.space().knobs)
    hardware = Config(knobs={k: v for k, v in config.knobs.items() if k in own}, batch_size=config.batch_size)
    serving = {k: v for k, v in config.knobs.items() if k not in own}
    window = settings.model_copy(
        update={"bound_ms": None, "cut_j_per_query": None, "options": {**settings.options, **serving}}
    )
    device.apply(hardware)
    m = device.measure(model, hardware, window)
    return BaselineRecord(
        spec=spec_key(text),
        label=label,
        batch_size=config.batch_size,
        config=dict(config.knobs),
        valid=m.valid,
        reason=m.reason,
        figures={**{key: float(getattr(m, key)) for key in FIGURES}, **_token_figures(m)},
        meter=m.meter,
        twin=m.twin,
    )


def from_trial(trial: optuna.trial.FrozenTrial, text: str | None, label: str) -> BaselineRecord:
    """A baseline read from a completed, uncut trial that ran its very configuration (that trial's figures)."""
    attrs = trial.user_attrs
    figures = {key: float(attrs[key]) for key in (*FIGURES, *TOKEN_KEYS) if isinstance(attrs.get(key), int | float)}
    return BaselineRecord(
        spec=spec_key(text),
        label=label,
        batch_size=int(attrs["batch_size"]),
        config=dict(attrs.get("effective") or {}),
        valid=True,
        figures=figures,
        meter=str(attrs.get("meter", "")),
        twin=bool(attrs.get("twin", False)),
    )


def _token_figures(m: Measurement) -> dict[str, float]:
    """An LLM baseline's token figures (J per output token, TTFT, TPOT), which its study's answer is judged on."""
    return {} if m.tokens is None else {key: float(getattr(m.tokens, key)) for key in TOKEN_KEYS}


def failed(config: Config, text: str | None, label: str, reason: str) -> BaselineRecord:
    """A baseline whose window could not be trusted (or whose configuration the device refused): kept with why."""
    return BaselineRecord(
        spec=spec_key(text),
        label=label,
        batch_size=config.batch_size,
        config=dict(config.knobs),
        valid=False,
        reason=reason,
    )


def spec_key(text: str | None) -> str:
    return (text or DEFAULT).strip() or DEFAULT


def stored(study: optuna.Study, text: str | None, batch_size: int) -> BaselineRecord | None:
    """The baseline ``text`` names at ``batch_size`` as the study holds it, or None when it was never measured."""
    for raw in study.user_attrs.get(BASELINES_ATTR, []):
        try:
            record = BaselineRecord.model_validate(raw)
        except ValidationError:
            continue
        if record.spec == spec_key(text) and record.batch_size == batch_size:
            return record
    return None


def store(study: optuna.Study, record: BaselineRecord) -> None:
    """Keep ``record`` in the study (replacing one of the same baseline and batch size), and name it the current one."""
    kept = [
        raw
        for raw in study.user_attrs.get(BASELINES_ATTR, [])
        if (raw.get("spec"), raw.get("batch_size")) != (record.spec, record.batch_size)
    ]
    study.set_user_attr(BASELINES_ATTR, [*kept, record.model_dump()])
    study.set_user_attr(SPEC_ATTR, record.spec)


def saved(answer_j: float, record: BaselineRecord, bound_ms: float, percentile: str) -> Saved:
    """The answer's energy per query (an LLM's per output token) against the baseline's, and the line printed."""
    per_token = "j_per_token" in record.figures
    key, unit = ("j_per_token", "output token") if per_token else ("j_per_query", "query")
    bound = f"{percentile} <= {bound_ms:g} ms" if math.isfinite(bound_ms) else "its token bounds"
    if not record.valid or record.figures.get(key, 0.0) <= 0:
        why = record.reason or "no energy measured"
        return Saved(
            baseline=record.label,
            batch_size=record.batch_size,
            config=record.config,
            line=f"what it saves is unknown: the baseline ({record.label}, batch {record.batch_size}) "
            f"did not measure ({why})",
        )
    base_j = record.figures[key]
    latency = record.figures.get(f"{percentile}_ms")
    meets = latency is not None and latency <= bound_ms
    pct = (1.0 - answer_j / base_j) * 100.0
    amount = f"{pct:.1f}% less" if pct >= 0 else f"{-pct:.1f}% more"
    line = f"{amount} energy per {unit} than {record.label} (batch {record.batch_size}) at {bound}"
    if not meets and latency is not None:
        line += f"; the baseline ran {percentile} {latency:.4g} ms, over the bound"
    elif pct < 0:
        line += ": the baseline is cheaper and meets the bound; widen the space (--knobs, --modes)"
    return Saved(
        baseline=record.label,
        batch_size=record.batch_size,
        config=record.config,
        j_per_query=record.figures.get("j_per_query", base_j),
        latency_ms=latency,
        baseline_meets_bound=meets,
        less_energy_pct=round(pct, 2),
        line=line,
    )


def saved_of(study: optuna.Study) -> Saved | None:
    """What the study's answer saved against the baseline its last run measured, or None (no answer, no baseline)."""
    best = recommended(study)
    attrs = study.user_attrs
    if best is None or best.value is None or SPEC_ATTR not in attrs:
        return None
    batch = best.user_attrs.get("batch_size")
    record = stored(study, attrs[SPEC_ATTR], int(batch)) if batch is not None else None
    if record is None:
        return None
    return saved(float(best.value), record, float(attrs["max_latency_ms"]), str(attrs.get("percentile", "p99")))


def unmeasured_line(study: optuna.Study) -> str | None:
    """Why a study with an answer has no saved line (its baseline was never measured), or None."""
    best = recommended(study)
    if best is None or saved_of(study) is not None:
        return None
    return "what it saves is not known: no baseline was measured for this answer (tune run measures it)"
