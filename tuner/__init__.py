"""Energy-optimal power modes for DNN inference under a latency bound.

The library's face is three functions: :func:`tuner.tune` runs a study,
:func:`tuner.measure` measures one configuration and :func:`tuner.open_device`
opens a device (tuner.api); their errors are :class:`tuner.errors.UserError`
subclasses. They are looked up on first use, by name, so that ``import tuner``
(and ``tune --version``) stays instant and the package imports none of the
modules that import it for ``__version__``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("Answer", "StudyResult", "configuration", "open_device", "tune"), "tuner.api"),
    **dict.fromkeys(
        ("ConfigurationError", "DeviceError", "MeasurementError", "StorageError", "UserError"), "tuner.errors"
    ),
    "Config": "tuner.space",
    "Measurement": "tuner.measurement",
}
__all__ = ["__version__", "measure", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name == "measure":  # the package tuner.measure, which calls tuner.api.measure (see its docstring)
        return importlib.import_module("tuner.measure")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
