"""A twin's window for a causal LM: the decode physics (tuner.devices.virtual.decode) as a token Measurement.

Every query has the workload's mean prompt and output length. Offline runs
full static batches of the configuration's batch size (the most concurrent
sequences); SingleStream batches of one. Server (queries at
``server_target_qps``) is continuous batching in its steady state: by
Little's law the running batch holds rate x the time a sequence lives in it
(a fixed point: that time depends on the batch), at most the batch size; a
query's TTFT is the prefill of the prompts arriving in one step (over as
many steps as they fill at ``max_batch_tokens`` a step), its TPOT the step
at the running batch slowed by the share of time the arrivals' prefill takes
(spread, query to query, by the Poisson count of arrivals in its life); the
GPU idles at the twin's idle power while
no sequence is in flight (Poisson arrivals: a share e^-L of the time, L the
sequences in flight on average); above the capacity (the batch size
over a full batch's time) the queue grows through the window and the TTFT
with it. Seeded noise (the twin's ``noise_time``/``noise_power``, as for any
model) spreads the tail as the CNN windows' is.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runners.llm_spec import ENGINE_PREFIX, is_llm, parse_llm
from tuner.devices.virtual.decode import DecoderShape, Generation, generate
from tuner.devices.virtual.twin import TwinDevice
from tuner.devices.virtual.twin_physics import TwinModel, twin_measurement
from tuner.errors import ConfigurationError
from tuner.measure.prompts import load_prompts
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement, TokenMetrics
from tuner.plumbing.readfile import read_capped
from tuner.space import Config

# An LLM runs in half precision unless the configuration names its precision (transformers' usual GPU dtype).
LLM_PRECISION = "fp16"
# Rounds of the running batch's fixed point (rate x a sequence's time in it); it settles in two or three.
FIXED_POINT_STEPS = 8
# The most of the GPU's time prefill may take before decode stops (past it the rate is over capacity anyway).
MAX_PREFILL_LOAD = 0.9
# Standard normal quantiles for the p90 and p99 of a per-query TPOT spread by Poisson arrivals.
Z90, Z99 = 1.2816, 2.3263
MAX_CONFIG_BYTES = 1 << 20


def decoder_shape(model: str) -> DecoderShape:
    """The decoder a model name describes: a built-in LLM's configuration, or a folder's config.json."""
    if model.startswith(ENGINE_PREFIX):
        raise ConfigurationError(
            f"a twin models a decoder from its configuration, not a server: run {model} on the device it serves "
            "from, or give the twin the model's folder or a built-in LLM name (llama3.2-1b-random)"
        )
    spec = parse_llm(model)
    config: dict[str, Any] = dict(spec.config)
    if not config and spec.path is not None:
        path = spec.path / "config.json"
        raw = read_capped(path, "model config", MAX_CONFIG_BYTES, "give a Hugging Face model folder")
        try:
            config = json.loads(raw)
        except ValueError:
            raise ConfigurationError(f"{path} is not JSON: give a Hugging Face model folder") from None
        config = config.get("text_config", config) if isinstance(config, dict) else {}
    return DecoderShape.from_hf_config(config)


def llm_window(twin: TwinModel, model: str, config: Config, settings: WindowSettings) -> Measurement:
    """One LLM window on the twin: generations of the workload's mean lengths, as a token Measurement."""
    shape = decoder_shape(model)
    prompts = load_prompts(settings.prompts)
    prompt_tokens = max(1, round(prompts.mean_input_tokens))
    new_tokens = max(1, round(prompts.mean_output_tokens))
    scenario = settings.scenario.lower().replace("-", "").replace("_", "")
    batch = 1 if scenario == "singlestream" else max(config.batch_size, 1)
    knobs = {"precision": LLM_PRECISION, **twin.space.default_config().knobs, **config.knobs}
    run = Config(knobs=knobs, batch_size=batch)
    asked = float(twin.operating([run]).gpu_mhz[0])
    rng = np.random.default_rng(settings.seed) if settings.noise else None
    rate = float(settings.options.get("server_target_qps", 0.0) or 0.0)
    if scenario == "server" and rate > 0:
        return _server(twin, shape, run, prompt_tokens, new_tokens, rate, settings, rng, asked)
    g = generate(twin, shape, run, prompt_tokens, new_tokens)
    return _measurement(twin, g, settings, rng, asked)


@dataclass(frozen=True)
class Steady:
    """Continuous batching at a rate: the running batch, TTFT and TPOT, average power, queries completed/s."""

    running: int
    ttft_s: float
    tpot_s: float
    tpot_sd_s: float
    watts: float
    completed_per_s: float
    busy: float
    wait_s: float


def steady_state(
    twin: TwinModel,
    shape: DecoderShape,
    run: Config,
    prompt: int,
    new: int,
    rate: float,
    window_s: float,
    chunk: int | None = None,
) -> Steady:
    """The Server window's steady state at ``rate`` queries/s (see the module docstring).

    ``chunk``: the most tokens one step holds (``max_batch_tokens``): the prompts arriving in a step
    are prefilled over as many steps as they fill, each with its decode step beside it.
    """
    most = max(run.batch_size, 1)

    def at(batch: int) -> Generation:
        return generate(twin, shape, run.model_copy(update={"batch_size": batch}), prompt, new)

    full = at(most)
    capacity = most / full.seconds
    running, g = 1, at(1)
    for _ in range(FIXED_POINT_STEPS):
        wanted = min(most, max(1, math.ceil(rate * g.seconds)))
        if wanted == running:
            break
        running, g = wanted, at(wanted)
    if rate >= capacity:
        running, g = most, full
    arriving = max(1, math.ceil(rate * g.tpot_s))
    prefill = generate(twin, shape, run.model_copy(update={"batch_size": arriving}), prompt, 1).prefill
    per_token = prefill.seconds / (arriving * prompt)
    # The share of the GPU's time the arrivals' prefill takes slows every decode step by as much.
    load = min(rate * prompt * per_token, MAX_PREFILL_LOAD) if rate < capacity else 0.0
    tpot = g.tpot_s / (1 - load)
    # A query's TPOT carries the prefills of the queries arriving in its life (Poisson: spread sqrt(mean)).
    arrivals = rate * max(new - 1, 1) * tpot
    tpot_sd = math.sqrt(arrivals) * prompt * per_token / max(new - 1, 1)
    tokens = arriving * prompt
    if chunk is not None and chunk < tokens:
        ttft = math.ceil(tokens / chunk) * (chunk * per_token + g.tpot_s)
    else:
        ttft = prefill.seconds
    # Poisson arrivals, each sequence in flight for g.seconds: the GPU is idle while none is (M/G/inf: e^-L).
    busy = 1.0 - math.exp(-rate * g.seconds) if rate < capacity else 1.0
    idle_w = float(twin.idle([run]).power_w[0])
    wait_s = window_s * (1 - capacity / rate) if rate >= capacity else 0.0
    return Steady(
        running=running,
        ttft_s=ttft,
        tpot_s=tpot,
        tpot_sd_s=tpot_sd,
        watts=busy * g.avg_w + (1 - busy) * idle_w,
        completed_per_s=min(rate, capacity),
        busy=busy,
        wait_s=wait_s,
    )


def _server(
    twin: TwinModel,
    shape: DecoderShape,
    run: Config,
    prompt: int,
    new: int,
    rate: float,
    settings: WindowSettings,
    rng: np.random.Generator | None,
    asked_mhz: float,
) -> Measurement:
    tokens = settings.options.get("max_batch_tokens")
    chunk = int(tokens) if isinstance(tokens, int | float) or str(tokens).isdigit() else None
    s = steady_state(twin, shape, run, prompt, new, rate, settings.window_s, chunk)
    p = twin.params
    time_factor = float(rng.lognormal(0.0, p.noise_time)) if rng is not None else 1.0
    power_factor = float(rng.lognormal(0.0, p.noise_power)) if rng is not None else 1.0
    ttft, tpot, wait = s.ttft_s * time_factor, s.tpot_s * time_factor, s.wait_s
    spread = s.tpot_sd_s * time_factor
    watts = s.watts * power_factor
    duration = settings.window_s
    queries = max(1, round(s.completed_per_s * duration))
    output = queries * new
    energy = watts * duration
    tail = p.p99_tail_fraction
    latency = ttft + (new - 1) * tpot
    tokens = TokenMetrics(
        output_tokens=output,
        input_tokens=queries * prompt,
        j_per_token=energy / output,
        tokens_per_s=output / duration,
        ttft_p50_ms=(ttft + wait / 2) * 1e3,
        ttft_p90_ms=(ttft * (1 + tail / 2) + 0.9 * wait) * 1e3,
        ttft_p99_ms=(ttft * (1 + tail) + 0.99 * wait) * 1e3,
        tpot_p50_ms=tpot * 1e3,
        tpot_p90_ms=(tpot * (1 + tail / 2) + Z90 * spread) * 1e3,
        tpot_p99_ms=(tpot * (1 + tail) + Z99 * spread) * 1e3,
        latency_clock="twin",
    )
    extra: dict[str, float | str] = {
        "twin_llm_running_batch": float(s.running),
        "twin_llm_busy_share": round(s.busy, 4),
        "twin_llm_server": "continuous batching in its steady state (Little's law)"
        + ("; over capacity: the queue grows through the window" if wait > 0 else ""),
    }
    latencies = (latency + wait / 2, latency * (1 + tail / 2) + 0.9 * wait, latency * (1 + tail) + 0.99 * wait)
    extra = {"gpu_mhz_effective": round(asked_mhz, 1), **extra}
    return twin_measurement(p, watts, duration, queries, latencies, False, extra, tokens)


def _measurement(
    twin: TwinModel, g: Generation, settings: WindowSettings, rng: np.random.Generator | None, asked_mhz: float
) -> Measurement:
    """The generation as a window of ``settings.window_s`` (whole batches), with seeded noise where asked."""
    p = twin.params
    time_factor = float(rng.lognormal(0.0, p.noise_time)) if rng is not None else 1.0
    power_factor = float(rng.lognormal(0.0, p.noise_power)) if rng is not None else 1.0
    seconds = g.seconds * time_factor
    ttft, tpot = g.ttft_s * time_factor, g.tpot_s * time_factor
    watts = g.avg_w * power_factor
    batches = max(1, math.ceil(settings.window_s / seconds))
    queries = batches * g.batch
    duration = batches * seconds
    energy = watts * duration
    output = queries * g.new_tokens
    # A batch's sequences finish together; the tail is the twin's usual share of the batch time above it.
    tail = 1 + p.p99_tail_fraction

    def spread(value: float, share: float) -> float:
        return value * (1 + (tail - 1) * share)

    tokens = TokenMetrics(
        output_tokens=output,
        input_tokens=queries * g.prompt_tokens,
        j_per_token=energy / output,
        tokens_per_s=output / duration,
        ttft_p50_ms=ttft * 1e3,
        ttft_p90_ms=spread(ttft, 0.5) * 1e3,
        ttft_p99_ms=spread(ttft, 1.0) * 1e3,
        tpot_p50_ms=tpot * 1e3,
        tpot_p90_ms=spread(tpot, 0.5) * 1e3,
        tpot_p99_ms=spread(tpot, 1.0) * 1e3,
        latency_clock="twin",
    )
    extra: dict[str, float | str] = {
        "gpu_mhz_effective": round(g.decode.gpu_mhz, 1),
        "twin_llm_runtime": g.runtime,
        "twin_prefill_w": round(g.prefill.watts * power_factor, 3),
        "twin_decode_w": round(g.decode.watts * power_factor, 3),
    }
    throttled = min(g.prefill.gpu_mhz, g.decode.gpu_mhz) < asked_mhz - 0.5
    latencies = (seconds, spread(seconds, 0.5), spread(seconds, 1.0))
    return twin_measurement(p, watts, duration, queries, latencies, throttled, extra, tokens)


class DecodingTwin(TwinDevice):
    """A twin that runs causal LMs too: an LLM model's window is :func:`llm_window`, any other model's as before."""

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        if is_llm(model):
            return self._unit(llm_window(self.model, model, config, settings))
        return super().measure(model, config, settings)

    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        if is_llm(model):
            return [self.measure(model, config, settings) for config in configs]
        return super().measure_many(model, configs, settings)
