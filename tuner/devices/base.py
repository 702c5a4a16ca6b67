"""The device protocol every backend (twin, Jetson, NVML, plugins) implements.

A device owns its hardware: it says which knobs it has, reads and restores its
state, applies a configuration and measures a model under it. Nothing outside
tuner/devices/ touches hardware.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

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


class VirtualBoard(ABC):
    """A board that answers from a model or a table and touches no hardware (generated and measured boards).

    There is nothing to read, write or restore, so the state protocol is
    empty; ``apply`` still checks the configuration against the space, so an
    invalid one fails as it would on a real board. A subclass sets ``_space``
    and answers ``measure_many``; ``measure`` is one configuration of it, so a
    trial and a sweep see the same numbers.
    """

    simulated = True
    _space: SearchSpace

    def space(self) -> SearchSpace:
        return self._space

    def read_state(self) -> dict[str, Any]:
        return {}

    def apply(self, config: Config) -> None:
        self._space.validate_config(config)

    def restore(self, state: dict[str, Any]) -> None:
        return None

    def measure(self, model: str, config: Config, settings: WindowSettings) -> Measurement:
        return self.measure_many(model, [config], settings)[0]

    @abstractmethod
    def measure_many(self, model: str, configs: list[Config], settings: WindowSettings) -> list[Measurement]:
        """One window per configuration (seeded noise when ``settings.noise``; the truth without it)."""
