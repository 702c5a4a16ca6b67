"""The runner protocol: how a measurement window drives a workload.

A window calls ``prepare`` once per configuration (batch size, precision and
runner options are runner knobs), then ``infer`` in a loop while the meter
integrates energy. ``infer`` must block until the batch is done so that
per-batch latency and the energy window cover the real work, not a queued
kernel launch.

The batch size is the largest batch a configuration runs. ``infer(n)`` runs
the n samples a dynamic batch gathered: a runtime that takes any shape runs
exactly n; one that runs prepared shapes (captured CUDA graphs, compiled
specialisations) runs the smallest size of its :func:`ladder` that holds n.
It returns the batch size it ran, so a window can report the padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tuner.errors import UserError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# How a torch model is executed: op by op, replayed as one captured CUDA graph,
# or compiled by torch.compile (inductor). Observe-only: nothing on the card changes.
GRAPHS = ("eager", "cudagraphs", "compile")
OPTIONS = ("channels_last", "graph", "dla_cores", "dla_batch_size")
# A Jetson has at most two DLAs (AGX Orin, AGX Xavier); the DLA knobs reach only the TensorRT runner.
MAX_DLA_CORES = 2


@dataclass(frozen=True)
class RunSettings:
    """prepare()'s arguments, checked once; also the key of a prepared variant."""

    batch_size: int
    precision: str
    channels_last: bool = False
    graph: str = "eager"
    dla_cores: int = 0
    dla_batch_size: int = 1


@runtime_checkable
class Runner(Protocol):
    """One model on one device, fed with synthetic batches."""

    name: str
    device: str

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        """Build everything one batch needs; may be called again with new settings."""
        ...

    def infer(self, size: int | None = None) -> int:
        """Run ``size`` samples (default: the prepared batch size), wait for them; return the size that ran."""
        ...

    def close(self) -> None:
        """Free the model and any device memory."""
        ...


def ladder(batch_size: int) -> list[int]:
    """The batch sizes prepared for a maximum: powers of two below it, then the maximum itself."""
    sizes = [1 << k for k in range(batch_size.bit_length()) if 1 << k < batch_size]
    return [*sizes, batch_size]


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise UserError(f"runner option {name} must be true or false, got {value!r}")


def check_settings(batch_size: int, precision: str, options: dict[str, Any]) -> RunSettings:
    """Validate prepare()'s arguments the same way for every runner."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UserError(f"unknown runner option(s) {', '.join(unknown)}: known options are {', '.join(OPTIONS)}")
    graph = str(options.get("graph", "eager"))
    if graph not in GRAPHS:
        raise UserError(f"unknown graph mode {graph!r}: use one of {', '.join(GRAPHS)}")
    dla_cores = _count("dla_cores", options.get("dla_cores", 0), 0, MAX_DLA_CORES)
    dla_batch = _count("dla_batch_size", options.get("dla_batch_size", 1), 1, 1 << 16)
    return RunSettings(
        batch_size, precision, _flag("channels_last", options.get("channels_last", False)), graph, dla_cores, dla_batch
    )


def _count(name: str, value: Any, low: int, high: int) -> int:
    text = str(value).strip()
    if not text.isdigit() or not low <= int(text) <= high:
        raise UserError(f"runner option {name} must be an integer from {low} to {high}, got {value!r}")
    return int(text)


# An LLM runner's prepare() options (besides precision; the batch size is its most concurrent sequences), and
# the window settings it takes in configure(). A device space's CNN knob (channels_last) reaches it and changes nothing.
LLM_OPTIONS = ("graph", "channels_last")
LLM_WINDOW_OPTIONS = ("max_batch_tokens", "kv_cache")
# kv_cache: "paged" (transformers' continuous batching) or "static" (its generate over a static cache: hf_static).
KV_CACHES = ("paged", "static")
# Tokens one continuous-batching step holds unless the window says (the library would size it from free memory).
DEFAULT_BATCH_TOKENS = 2048
LLM_GRAPHS = ("eager", "cudagraphs", "compile")

FirstToken = Callable[[int], None]
Done = Callable[[int, int], None]


@runtime_checkable
class TokenRunner(Protocol):
    """A causal LM that generates for many queries at once, each joining and leaving the running batch.

    ``prepare(batch_size, precision, options)``: ``batch_size`` is the most
    sequences generated at once; ``options`` holds ``graph`` (eager,
    cudagraphs: the library's captured decode, compile: its compiled decode).
    ``configure(options)`` gets the window's options before its warm-up, of
    which it uses those it knows (``max_batch_tokens``: tokens one step may
    hold, i.e. prefill chunking) and ignores the rest. ``encode(sample)``
    turns a prompt (tuner.measure.prompts.PromptSample) into what ``submit``
    takes, once per workload before any window. ``start``
    opens a session: ``submit(key, encoded, max_new_tokens)`` queues a query
    and returns at once; the runner calls ``on_first(key)`` when its first
    token exists and ``on_done(key, n_tokens)`` when it is complete, from its
    own threads. ``cancel(key)`` drops a query (a window cut once its verdict
    is known; a signal); ``stop`` ends the session.
    """

    name: str
    device: str
    generates_tokens: bool

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None: ...

    def configure(self, options: dict[str, Any]) -> None: ...

    def encode(self, sample: Any) -> Any: ...

    def start(self, on_first: FirstToken, on_done: Done) -> None: ...

    def submit(self, key: int, encoded: Any, max_new_tokens: int) -> None: ...

    def cancel(self, key: int) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...
