"""The device protocol every backend (twin, Jetson, NVML, plugins) implements.

A device owns its hardware: it says which knobs it has, reads and restores its
state, applies a configuration and measures a model under it. Nothing outside
tuner/devices/ touches hardware.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.space import Config, SearchSpace

__all__ = ["Device", "WindowSettings"]


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
