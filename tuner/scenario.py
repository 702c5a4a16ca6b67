"""MLPerf LoadGen scenarios as the tuner uses them: Offline, Server and SingleStream.

Offline measures throughput with every sample present at once. Server sends
queries at Poisson arrival times at a target rate and, as MLPerf's Server rule
does, bounds the 99th percentile of per-query latency; the SUT batches what has
arrived (dynamic batching), so the maximum batch size and the batching timeout
are tuned with the device's knobs. SingleStream sends one query at a time, the
next when the last completes, and MLPerf bounds its 90th percentile.

The batching timeout is a serving knob: it shapes how the model is run, not
the hardware, so it travels to the window in ``WindowSettings.options`` and is
stripped from what ``Device.apply`` sees.
"""

from __future__ import annotations

from typing import Any

from runners.base import LLM_WINDOW_OPTIONS
from runners.openai_engine import ENGINE_KNOB_PREFIX
from tuner.errors import ConfigurationError
from tuner.measure.settings import WindowSettings
from tuner.plumbing.units import check_rate
from tuner.space import Config, Knob, SearchSpace

SCENARIOS = ("offline", "server", "singlestream")
SCENARIO_PERCENTILE = {"server": "p99", "singlestream": "p90"}
TIMEOUT_KNOB = "batch_timeout_ms"
# Batching timeouts searched in Server: 0.1 ms is in effect greedy (whatever is
# queued when the model is free; knob values must be positive); longer waits
# fill batches at low rates.
TIMEOUTS_MS: list[float] = [0.1, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0]
# Knobs of how queries are served, not of the device: they reach the window as options (an LLM's step size too).
SERVING_KNOBS = (TIMEOUT_KNOB, *LLM_WINDOW_OPTIONS)


def normalize(scenario: str) -> str:
    """``Server``, ``single-stream`` and ``single_stream`` all name the same scenario."""
    name = scenario.lower().replace("-", "").replace("_", "")
    if name not in SCENARIOS:
        raise ConfigurationError(f"unknown scenario {scenario!r}: choose one of offline, server, singlestream")
    return name


def window_for(
    settings: WindowSettings, scenario: str, target_qps: float | None, percentile: str | None = None
) -> WindowSettings:
    """Settings for a scenario: Server needs a positive rate; the scenario's MLPerf percentile applies.

    ``percentile`` given explicitly (not the default) must agree with the
    scenario's rule; a bound on another percentile would not be MLPerf's.
    """
    name = normalize(scenario)
    options = dict(settings.options)
    if name == "server":
        if target_qps is None or not target_qps > 0:
            raise ConfigurationError(
                "the server scenario needs an arrival rate: pass --target-qps, e.g. --target-qps 300"
            )
        options["server_target_qps"] = check_rate(target_qps)
    elif target_qps is not None:
        raise ConfigurationError(
            f"--target-qps applies to the server scenario only, not {name}: drop it or use --scenario server"
        )
    rule = SCENARIO_PERCENTILE.get(name)
    if rule is not None and percentile is not None and percentile != rule:
        raise ConfigurationError(f"the {name} scenario bounds {rule} (MLPerf's rule): drop --percentile {percentile}")
    chosen = rule or percentile or settings.percentile
    return settings.model_copy(update={"scenario": name, "percentile": chosen, "options": options})


def target_qps(settings: WindowSettings) -> float | None:
    value = settings.options.get("server_target_qps")
    return float(value) if value is not None else None


def label(settings: WindowSettings) -> str:
    """The scenario part of a study name: a study per scenario and, in Server, per rate."""
    if settings.scenario == "server":
        return f"server@{format_rate(target_qps(settings) or 0.0)}qps"
    return settings.scenario


def format_rate(qps: float) -> str:
    return f"{qps:.6g}"


def serving_space(space: SearchSpace, settings: WindowSettings) -> SearchSpace:
    """The space a study of this scenario searches.

    Server adds the batching timeout (the batch size becomes the maximum batch
    size); SingleStream runs one sample per query, so its batch size is 1.
    """
    if settings.scenario == "server":
        out = space.model_copy(deep=True)
        out.knobs[TIMEOUT_KNOB] = Knob(
            values=list(TIMEOUTS_MS),
            default=TIMEOUTS_MS[0],
            group="runner",
            unit="ms",
            description="dynamic batching: longest wait for a batch to fill before it is run",
        )
        if out.tuned is not None and TIMEOUT_KNOB not in out.tuned:
            out.tuned = [*out.tuned, TIMEOUT_KNOB]
        return out
    if settings.scenario == "singlestream":
        return space.narrow(batch_sizes=[1])
    return space


def split(config: Config) -> tuple[Config, dict[str, Any]]:
    """The device's part of a configuration, and the serving knobs (an engine's own too) as window options."""

    def serving_knob(name: str) -> bool:
        return name in SERVING_KNOBS or name.startswith(ENGINE_KNOB_PREFIX)

    knobs = {k: v for k, v in config.knobs.items() if not serving_knob(k)}
    serving = {k: v for k, v in config.knobs.items() if serving_knob(k)}
    return Config(knobs=knobs, batch_size=config.batch_size), serving
