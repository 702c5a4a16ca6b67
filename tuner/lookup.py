"""Which study of a storage a reading command means: a model on a device, narrowed by scenario and bound.

Kept apart from tuner.study (the search loop, its samplers and strategies):
``tune status``, ``tune pareto`` and ``tune export`` only read a study back,
and ``tune status`` should start without importing the search machinery.
"""

from __future__ import annotations

import optuna

from tuner.errors import UserError, did_you_mean
from tuner.scenario import format_rate
from tuner.storage import open_storage, redact, scrub, storage_errors


def study_label(attrs: dict) -> str:
    """A study's scenario as ``tune run`` names it: offline, singlestream, server@300qps."""
    scenario = str(attrs.get("scenario", "offline"))
    if scenario == "server":
        return f"server@{format_rate(float(attrs.get('target_qps', 0.0)))}qps"
    return scenario


def _board_kind(device: str, attrs: dict) -> bool:
    """Whether ``device`` is a Jetson board name of the study's kind (``orin`` finds an ``orin-agx`` study)."""
    from tuner.devices.jetson.device import DEVICE_KINDS

    return not attrs.get("twin") and DEVICE_KINDS.get(device) == attrs.get("device_kind")


def find_study(
    storage: str, model: str, device: str, bound_ms: float | None, scenario: str | None = None
) -> optuna.Study:
    """The study of a model on a device, picked by scenario and bound when several exist, opened read-only.

    ``device`` may be what was typed at ``tune run`` (sim:orin, cuda:0), the
    results folder name (sim-orin, h200) or the device kind, so reading
    results never needs the hardware present. ``scenario`` is ``offline``,
    ``singlestream``, ``server`` (any rate) or ``server@300qps``. Where more
    than one study is left, the error lists each with the flags that pick it.
    A twin's other name (``sim:orin-agx``) finds the study of its one name.
    """
    from tuner.devices.registry import canonical_device

    device = canonical_device(device)
    try:
        with storage_errors(storage):
            opened = open_storage(storage, None, readonly=True)
            summaries = optuna.get_all_study_summaries(storage=opened, include_best_trial=False)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(
            f"cannot read study storage {redact(storage)}: {scrub(str(exc).splitlines()[0], storage)}"
        ) from None
    matches = [
        s
        for s in summaries
        if s.user_attrs.get("model") == model
        and device in (s.user_attrs.get("device"), s.user_attrs.get("device_slug"), s.user_attrs.get("device_kind"))
    ]
    if not matches:
        matches = [s for s in summaries if s.user_attrs.get("model") == model and _board_kind(device, s.user_attrs)]
    if not matches:
        models = {str(s.user_attrs.get("model")) for s in summaries}
        devices = {str(s.user_attrs.get(k)) for s in summaries for k in ("device", "device_slug", "device_kind")}
        hint = did_you_mean(model, models) if model not in models else did_you_mean(device, devices)
        raise UserError(
            f"no study of {model} on {device} in {redact(storage)}{hint}: run tune run first, or pass --storage/--out"
        )
    picked = matches
    if scenario is not None:
        picked = [s for s in picked if scenario in (study_label(s.user_attrs), s.user_attrs.get("scenario", "offline"))]
    if bound_ms is not None:
        picked = [s for s in picked if abs(float(s.user_attrs.get("max_latency_ms", -1)) - bound_ms) < 1e-9]
    if len(picked) == 1:
        with storage_errors(storage):
            return optuna.load_study(study_name=picked[0].study_name, storage=opened)
    pool = picked or matches
    choices = "; ".join(
        f"--scenario {study_label(s.user_attrs)} --max-latency {float(s.user_attrs.get('max_latency_ms', 0)):g}ms"
        for s in sorted(pool, key=lambda s: (study_label(s.user_attrs), s.user_attrs.get("max_latency_ms", 0)))
    )
    what = "no study" if not picked else f"{len(picked)} studies"
    verb = "matches" if not picked else "match"
    raise UserError(f"{what} of {model} on {device} {verb}: pick one with {choices}")
