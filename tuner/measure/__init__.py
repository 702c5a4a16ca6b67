"""Measurement windows (MLPerf LoadGen) and the meter protocol that brackets them.

The package is also the library's ``tuner.measure(model, device, config)``:
the name is both, so calling the package calls tuner.api.measure, which is
looked up at call time (the package itself imports nothing above it).
"""

import importlib
import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("tuner.api").measure(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
