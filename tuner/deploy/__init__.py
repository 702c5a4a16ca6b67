"""Exported best-mode configurations: written by ``tune export``, read by ``tune apply`` and ``tune verify``.

The YAML export is the one answer of a study; :mod:`.formats` renders the same
answer for the tools a deployment uses (nvpmodel, Triton, trtexec, scripts).
An export carries a SHA-256 digest of its own content, so a file edited by
hand (a knob, a bound, the model) is refused instead of deployed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

import optuna
import yaml
from pydantic import BaseModel, ConfigDict

from runners.llm_spec import ENGINE_PREFIX, is_llm
from tuner import __version__
from tuner.baseline import Saved, saved_of
from tuner.devices.base import Device
from tuner.devices.hardware_session import deployment
from tuner.errors import BoundUnmet, ConfigurationError, UserError
from tuner.measurement import TOKEN_KEYS
from tuner.plumbing import atomicfile
from tuner.plumbing.units import format_ms
from tuner.plumbing.yamlfile import load_yaml_model
from tuner.records import RAN_SUFFIXES, fastest, recommended, trial_record, unmet_bound
from tuner.space import Config, parse_assignments
from tuner.storage import redact

EXPORT_VERSION = 2
OLDEST_EXPORT_VERSION = 1
"""Version 2 adds ``saved`` (the answer against its baseline); a version 1 file, which has none, still loads."""


class Provenance(BaseModel):
    """Where an exported mode comes from: the study and trial, and what it was measured on and with.

    ``measured_on`` (hardware name, driver or L4T release, host) and
    ``software`` (tool, torch, onnxruntime, LoadGen versions) are copied from
    the study; exports written before they were recorded lack them.
    """

    model_config = ConfigDict(extra="forbid")

    study: str
    storage: str
    trial: int
    exported_at: str
    tool_version: str = __version__
    meter: str | None = None
    measured_on: dict[str, Any] | None = None
    software: dict[str, str | None] | None = None


class EngineSettings(BaseModel):
    """An LLM study's serving settings, as an engine takes them (tuner.deploy.engines renders the flags).

    ``max_seqs``: the most sequences generated at once (the study's batch
    size); ``precision``, ``graph`` (eager, cudagraphs, compile) and
    ``max_batch_tokens`` (tokens one step may hold) where the study tuned or
    fixed them; ``settings``: the engine file's own knobs (runners.engine_server)
    and ``command``, its command line filled in with them, for a study of a
    server the tool started.
    """

    model_config = ConfigDict(extra="forbid")

    max_seqs: int
    precision: str | None = None
    graph: str | None = None
    max_batch_tokens: int | None = None
    settings: dict[str, Any] = {}
    command: str | None = None


# Fields an export leaves out of its digest when unset, so a file written before they existed still verifies.
OPTIONAL_FIELDS = ("saved", "engine", "max_ttft_ms", "max_tpot_ms")


class ExportedConfig(BaseModel):
    """A deployable power mode: the knobs and batch size, and what they measured.

    ``saved``: what it saves against the study's baseline (tuner.baseline),
    when the study measured one; ``engine``: an LLM study's serving settings;
    ``max_ttft_ms``/``max_tpot_ms``: an LLM study's token bounds (at
    ``percentile``), its ``metrics`` holding J/token, tokens/s and TTFT/TPOT
    p50/p90/p99 beside the per-query figures.
    """

    model_config = ConfigDict(extra="forbid")

    version: int = EXPORT_VERSION
    device_kind: str
    device: str
    twin: bool
    model: str
    batch_size: int
    knobs: dict[str, Any]
    max_latency_ms: float
    percentile: str
    metrics: dict[str, Any]
    provenance: Provenance
    saved: Saved | None = None
    engine: EngineSettings | None = None
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    digest: str | None = None

    def content_digest(self) -> str:
        """SHA-256 of everything but the digest, as canonical JSON (what :func:`load_export` checks).

        An export without ``saved`` digests as a version 1 file did, so those still verify; one without
        engine settings as exports did before they had the field.
        """
        unset = {name for name in OPTIONAL_FIELDS if getattr(self, name) is None}
        body = self.model_dump(mode="json", exclude={"digest"} | unset)
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def document(self) -> dict[str, Any]:
        """The sealed export as its file holds it: ``saved`` left out where there is none, as version 1 wrote it."""
        body = self.sealed().model_dump(mode="json")
        for name in ("saved", "max_ttft_ms", "max_tpot_ms"):
            if body.get(name) is None:
                body.pop(name, None)
        return body

    def sealed(self) -> ExportedConfig:
        return self.model_copy(update={"digest": self.content_digest()})


def export_config(study: optuna.Study, storage: str) -> ExportedConfig:
    """The study's recommended configuration (tuner.records.recommended) as an export."""
    attrs = study.user_attrs
    percentile = attrs.get("percentile", "p99")
    max_latency_ms = float(attrs["max_latency_ms"])
    trial = recommended(study)
    if trial is None:
        trials = study.get_trials(deepcopy=False)
        if fastest(trials) is None:
            raise UserError(
                f"study {study.study_name} has no completed trial under {format_ms(max_latency_ms)} at {percentile}: "
                "run it (tune run resumes it) before exporting"
            )
        unmet = unmet_bound(trials, max_latency_ms, percentile)
        raise BoundUnmet(f"nothing to export from study {study.study_name}: {unmet}")
    record = trial_record(trial)
    metrics = {k: record[k] for k in ("j_per_query", "p50_ms", "p90_ms", "p99_ms", "qps", "avg_w")}
    metrics["meter"] = record["meter"]
    metrics["windows"] = record["windows"]
    metrics["verdict"] = record["verdict"]
    executed = (trial.user_attrs.get("extra") or {}).get("batch_sizes_executed")
    if executed:
        metrics["batch_sizes_executed"] = executed
    ran = clocks_ran(trial.user_attrs.get("extra") or {})
    if ran:
        metrics["clocks_ran"] = ran
    metrics.update({k: record[k] for k in TOKEN_KEYS if record.get(k) is not None})
    measured = dict(attrs.get("provenance") or {})
    software = measured.pop("software", None)
    return ExportedConfig(
        device_kind=attrs["device_kind"],
        device=attrs["device"],
        twin=bool(attrs.get("twin", False)),
        model=attrs["model"],
        batch_size=int(record["batch_size"]),
        knobs=dict(record["config"]),
        max_latency_ms=max_latency_ms,
        percentile=percentile,
        metrics=metrics,
        saved=saved_of(study),
        engine=engine_settings(attrs["model"], int(record["batch_size"]), dict(record["config"])),
        max_ttft_ms=attrs.get("max_ttft_ms"),
        max_tpot_ms=attrs.get("max_tpot_ms"),
        provenance=Provenance(
            study=study.study_name,
            storage=redact(storage),
            trial=trial.number,
            exported_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            meter=record["meter"],
            measured_on=measured or None,
            software=software,
        ),
    )


def engine_settings(model: str, batch_size: int, knobs: dict[str, Any]) -> EngineSettings | None:
    """An LLM study's serving settings (None for any other model): the batch size is its most sequences.

    For a server the tool started from an engine file, its own knobs (``engine:NAME`` in the study) and
    its command line filled in with the trial's values, while the file is still where the study read it.
    """
    if not is_llm(model):
        return None
    own: dict[str, Any] = {}
    command = None
    ran = dict(knobs)
    if model.startswith(ENGINE_PREFIX):
        from runners.engine_server import EngineServer, load_engine
        from runners.openai_engine import ENGINE_KNOB_PREFIX, parse_target

        target = parse_target(model)
        own = {k[len(ENGINE_KNOB_PREFIX) :]: v for k, v in knobs.items() if k.startswith(ENGINE_KNOB_PREFIX)}
        try:
            engine = load_engine(target.engine) if target.engine is not None else None
        except UserError:  # the engine file moved since the study: the settings stay, the command is unknown
            engine = None
        # A server runs its own precision, graph mode and step size unless its command line was given them.
        used = set(engine.placeholders()) if engine is not None else set()
        ran = {k: v for k, v in knobs.items() if k not in COMMAND_KNOBS or k in used}
        if engine is not None:
            values = {**{k: v for k, v in ran.items() if k in COMMAND_KNOBS}, **own, "batch_size": batch_size}
            command = shlex.join(engine.argv(EngineServer(engine, target).values(values)))
    tokens = ran.get("max_batch_tokens")
    return EngineSettings(
        max_seqs=batch_size,
        precision=None if ran.get("precision") is None else str(ran["precision"]),
        graph=None if ran.get("graph") is None else str(ran["graph"]),
        max_batch_tokens=None if tokens in (None, "none", "auto") else int(tokens),
        settings=own,
        command=command,
    )


# The in-process runner's knobs an engine command may name, as the study records them.
COMMAND_KNOBS = ("precision", "graph", "max_batch_tokens")


# The clocks a GPU window sampled (tuner.devices.nvml), carried into the export beside the figures they produced.
CLOCK_EXTRAS = ("sm_mhz_mean", "sm_mhz_min", "sm_mhz_max", "mem_mhz_mean", "mem_mhz_min", "mem_mhz_max", "sm_clock")


def clocks_ran(extra: dict[str, Any]) -> dict[str, Any]:
    """What the device ran in the trial's (last) window: the clocks it sampled (a GPU's SM and memory clocks and
    how the SM clock was held, a Jetson's GPU, CPU, EMC and DLA clocks and its over-current events)."""
    return {k: v for k, v in extra.items() if k in CLOCK_EXTRAS or k.endswith(RAN_SUFFIXES) or k == "oc_events"}


def unlocked_knobs(exported: ExportedConfig, device: Device) -> list[str]:
    """Clock-lock knobs an export names that were not locked when it was measured, so applying it must not lock them.

    A study on a real GPU in observe-only mode measured the driver's boost;
    exports written before the study recorded that (no ``observe_only`` in
    ``measured_on``) carry the applications clock in these knobs, which is not
    what ran. A twin's export keeps them: the twin modelled those locks.
    """
    locks = getattr(device, "lock_knobs", ())
    measured = exported.provenance.measured_on or {}
    if exported.twin or not locks or measured.get("observe_only", True) is False:
        return []
    return [k for k in locks if k in exported.knobs]


def export_yaml(config: ExportedConfig) -> str:
    """The YAML export, sealed with its digest."""
    header = "# powertune best-mode configuration"
    if config.twin:
        header += " (digital twin: simulated, not measured on hardware)"
    return header + "\n" + yaml.safe_dump(config.document(), sort_keys=False)


def write_export(config: ExportedConfig, path: Path) -> None:
    atomicfile.write_text(path, export_yaml(config))


def load_export(path: Path, sealed: bool = False) -> ExportedConfig:
    """Read an exported configuration; a corrupt, foreign or tampered file is a one-line user error.

    A file whose digest does not match its content was edited after export
    and is refused. Exports written before digests were added have none;
    ``sealed`` (what ``tune verify`` asks) refuses those too.
    """
    exported = load_yaml_model(
        path,
        ExportedConfig,
        "exported configuration",
        "re-create it with tune export",
        version=EXPORT_VERSION,
        oldest=OLDEST_EXPORT_VERSION,
        trusted=True,
    )
    if exported.digest is None and sealed:
        raise UserError(f"{path} has no integrity digest (an export from an older tool): re-create it with tune export")
    if exported.digest is not None and exported.digest != exported.content_digest():
        raise UserError(
            f"{path} was changed after export (its digest does not match its content): "
            "re-create it with tune export, never edit an export by hand"
        )
    return exported


def deploy_config(exported: ExportedConfig, device: Device) -> Config:
    """The configuration an export asks of ``device``, checked before anything is written.

    The device kind must match, and every knob value must be one the device
    supports now (a board's own frequency table, a GPU's supported clocks):
    an export from another board or L4T release fails here, not half-way
    through writing. A Jetson mode that only a reboot could enter (or leave)
    is refused here too, with the reboot named.
    """
    if exported.device_kind != device.kind:
        raise UserError(
            f"this export is for {exported.device_kind}, but {device.name} is {device.kind}: "
            "export a configuration tuned on this kind of device"
        )
    space = device.space()
    unlocked = unlocked_knobs(exported, device)
    config = Config(
        knobs={k: v for k, v in exported.knobs.items() if k not in unlocked}, batch_size=exported.batch_size
    )
    reachable = getattr(device, "check_config_reachable", None)
    if reachable is not None:
        reachable(config)  # a Jetson mode of another TPC mask needs a reboot: said before anything else
    getattr(device, "check_config", space.validate_config)(config)
    return config


class DeployPlan(BaseModel):
    """What ``tune apply`` did or would do: the writes, what it cannot apply here, what the runtime needs.

    ``cannot_apply`` lists device knobs this device will not set (an
    observe-only GPU: knob, the value tuned, the value the device runs now);
    ``runtime`` lists what only the serving runtime can honour (batch size,
    precision, CUDA graphs, DLA lanes), which no write on the device makes.
    ``unlocked`` lists clock locks the export names but its study never made
    (an observe-only GPU study: the driver's boost ran), so none is applied.
    """

    writes: list[str]
    cannot_apply: list[tuple[str, Any, Any]] = []
    unlocked: list[str] = []
    runtime: dict[str, Any] = {}
    persisted: str | None = None


def runtime_needs(exported: ExportedConfig, device: Device) -> dict[str, Any]:
    """The batch size and every runner knob of the export: what the serving runtime must be given."""
    space = device.space()
    unlocked = unlocked_knobs(exported, device)
    runner = {
        k: v
        for k, v in exported.knobs.items()
        if k not in unlocked and (k not in space.knobs or space.knobs[k].group == "runner")
    }
    return {"batch_size": exported.batch_size, **runner}


def observe_only_plan(exported: ExportedConfig, device: Device) -> DeployPlan:
    """An observe-only GPU: which device knobs it will not set (tuned vs now), and what the runtime needs."""
    if exported.device_kind != device.kind:
        deploy_config(exported, device)  # the one-line kind mismatch
    current = device.current_clocks() if hasattr(device, "current_clocks") else {}
    space = device.space()
    unlocked = unlocked_knobs(exported, device)
    cannot = [
        (k, v, current.get(k))
        for k, v in exported.knobs.items()
        if k in space.knobs and space.knobs[k].group == "device" and k not in unlocked
    ]
    return DeployPlan(writes=[], cannot_apply=cannot, runtime=runtime_needs(exported, device), unlocked=unlocked)


def is_observe_only(device: Device) -> bool:
    return getattr(device, "allow_clock_changes", True) is False and hasattr(device, "current_clocks")


def apply_export(exported: ExportedConfig, device: Device, dry_run: bool = False, persist: bool = False) -> DeployPlan:
    """Apply an export for deployment; return what was (or, dry-run, would be) written.

    The original state is journaled first and is not restored at exit: the
    mode stays until ``tune restore``. The device is locked meanwhile, and an
    apply that fails or is interrupted is undone (see :func:`deployment`). Applying twice is harmless: the device
    writes only what differs, and the journal keeps the state from before the
    first apply. An observe-only GPU writes nothing: the plan says which
    knobs it cannot apply instead. ``persist`` (a Jetson board) makes the mode
    survive a reboot as a custom nvpmodel mode (tuner.devices.jetson.persist).
    """
    if is_observe_only(device):
        if persist:
            raise UserError(f"--persist is for Jetson boards (a custom nvpmodel mode); {device.name} is not one")
        if dry_run:
            return observe_only_plan(exported, device)
    config = deploy_config(exported, device)
    needs = runtime_needs(exported, device)
    if persist:
        return _persist(exported, device, config, dry_run, needs)
    return _deploy(
        device, config, dry_run, DeployPlan(writes=[], runtime=needs, unlocked=unlocked_knobs(exported, device))
    )


def _deploy(device: Device, config: Config, dry_run: bool, plan: DeployPlan) -> DeployPlan:
    """Write ``config`` to the device to stay (journaled first, undone if cut short); ``plan`` gets the steps."""
    planner = getattr(device, "plan_writes", None)
    steps = (
        [w.shell() for w in planner(config)] if planner is not None else [f"{k}={v}" for k, v in config.knobs.items()]
    )
    plan = plan.model_copy(update={"writes": steps})
    if dry_run or device.simulated:
        return plan
    with deployment(device):
        device.apply(config)
        missed = getattr(device, "settings_not_held", list)()
        if missed:
            raise UserError(
                f"{device.name} did not take the configuration ({'; '.join(missed)}): it was put back; "
                "apply settings this card holds"
            )
    return plan


def hand_config(device: Device, assignments: list[str]) -> Config:
    """The configuration ``--set knob=value ...`` names, checked against the device's tables like an export.

    Knobs left out keep their default (a Jetson board: the mode it is in,
    each clock at that mode's top; a GPU's clock locks stay with the
    driver). A bad knob or value is one line naming what the device offers;
    a Jetson mode of another TPC mask is refused with its reboot named.
    """
    space = device.space()
    named = parse_assignments(assignments, space)
    if not named:
        raise ConfigurationError("--set names no knob: write knob=value, e.g. --set gpu_mhz=816 (tune apply --help)")
    knobs = {k: v for k, v in space.default_config().knobs.items() if k not in getattr(device, "lock_knobs", ())}
    config = Config(knobs={**knobs, **named}, batch_size=space.batch_sizes[-1])
    reachable = getattr(device, "check_config_reachable", None)
    if reachable is not None:
        reachable(config)
    getattr(device, "check_config", space.validate_config)(config)
    if space.mode_knob is not None and set(space.knobs) <= set(config.knobs):
        config = space.effective(config)
    return config


def apply_hand(device: Device, assignments: list[str], dry_run: bool = False) -> tuple[Config, DeployPlan]:
    """Apply a hand-chosen mode (``tune apply --set``) as an export is applied: journaled, restorable, checked first.

    Runner knobs among them (precision, ...) are no write on the device: the
    plan names them for the runtime. An observe-only GPU writes nothing, so
    it is refused with the flag that lets it write.
    """
    if is_observe_only(device):
        raise UserError(
            f"{device.name} is observe-only: tune apply --set writes its clocks or power limit; "
            "add --allow-clock-changes (as root)"
        )
    config = hand_config(device, assignments)
    space = device.space()
    named = parse_assignments(assignments, space)
    runner = {k: v for k, v in named.items() if space.knobs[k].group == "runner"}
    return config, _deploy(device, config, dry_run, DeployPlan(writes=[], runtime=runner))


def _persist(
    exported: ExportedConfig, device: Device, config: Config, dry_run: bool, needs: dict[str, Any]
) -> DeployPlan:
    from tuner.devices.jetson.device import JetsonDevice
    from tuner.devices.jetson.persist import custom_mode, mode_name, persist, saved_conf

    if not isinstance(device, JetsonDevice):
        raise UserError(
            f"--persist makes a custom nvpmodel mode of a Jetson board's conf; {device.name} is not a Jetson board"
        )
    name = mode_name(exported.model, exported.sealed().digest or "")
    path, text, mode = custom_mode(device, config, name)
    steps = [f"add POWER_MODEL ID={mode.id} NAME={mode.name} to {path} as the DEFAULT"]
    steps.append(f"{device.nvpmodel} -m {mode.id}")
    if dry_run:
        return DeployPlan(writes=steps, runtime=needs, persisted=mode.name)
    with deployment(device, saved={"persist": saved_conf(device)}):
        persist(device, mode, path, text)
    return DeployPlan(writes=steps, runtime=needs, persisted=mode.name)
