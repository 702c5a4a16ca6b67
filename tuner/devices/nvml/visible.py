"""Which physical GPU a CUDA ordinal names: ``cuda:N`` as torch sees it, mapped to NVML by UUID.

CUDA numbers only the GPUs that CUDA_VISIBLE_DEVICES lets it see, in the order
that variable lists them; NVML numbers every GPU on the machine. So under
Slurm or a container ``cuda:0`` may be NVML's GPU 3. The rules followed here
are CUDA's own (CUDA Programming Guide, "CUDA Environment Variables",
https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html):

- unset: every GPU is visible; set but empty: none is;
- entries are integer indices or GPU UUIDs (``GPU-8932f937-...``, or a prefix
  of one long enough to name a single GPU); the first entry that names no GPU
  ends the list (``0,2,-1,1`` makes 0 and 2 visible);
- integer indices count GPUs in CUDA's order: PCI bus order under
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, otherwise "fastest first", which agrees
  with PCI bus order only when every GPU is of the same kind.

MIG instances (``MIG-...``) are refused, as Zeus does
(zeus/device/gpu/nvidia.py, NVIDIAGPUs._init_gpus): NVML meters and sets whole
GPUs, so a window on a slice would be charged the other slices' energy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import UserError


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as NVML knows it: the index NVML gives it now, and what names it for good."""

    nvml_index: int
    uuid: str
    pci_bus_id: str
    name: str
    compute_capability: tuple[int, int] | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _compute_capability(nvml: Any, handle: Any) -> tuple[int, int] | None:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception as exc:
        if getattr(exc, "value", None) is None:
            raise
        return None
    return int(major), int(minor)


def physical_gpus(nvml: Any) -> list[PhysicalGpu]:
    """Every GPU NVML lists, in PCI bus order (NVML's own order is not guaranteed to be that)."""
    found = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        found.append(
            PhysicalGpu(
                nvml_index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId).upper(),
                name=_text(nvml.nvmlDeviceGetName(handle)),
                compute_capability=_compute_capability(nvml, handle),
            )
        )
    return sorted(found, key=lambda g: g.pci_bus_id)


def cuda_order(gpus: list[PhysicalGpu], env: Mapping[str, str]) -> list[PhysicalGpu]:
    """The GPUs in the order CUDA numbers them before CUDA_VISIBLE_DEVICES applies; refused where that is unknown."""
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        return gpus
    if len({(g.name, g.compute_capability) for g in gpus}) > 1:
        raise UserError(
            "this machine has GPUs of different kinds, which CUDA numbers fastest first in an order NVML cannot "
            "tell: export CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPU by UUID in CUDA_VISIBLE_DEVICES "
            "(nvidia-smi -L lists them)"
        )
    return gpus


def visible_gpus(nvml: Any, env: Mapping[str, str] | None = None) -> list[PhysicalGpu]:
    """The GPUs CUDA sees, ``cuda:0`` first."""
    env = os.environ if env is None else env
    gpus = physical_gpus(nvml)
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return cuda_order(gpus, env)
    visible: list[PhysicalGpu] = []
    ordered: list[PhysicalGpu] | None = None
    for entry in (e.strip() for e in listed.split(",")):
        if entry.upper().startswith("MIG"):
            raise UserError(
                f"CUDA_VISIBLE_DEVICES names a MIG instance ({entry}): NVML meters and sets whole GPUs, not MIG "
                "slices; name a whole GPU (its index or GPU- UUID) to tune it"
            )
        if entry.lstrip("-").isdigit():
            ordered = cuda_order(gpus, env) if ordered is None else ordered
            number = int(entry)
            gpu = ordered[number] if 0 <= number < len(ordered) else None
        else:
            matches = [g for g in gpus if entry and g.uuid.lower().startswith(entry.lower())]
            gpu = matches[0] if len(matches) == 1 else None
        # CUDA documents an invalid entry as ending the list; a GPU named twice is taken to end it too, so a
        # cuda:N past that point is refused rather than mapped to a card torch may not number the same way.
        if gpu is None or gpu in visible:
            break
        visible.append(gpu)
    return visible


def cuda_gpu(nvml: Any, ordinal: int, env: Mapping[str, str] | None = None) -> PhysicalGpu:
    """The physical GPU behind torch's ``cuda:<ordinal>``; a one-line error naming what is visible otherwise."""
    env = os.environ if env is None else env
    visible = visible_gpus(nvml, env)
    if 0 <= ordinal < len(visible):
        return visible[ordinal]
    listed = env.get("CUDA_VISIBLE_DEVICES")
    under = "" if listed is None else f" under CUDA_VISIBLE_DEVICES={listed!r}"
    if not visible:
        raise UserError(f"no GPU cuda:{ordinal}: no NVIDIA GPU is visible{under}; use --device sim:h200")
    raise UserError(
        f"no GPU cuda:{ordinal}: {len(visible)} NVIDIA GPU(s) visible{under}, cuda:0..cuda:{len(visible) - 1}"
    )
