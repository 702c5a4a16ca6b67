"""LLM studies: the space a causal LM is tuned over, the sampler that searches it, and what its bounds read.

A causal LM (runners.llm_spec) is tuned for energy per output token under
bounds on TTFT and TPOT (and, optionally, the per-query latency). Its space
is the device's with the LLM runner's knobs: precision and graph as the
device offers them (less what transformers does not run: int8; on a GPU the
16-bit precisions only), and on a GPU
``max_batch_tokens``, the tokens one continuous-batching step holds (how
long prompts are chunked), which travels to the window as a serving knob.
The batch size is the most sequences in the running batch. Server has no
batching timeout to tune: the library admits queries into the running batch
every step.
"""

from __future__ import annotations

import math
from typing import Any

from runners.base import DEFAULT_BATCH_TOKENS, KV_CACHES, LLM_GRAPHS, LLM_WINDOW_OPTIONS
from runners.llm_spec import is_llm
from tuner.errors import ConfigurationError
from tuner.knobs import Config
from tuner.measure.settings import WindowSettings
from tuner.measure.token_settings import within_bounds_s
from tuner.plumbing.units import format_ms
from tuner.space import Knob, SearchSpace

BATCH_TOKENS_KNOB = LLM_WINDOW_OPTIONS[0]
KV_CACHE_KNOB = LLM_WINDOW_OPTIONS[1]
BATCH_TOKENS = [256, 512, 1024, 2048, 4096]
LLM_PRECISIONS = ("fp32", "fp16", "bf16")
# On a GPU an LLM is searched in 16 bits: every decode step reads each weight once, so fp32 reads twice the bytes of
# either for the same tokens (a --space file offering only fp32 still runs it).
HALF_PRECISIONS = ("fp16", "bf16")
# Knobs of a device space that no LLM runner reads: channels_last changes only 2-D convolutions (pinned in a study).
NOT_LLM_KNOBS = ("channels_last",)
# The LLM runner's knobs, which act on an observe-only device too (an engine file's own are ``engine:NAME``).
SHOWN_LLM_KNOBS = ("precision", "graph", *LLM_WINDOW_OPTIONS)
# The learned strategy models energy per query and query latency; an LLM study is searched by a stock
# constrained sampler, which sees every named constraint (latency, ttft, tpot).
LLM_SAMPLER = "tpe"
STOCK_SAMPLERS = ("auto", "tpe", "gp", "random")
# When an LLM study's answer is known (tuner.strategies.stopping.decide_settled): the best J/token not bettered by
# more than STOP_RESOLUTION (or the window's --ci, if wider) over STOP_PATIENCE measured configurations, at least
# STOP_MIN_MEASURED measured (2%: twice the default --ci, a chosen margin for a window of a few hundred queries).
STOP_RESOLUTION = 0.02
FIRST_GRAPH = "cudagraphs"
STOP_PATIENCE = 3
STOP_MIN_MEASURED = 5
# Poisson standard deviations of the in-flight count a sized first trial's sequences hold (tuner.llm.sized_config).
SIZED_SD = 3.0


def llm_space(space: SearchSpace) -> SearchSpace:
    """The device's space as an LLM study searches it (see the module docstring)."""
    out = space.model_copy(deep=True)
    gpu = space.kind != "cpu"
    for name, allowed in (("precision", LLM_PRECISIONS), ("graph", LLM_GRAPHS)):
        knob = out.knobs.get(name)
        if knob is None:
            continue
        values = [v for v in knob.values if v in allowed]
        if name == "precision" and gpu and any(v in HALF_PRECISIONS for v in values):
            values = [v for v in values if v in HALF_PRECISIONS]
        if values:
            default = knob.default if knob.default in values else values[0]
            out.knobs[name] = knob.model_copy(update={"values": values, "default": default})
    if gpu:
        out.knobs[BATCH_TOKENS_KNOB] = Knob(
            values=list(BATCH_TOKENS),
            default=DEFAULT_BATCH_TOKENS,
            group="runner",
            unit="tokens",
            description="tokens one continuous-batching step holds: prompts longer are prefilled in chunks",
        )
        if out.tuned is not None and BATCH_TOKENS_KNOB not in out.tuned:
            out.tuned = [*out.tuned, BATCH_TOKENS_KNOB]
    out.knobs[KV_CACHE_KNOB] = Knob(
        values=list(KV_CACHES),
        default=KV_CACHES[0],
        group="runner",
        ordered=False,
        description="paged: transformers' continuous batching; static: its generate over a static KV cache, "
        "decode compiled unless graph=eager, in static batches (the library's fastest path for few sequences)",
    )
    if out.tuned is not None and KV_CACHE_KNOB not in out.tuned:
        out.tuned = [*out.tuned, KV_CACHE_KNOB]
    return out


def applying_knobs(space: SearchSpace, model: str, knobs: dict[str, Any], observe_only: bool) -> dict[str, Any]:
    """The knobs of an LLM's configuration that act on it, as a measurement shows them (others unchanged).

    Left out: the knobs no LLM reads (:data:`NOT_LLM_KNOBS`), and on an
    observe-only device its knobs pinned to what the card runs (a power limit
    read, not set): readings, not settings.
    """
    if not is_llm(model):
        return dict(knobs)

    def reading(name: str) -> bool:
        knob = space.knobs.get(name)
        return observe_only and knob is not None and knob.group != "runner" and len(knob.values) == 1

    return {k: v for k, v in knobs.items() if k not in NOT_LLM_KNOBS and not reading(k)}


def hidden_knobs(record: dict[str, Any], observe_only: bool) -> dict[str, Any]:
    """The knobs of an LLM trial's record a table leaves out (:func:`applying_knobs` without the space).

    Knobs no LLM reads, and on an observe-only device every knob but the
    runner's (an observe-only card's knobs are readings: its power limit);
    nothing for a CNN's record.
    """
    if "j_per_token" not in record:
        return {}
    config = record.get("config", {})
    hidden = {k: v for k, v in config.items() if k in NOT_LLM_KNOBS}
    if observe_only:
        hidden.update({k: v for k, v in config.items() if k not in SHOWN_LLM_KNOBS and ":" not in k})
    return hidden


def first_config(space: SearchSpace) -> Config:
    """An LLM study's first trial: the likeliest to keep up with the rate, so the study holds an answer from it.

    Every knob at its default, the most sequences, and the library's captured decode where the study searches
    ``graph`` (an eager step launches every kernel of the model from Python, hundreds a token).
    """
    config = space.default_config(space.batch_sizes[-1])
    graph = space.knobs.get("graph")
    if graph is not None and "graph" in space.tuned_knobs and FIRST_GRAPH in graph.values:
        config.knobs["graph"] = FIRST_GRAPH
    return config


def chunked_config(space: SearchSpace, first: Config) -> Config | None:
    """The first trial with the smallest prefill chunk that still holds a decode token of every sequence, or None.

    A step's ``max_batch_tokens`` trades TTFT against TPOT: a running
    sequence's next token waits for every prompt chunk in its step, so a
    smaller chunk stalls decode less and prefills slower (Sarathi-Serve's
    chunked prefill), so the first two trials bracket TTFT against TPOT.
    None where the knob is not searched or the first has it smallest.
    """
    knob = space.knobs.get(BATCH_TOKENS_KNOB)
    if knob is None or BATCH_TOKENS_KNOB not in space.tuned_knobs:
        return None
    fits = sorted(int(v) for v in knob.values if int(v) >= first.batch_size)
    current = int(first.knobs.get(BATCH_TOKENS_KNOB, knob.default))
    if not fits or fits[0] >= current:
        return None
    return Config(batch_size=first.batch_size, knobs={**first.knobs, BATCH_TOKENS_KNOB: fits[0]})


def sized_config(space: SearchSpace, first: Config, settings: WindowSettings, mean_output: float) -> Config | None:
    """The first trial with the fewest sequences that hold what a Server window meeting its bounds has in flight.

    By Little's law a window at the rate whose queries end within the bounds
    (tuner.measure.token_settings.within_bounds_s) has rate x that time in
    flight on average; :data:`SIZED_SD` Poisson deviations above it hold the
    peaks. More sequences never run, yet the manager's KV cache, buffers and
    captured graphs are sized for all of them (the H200 at 20 q/s: 512
    sequences ran TPOT p99 30.2-30.8 ms, 64 ran 26.8 ms); every other knob is
    the first's.
    None outside Server, without a rate or a time bound, or when no fewer
    sequences would do.
    """
    rate = float(settings.options.get("server_target_qps", 0.0))
    within = within_bounds_s(settings, mean_output)
    if settings.scenario != "server" or rate <= 0 or within is None:
        return None
    in_flight = rate * within
    need = in_flight + SIZED_SD * math.sqrt(in_flight)
    fewer = [b for b in space.batch_sizes if need <= b < first.batch_size]
    if not fewer:
        return None
    return Config(batch_size=fewer[0], knobs=dict(first.knobs))


def llm_serving_space(space: SearchSpace, settings: WindowSettings) -> SearchSpace:
    """SingleStream runs one query at a time, so one sequence; Server keeps the paged cache; Offline searches it all.

    A static batch holds every arrival until the running batch ends (and a
    new batch shape compiles anew), so in Server the static cache costs a
    trial's compile to learn what its TTFT says; a --knobs list naming
    kv_cache searches it there too.
    """
    if settings.scenario == "singlestream":
        return space.narrow(batch_sizes=[1])
    if settings.scenario == "server" and KV_CACHE_KNOB in space.knobs and space.tuned is None:
        return space.pin(KV_CACHE_KNOB, KV_CACHES[0])
    return space


def check_bounds(model: str, max_latency_ms: float, settings: WindowSettings) -> None:
    """Token bounds and prompts are for LLMs only; an LLM study needs at least one bound (exit 2 otherwise)."""
    token_bounds = settings.max_ttft_ms is not None or settings.max_tpot_ms is not None
    if not is_llm(model):
        if token_bounds or settings.prompts is not None:
            raise ConfigurationError(
                f"--max-ttft, --max-tpot and --prompts are for LLMs, and {model} is not one: drop them, "
                "or give a causal LM (tiny-llm, hf:ORG/NAME, a model folder)"
            )
        if not math.isfinite(max_latency_ms):
            raise ConfigurationError("tune run needs a latency bound: pass --max-latency, e.g. --max-latency 50ms")
        return
    if not math.isfinite(max_latency_ms) and not token_bounds:
        raise ConfigurationError(
            f"{model} needs a bound: --max-ttft and/or --max-tpot (e.g. --max-ttft 500ms --max-tpot 30ms), "
            "or --max-latency for the whole answer"
        )


def llm_sampler(model: str, sampler: str) -> str:
    """The sampler an LLM study runs: ``auto`` is :data:`LLM_SAMPLER`; one that models J/query is refused."""
    if not is_llm(model):
        return sampler
    if sampler not in STOCK_SAMPLERS:
        raise ConfigurationError(
            f"--sampler {sampler} models energy per query and query latency, not tokens: "
            f"use {', '.join(s for s in STOCK_SAMPLERS if s != 'auto')} for {model}"
        )
    return LLM_SAMPLER if sampler == "auto" else sampler


def bounds_label(max_latency_ms: float, settings: WindowSettings) -> str:
    """A study's bounds as its name spells them: ``50ms`` for a query bound, ``ttft500ms,tpot30ms`` beside it."""
    parts = [format_ms(max_latency_ms)] if math.isfinite(max_latency_ms) else []
    if settings.max_ttft_ms is not None:
        parts.append(f"ttft{format_ms(settings.max_ttft_ms)}")
    if settings.max_tpot_ms is not None:
        parts.append(f"tpot{format_ms(settings.max_tpot_ms)}")
    return ",".join(parts)


def bounds_text(max_latency_ms: float, percentile: str, max_ttft_ms: float | None, max_tpot_ms: float | None) -> str:
    """The bounds as a title says them: ``p99 <= 50 ms``, ``TTFT p99 <= 500 ms, TPOT p99 <= 30 ms``."""
    parts = [f"{percentile} <= {max_latency_ms:g} ms"] if math.isfinite(max_latency_ms) else []
    if max_ttft_ms is not None:
        parts.append(f"TTFT {percentile} <= {max_ttft_ms:g} ms")
    if max_tpot_ms is not None:
        parts.append(f"TPOT {percentile} <= {max_tpot_ms:g} ms")
    return ", ".join(parts)
