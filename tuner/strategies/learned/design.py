"""The learned strategy's first trials, before any model: the baseline at both batch ends, then the centre."""

from __future__ import annotations

from collections.abc import Callable

from tuner.space import Config, SearchSpace

Fresh = Callable[[Config], Config | None]


def design(space: SearchSpace, designed: int, center: bool, fresh: Fresh) -> tuple[Config, tuple[str, str]] | None:
    """The next designed configuration and why, or None once the design is measured.

    ``designed``: trials measured so far that the design counts (an earlier
    study's seeds do not); ``fresh`` returns the effective configuration if
    no trial has it yet. Trials 1-2 measure the default configuration at the
    largest and smallest batch size; with ``center``, trial 3 the centre.
    """
    if designed < 2:
        default = space.default_config()
        for label, batch in (("largest", space.batch_sizes[-1]), ("smallest", space.batch_sizes[0])):
            config = fresh(default.model_copy(update={"batch_size": batch}))
            if config is not None:
                return config, ("baseline", f"default configuration at the {label} batch size ({batch})")
    if center and designed < 3:
        config = fresh(centre(space))
        if config is not None:
            return config, ("design", "centre of the space: ordered knobs and the batch size at their middle")
    return None


def centre(space: SearchSpace) -> Config:
    """Every ordered tuned knob at its middle value, the others at their default, the middle batch size."""
    knobs = dict(space.default_config().knobs)
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        if knob.ordered:
            knobs[name] = knob.values[(len(knob.values) - 1) // 2]
    batches = space.batch_sizes
    return Config(knobs=knobs, batch_size=batches[(len(batches) - 1) // 2])
