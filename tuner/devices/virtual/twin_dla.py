"""The Jetson DLAs in the twin: engines beside the GPU that share one Offline queue with it.

What a configuration's DLA knobs add to the GPU's twin result (every figure
comes from ``twin_params/<kind>-dla.json``, which names its sources):

- Throughput: each of ``dla_cores`` DLAs runs ``1 / t`` images per second,
  ``t = ms_mhz_per_image / f_dla + ms_per_image * ref_emc_mhz / f_emc`` (the
  mode's caps apply to both clocks), plus the GPU-fallback layers' time; the
  GPU lane keeps its own throughput (the published figures add up: no
  contention for the EMC between the GPU and the DLAs is modelled).
- Latency: a batch's latency in an Offline window is the slowest lane's, the
  GPU's batch or ``dla_batch_size`` images on a DLA.
- Power: each busy DLA draws the published-ratio figure at its clock, on the
  CV rail; the wall follows from the rails as for the GPU.

A model without published DLA figures gets nothing from its DLA lanes, as if
every layer fell back to the GPU (NVIDIA runs BERT on the GPU alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

import numpy as np
from pydantic import BaseModel, ConfigDict

from tuner.space import Config, SearchSpace

DLA_PARAMS_VERSION = 1


class DlaModel(BaseModel):
    """One model on a DLA: its time per image against clock, and its GPU-fallback time per image."""

    model_config = ConfigDict(extra="forbid")

    ms_mhz_per_image: float
    ms_per_image: float
    ref_emc_mhz: float
    gpu_fallback_ms_per_image: float = 0.0


class DlaParams(BaseModel):
    """The DLA parameters of one board kind (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    version: int = DLA_PARAMS_VERSION
    kind: str
    rail: str
    models: dict[str, DlaModel]
    power_w_per_dla: list[tuple[float, float]]
    sources: dict[str, str]


@dataclass
class DlaLanes:
    """Per configuration: DLA images per second (all DLAs), their watts, and the slowest DLA batch's seconds."""

    qps: np.ndarray
    power_w: np.ndarray
    batch_s: np.ndarray
    per_dla_qps: np.ndarray
    cores: np.ndarray


def load_dla_params(kind: str) -> DlaParams | None:
    """The kind's DLA parameters, or None for a board kind without DLAs."""
    path = resources.files("tuner.devices.virtual") / "twin_params" / f"{kind}-dla.json"
    if not path.is_file():
        return None
    return DlaParams.model_validate(json.loads(path.read_text()))


def dla_lanes(params: DlaParams, space: SearchSpace, model: str, configs: list[Config]) -> DlaLanes:
    """What the DLA knobs of each configuration add (zero where ``dla_cores`` is 0 or the model has no figures)."""
    effective = [space.effective(c) for c in configs]
    cores = np.array([int(c.knobs.get("dla_cores", 0)) for c in effective], dtype=float)
    mhz = np.array([float(c.knobs.get("dla_mhz", 1.0)) for c in effective])
    batch = np.array([int(c.knobs.get("dla_batch_size", 1)) for c in effective], dtype=float)
    figures = params.models.get(model)
    if figures is None:
        zero = np.zeros(len(configs))
        return DlaLanes(zero, zero, zero, zero, np.zeros(len(configs)))
    emc = np.array([float(c.knobs.get("emc_mhz", figures.ref_emc_mhz)) for c in effective])
    memory_ms = figures.ms_per_image * figures.ref_emc_mhz / emc
    per_image_s = (figures.ms_mhz_per_image / mhz + memory_ms + figures.gpu_fallback_ms_per_image) / 1e3
    per_dla = 1.0 / per_image_s
    clocks, watts = zip(*params.power_w_per_dla, strict=True)
    power = np.interp(mhz, clocks, watts)
    return DlaLanes(
        qps=cores * per_dla,
        power_w=cores * power,
        batch_s=np.where(cores > 0, batch * per_image_s, 0.0),
        per_dla_qps=np.where(cores > 0, per_dla, 0.0),
        cores=cores,
    )
