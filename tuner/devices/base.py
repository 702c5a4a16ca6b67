"""The device protocol every backend (twin, Jetson, NVML, plugins) implements.

A device owns its hardware: it says which knobs it has, reads and restores its
state, applies a configuration and measures a model under it. Nothing outside
tuner/devices/ touches hardware.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

from tuner.devices.switching import SwitchCosts, switch_seconds
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace


@runtime_checkable
class Device(Protocol):
    """What the tuner needs from a device.

    ``name`` is what the user typed (``sim:orin``, ``cuda:0``, ``orin``);
    ``kind`` names its search space; ``slug`` is the folder under studies/;
    ``simulated`` is True for twins, whose every output says "twin".
    """

    name: str
    kind: str
    slug: str
    simulated: bool

    def space(self) -> SearchSpace: ...

    def read_state(self) -> dict[str, Any]: ...

    def apply(self, config: Config) -> None: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement: ...

    def describe(self) -> dict[str, Any]: ...


def switch_seconds_of(device: Any) -> float | None:
    """Seconds the device's last ``apply`` spent switching configuration, or None where it does not say.

    A Jetson board measures it (the nvpmodel mode change and the clock
    writes); a virtual board models it (tuner.devices.switching); a plugin
    device may leave ``last_switch_s`` out.
    """
    seconds = getattr(device, "last_switch_s", None)
    return float(seconds) if isinstance(seconds, (int, float)) else None


class VirtualBoard(ABC):
    """A board that answers from a model or a table and touches no hardware (generated and measured boards).

    There is nothing to read, write or restore, so the state protocol is
    empty; ``apply`` still checks the configuration against the space, so an
    invalid one fails as it would on a real board, and models how long the
    switch from the configuration applied before (the space's default at
    first) would take a board (``last_switch_s``, tuner.devices.switching:
    no time passes). A subclass sets ``_space`` and answers ``measure_many``;
    ``measure`` is one configuration of it, so a trial and a sweep see the
    same numbers.
    """

    simulated = True
    _space: SearchSpace
    _applied: Config | None = None
    last_switch_s: float | None = None

    def space(self) -> SearchSpace:
        return self._space

    def read_state(self) -> dict[str, Any]:
        return {}

    def apply(self, config: Config) -> None:
        self._space.validate_config(config)
        before = self._applied if self._applied is not None else self._space.default_config()
        self.last_switch_s = switch_seconds(self._space, SwitchCosts(), before, config)
        self._applied = config

    def restore(self, state: dict[str, Any]) -> None:
        self._applied = None

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        return self.measure_many(model, [config], settings)[0]

    @abstractmethod
    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """One window per configuration (seeded noise when ``settings.noise``; the truth without it)."""
