"""The space of a study of an engine the user deploys (``openai://...``): the device's knobs and the engine's.

A server runs its own runtime, so the in-process runner's knobs (precision,
graph, tokens per step) are searched only where the engine file's command
line names them (``{precision}``, ``{graph}``, ``{max_batch_tokens}``); a
server without an engine file has none (the device's own are pinned at
their defaults, the others left out). Each of the engine file's own knobs
joins the space as ``engine:NAME``, a serving knob (tuner.scenario.split):
it reaches the runner as a window option, which restarts the server with it
(runners.engine_server). The batch size is the most requests in flight.
"""

from __future__ import annotations

from pydantic import ValidationError

from runners.engine_server import load_engine
from runners.openai_engine import ENGINE_KNOB_PREFIX, parse_target
from tuner.errors import ConfigurationError
from tuner.llm import llm_space
from tuner.space import Knob, SearchSpace

# The in-process runner's knobs, which an engine takes only through its command line.
RUNNER_KNOBS = ("precision", "graph", "channels_last", "max_batch_tokens", "kv_cache")


def engine_space(space: SearchSpace, model: str) -> SearchSpace:
    """The device's space with the runner knobs the engine's command takes and the engine file's knobs."""
    target = parse_target(model)
    engine = load_engine(target.engine) if target.engine else None
    used = set(engine.placeholders()) if engine is not None else set()
    out = llm_space(space)
    for name in RUNNER_KNOBS:
        if name in out.knobs and name not in used:
            if name in space.knobs:
                out = out.pin(name, out.knobs[name].default)
            else:
                del out.knobs[name]
                out.tuned = None if out.tuned is None else [k for k in out.tuned if k != name]
    if engine is None:
        return out
    for name, values in engine.knobs.items():
        key = ENGINE_KNOB_PREFIX + name
        if key in out.knobs:
            raise ConfigurationError(f"engine knob {name!r} is named twice: rename it in the engine file")
        try:
            out.knobs[key] = Knob(
                values=list(values),
                default=values[0],
                group="runner",
                ordered=all(isinstance(v, int | float) for v in values),
                description=f"engine setting {{{name}}} of {target.engine}: set by restarting the server",
            )
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            raise ConfigurationError(f"engine knob {name!r} in {target.engine}: {why}; fix its values") from None
        if out.tuned is not None:
            out.tuned = [*out.tuned, key]
    return out
