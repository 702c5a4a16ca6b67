"""``tune verify``: does an exported configuration hold on this unit, and if not, a local re-tune seeded by the study.

A fleet of identical boards is tuned once; each unit then checks the answer
in at most three windows: the configuration meets the latency bound on this
unit, and its energy per query is within ``tolerance`` of the study's (a
unit that draws less passes). Two windows that agree decide; a third breaks
a tie. A unit that fails re-tunes locally: a study of its own (named after
the unit's device) that starts from the fleet study's best feasible trials,
enqueued, and runs a handful of trials more, so the unit pays for a few
windows, not a fresh study. With a shared storage every unit's verdict is
written on the fleet study (user attribute ``unit:<name>``), where ``tune
status --fleet`` (tuner.fleet.fleet_summary) reads them all.
"""

from __future__ import annotations

import datetime as dt
import socket
import statistics

import optuna
from pydantic import BaseModel

from tuner.deploy import ExportedConfig, deploy_config
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session
from tuner.errors import UserError
from tuner.fleet import UNIT_PREFIX
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.plumbing import interrupts
from tuner.records import is_feasible, recommended, trial_record
from tuner.run_options import RunOptions
from tuner.scenario import label, split
from tuner.storage import open_storage, storage_errors
from tuner.study import open_study, run_study, study_name

VERDICT_VERSION = 1
MAX_WINDOWS = 3
SEEDED_TRIALS = 4


class Verdict(BaseModel):
    """One unit's verdict on an export, as written on the fleet study and printed."""

    version: int = VERDICT_VERSION
    unit: str
    device: str
    study: str
    trial: int
    verdict: str  # "verified" or "retuned"
    reason: str
    windows: int
    j_per_query: float
    latency_ms: float
    study_j_per_query: float
    max_latency_ms: float
    tolerance: float
    retune: dict | None = None
    at: str

    @property
    def energy(self) -> float:
        """The unit's energy per query as deployed: the re-tuned answer's where it re-tuned."""
        return float(self.retune["j_per_query"]) if self.retune else self.j_per_query


def default_unit(device: Device) -> str:
    return f"{socket.gethostname()}:{device.name}"


def fleet_study(exported: ExportedConfig, storage: str) -> optuna.Study:
    """The study the export came from, in the fleet's storage, checked to be the one that produced it.

    Its model, device kind and bound must be the export's, and its trial must
    hold the exported configuration: an export of another study (or edited
    and re-sealed by hand) is refused.
    """
    name = exported.provenance.study
    with storage_errors(storage):
        names = {s.study_name for s in optuna.study.get_all_study_summaries(open_storage(storage))}
        if name not in names:
            raise UserError(f"study {name} is not in this storage: verify against the storage the export came from")
        study = open_study(name, storage)
    attrs = study.user_attrs
    for key, value in (("model", exported.model), ("device_kind", exported.device_kind)):
        if attrs.get(key) != value:
            raise UserError(f"this export says {key} {value}, but its study {name} is for {attrs.get(key)}: refused")
    trials = [t for t in study.get_trials(deepcopy=False) if t.number == exported.provenance.trial]
    record = trial_record(trials[0]) if trials else None
    if record is None or record["config"] != exported.knobs or record["batch_size"] != exported.batch_size:
        raise UserError(
            f"trial {exported.provenance.trial} of study {name} does not hold this export's configuration: refused"
        )
    return study


def _passes(m: list[Measurement], exported: ExportedConfig, tolerance: float) -> tuple[bool, str]:
    latency = statistics.fmean(x.latency_ms(exported.percentile) for x in m)
    energy = statistics.fmean(x.j_per_query for x in m)
    study_j = float(exported.metrics["j_per_query"])
    if latency > exported.max_latency_ms:
        return False, f"{exported.percentile} {latency:.4g} ms is over the {exported.max_latency_ms:g} ms bound"
    if energy > study_j * (1 + tolerance):
        return False, f"energy {energy / study_j:.3f}x the study's, over its {tolerance:.0%} tolerance"
    return True, f"{exported.percentile} {latency:.4g} ms within the bound, energy {energy / study_j:.3f}x the study's"


def check_windows(
    exported: ExportedConfig, device: Device, settings: WindowSettings, tolerance: float
) -> tuple[list[Measurement], bool, str]:
    """Apply the export and measure it: windows until two agree, at most three; restored after."""
    config = deploy_config(exported, device)
    hardware, serving = split(config)
    settings = settings.model_copy(update={"options": {**settings.options, **serving}})
    windows: list[Measurement] = []
    votes: list[bool] = []
    with hardware_session(device):
        interrupts.check()
        device.apply(hardware)
        while len(windows) < MAX_WINDOWS:
            seed = None if settings.seed is None else settings.seed + len(windows)
            m = device.measure(exported.model, hardware, settings.model_copy(update={"seed": seed}))
            interrupts.check()
            if not m.valid:
                raise UserError(f"window {len(windows) + 1} on {device.name} is not trustworthy ({m.reason}): retry")
            windows.append(m)
            votes.append(_passes([m], exported, tolerance)[0])
            if len(votes) >= 2 and (votes.count(True) >= 2 or votes.count(False) >= 2):
                break
    ok, reason = _passes(windows, exported, tolerance)
    return windows, ok and votes.count(True) >= 2, reason


def retune(
    exported: ExportedConfig, device: Device, study: optuna.Study | None, storage: str, settings: WindowSettings,
    trials: int, seed: int | None,
) -> dict:  # fmt: skip
    """A local study for this unit, seeded with the fleet study's best feasible trials (or the export's own)."""
    name = study_name(exported.model, device, label(settings), exported.max_latency_ms)
    local = open_study(name, storage)
    if study is not None:
        feasible = sorted((t for t in study.get_trials(deepcopy=False) if is_feasible(t)), key=lambda t: t.value)
        seeds = [t.params for t in feasible[:SEEDED_TRIALS]]
    else:
        seeds = [{**exported.knobs, "batch_size": exported.batch_size}]
    for params in seeds:
        local.enqueue_trial(params, skip_if_exists=True)
    options = RunOptions(
        model=exported.model, max_latency_ms=exported.max_latency_ms, trials=trials, seed=seed, storage=storage,
        window=settings, early_stop=False, warm_start=False,
    )  # fmt: skip
    done, summary = run_study(device, options)
    best = recommended(done)
    if best is None:
        raise UserError(
            f"no configuration met {exported.max_latency_ms:g} ms on {device.name} in {trials} local trials: "
            "run tune run on this unit for more"
        )
    record = trial_record(best)
    return {
        "study": summary.study,
        "trials": summary.measured,
        "seeded": len(seeds),
        "trial": best.number,
        "j_per_query": record["j_per_query"],
        "latency_ms": record[f"{exported.percentile}_ms"],
        "batch_size": record["batch_size"],
        "knobs": record["config"],
    }


def verify_unit(
    exported: ExportedConfig,
    device: Device,
    settings: WindowSettings,
    storage: str | None = None,
    local_storage: str | None = None,
    unit: str | None = None,
    tolerance: float = 0.05,
    retune_trials: int = 6,
    seed: int | None = None,
) -> Verdict:
    """Check the export on this unit; re-tune locally if it does not hold; record the verdict with ``storage``."""
    if not 0 < tolerance < 1:
        raise UserError(f"--tolerance {tolerance:g} must be a fraction in (0, 1), e.g. 0.05 for 5%")
    if not 1 <= retune_trials <= 100:
        raise UserError(f"--retune-trials {retune_trials} must be 1..100: a handful of trials, not a study")
    if exported.percentile != settings.percentile:
        settings = settings.model_copy(update={"percentile": exported.percentile})
    study = fleet_study(exported, storage) if storage else None
    windows, ok, reason = check_windows(exported, device, settings, tolerance)
    retuned = None
    if not ok:
        target = storage or local_storage
        if target is None:
            raise UserError("a re-tune needs a storage: give --storage (the fleet's) or --out")
        retuned = retune(exported, device, study, target, settings, retune_trials, seed)
    verdict = Verdict(
        unit=unit or default_unit(device),
        device=device.name,
        study=exported.provenance.study,
        trial=exported.provenance.trial,
        verdict="verified" if ok else "retuned",
        reason=reason,
        windows=len(windows),
        j_per_query=statistics.fmean(m.j_per_query for m in windows),
        latency_ms=statistics.fmean(m.latency_ms(exported.percentile) for m in windows),
        study_j_per_query=float(exported.metrics["j_per_query"]),
        max_latency_ms=exported.max_latency_ms,
        tolerance=tolerance,
        retune=retuned,
        at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    if study is not None:
        with storage_errors(storage or ""):
            study.set_user_attr(UNIT_PREFIX + verdict.unit, verdict.model_dump(mode="json"))
    return verdict
