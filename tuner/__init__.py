"""Energy-optimal power modes for DNN inference under a latency bound.

The library's face is three functions, loaded on first use so that ``import
tuner`` (and ``tune --version``) stays instant: :func:`tuner.tune` runs a
study, :func:`tuner.measure` measures one configuration and
:func:`tuner.open_device` opens a device (tuner.api). Their errors are
:class:`tuner.errors.UserError` subclasses.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_FROM_API = ("Answer", "StudyResult", "configuration", "open_device", "tune")
_FROM_ERRORS = ("ConfigurationError", "DeviceError", "MeasurementError", "StorageError", "UserError")
__all__ = ["Config", "Measurement", "__version__", "measure", *_FROM_API, *_FROM_ERRORS]


def __getattr__(name: str) -> Any:
    if name in _FROM_API:
        from tuner import api

        return getattr(api, name)
    if name in _FROM_ERRORS:
        from tuner import errors

        return getattr(errors, name)
    if name == "measure":  # the package tuner.measure, which calls tuner.api.measure (see its docstring)
        import importlib

        return importlib.import_module("tuner.measure")
    if name == "Config":
        from tuner.space import Config

        return Config
    if name == "Measurement":
        from tuner.measurement import Measurement

        return Measurement
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
