"""The runner protocol: how a measurement window drives a workload.

A window calls ``prepare`` once per configuration (batch size, precision and
runner options are runner knobs), then ``infer`` in a loop while the meter
integrates energy. ``infer`` must block until the batch is done so that
per-batch latency and the energy window cover the real work, not a queued
kernel launch.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tuner.errors import UserError

PRECISIONS = ("fp32", "fp16", "bf16")
OPTIONS = ("channels_last", "cuda_graphs", "compile")


@runtime_checkable
class Runner(Protocol):
    """One model on one device, fed with synthetic batches."""

    name: str
    device: str

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        """Build everything one batch needs; may be called again with new settings."""
        ...

    def infer(self) -> None:
        """Run one batch on the prepared input and wait for it to finish."""
        ...

    def close(self) -> None:
        """Free the model and any device memory."""
        ...


def check_settings(batch_size: int, precision: str, options: dict[str, Any]) -> dict[str, bool]:
    """Validate prepare()'s arguments the same way for every runner.

    Returns the options with every known key present, so runners read flags
    without defaults scattered through their code.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UserError(f"unknown runner option(s) {', '.join(unknown)}: known options are {', '.join(OPTIONS)}")
    return {key: bool(options.get(key, False)) for key in OPTIONS}
