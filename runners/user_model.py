"""A user's own PyTorch model: ``--model py:package.module:factory``.

The factory takes no arguments and returns ``(module, input)``, where
``input`` describes one batch in one of three ways:

- a shape per sample, e.g. ``(3, 224, 224)``: one float tensor in the
  runner's precision;
- a dict ``{"shape": [128], "dtype": "int64", "high": 30522}``: integer
  inputs are drawn from ``[0, high)`` (default 2); a list of such dicts for a
  model with several inputs;
- a callable ``make_batch(batch_size)`` returning a tensor or a tuple of
  tensors on the CPU; floating tensors are cast to the runner's precision.

The module is found by the rule every ``py:`` spec follows
(:func:`tuner.plumbing.usercode.import_module`): the current directory first, as
``python -m`` does, so a file ``mymodels.py`` beside the user is found as
``py:mymodels:build``, and a file another user could rewrite is refused.
"""

from __future__ import annotations

import os
from typing import Any

from tuner.errors import UserError
from tuner.plumbing.usercode import find_module, import_module, split_target, user_code

PREFIX = "py:"
EXAMPLE = "py:mypackage.models:build"
_INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
_DTYPES = ("float32", "float16", "bfloat16", *_INT_DTYPES)


def is_user_model(model: str) -> bool:
    return model.startswith(PREFIX)


def parse(model: str) -> tuple[str, str]:
    """Split ``py:module.path:factory``; a malformed one is a one-line error with an example."""
    return split_target(model, "--model", EXAMPLE)


def check(model: str) -> None:
    """Check that the module can be found and trusted, without importing it (no torch, no side effects)."""
    find_module(parse(model)[0], "--model", model)


def load(model: str) -> Any:
    """Import the factory, call it, and return a ModelSource for the torch runner."""
    import torch
    from torch import nn

    from runners.torch_runner import ModelSource

    module_name, factory_name = parse(model)
    module = import_module(module_name, "--model", model)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UserError(f"module {module_name!r} has no function {factory_name!r}: check {model!r}")
    with user_code(f"--model {model}", "fix its factory (see docs/models.md)"):
        made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise UserError(
            f"{model} must return (torch.nn.Module, input), where input is a shape per sample, "
            f"a dict with shape and dtype, or a function of the batch size; got {type(made).__name__}"
        )
    module_obj, spec = made
    make_batch = _batch_maker(model, spec, torch)

    def guarded_batch(batch: int, dtype: Any) -> tuple[Any, ...]:
        with user_code(f"--model {model}: its input at batch size {batch}", "use smaller --batch-sizes or fix it"):
            return make_batch(batch, dtype)

    name = f"{module_name}.{factory_name}"
    guarded = _guarded(nn, model)(module_obj)
    return ModelSource(name=name, build=lambda: guarded, make_batch=guarded_batch)


_PROFILES: dict[tuple[str, str, int], Any] = {}


def profile(model: str) -> Any:
    """The model's per-layer FLOPs and bytes, counted from one fp32 forward on the CPU (runners.profiling).

    What a digital twin runs a user's model from, as the zoo's committed
    profiles were made; counted once per process for each version of the
    module's file.
    """
    origin = find_module(parse(model)[0], "--model", model)
    try:
        stamp = os.stat(origin).st_mtime_ns if origin else 0
    except OSError:
        stamp = 0
    key = (model, origin, stamp)
    if key not in _PROFILES:
        try:
            from runners.profiling import profile_module
        except ImportError:
            raise UserError(f"a twin profiles {model} with PyTorch: pip install 'powertune[torch]'") from None
        source = load(model)
        with user_code(f"--model {model}: its forward on the CPU, counting FLOPs", "fix it (see docs/models.md)"):
            _PROFILES[key] = profile_module(
                source.name, source.build().eval(), source.make_batch, f"runners.profiling.profile_module from {model}"
            )
    return _PROFILES[key]


def described_inputs(model: str) -> list[tuple[str, list[int]]]:
    """Each input of the factory's model: the forward argument's name and its shape per sample (no batch axis).

    Read from one batch of the factory's own input description, so a
    deployment's engine build can name and shape the inputs the study ran.
    """
    import inspect

    import torch

    source = load(model)
    with user_code(f"--model {model}: its input at batch size 1", "fix it (see docs/models.md)"):
        tensors = source.make_batch(1, torch.float32)
    inner = getattr(source.build(), "inner", None)
    try:
        params = [
            p.name
            for p in inspect.signature(inner.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError, AttributeError):
        params = []
    names = params if len(params) >= len(tensors) else [f"input{i}" for i in range(len(tensors))]
    return [(name, list(t.shape[1:])) for name, t in zip(names, tensors, strict=False)]


def _guarded(nn: Any, model: str) -> Any:
    """A module class that runs the user's module and turns any failure of its forward into one line.

    A forward that raises would otherwise end the command with a traceback;
    here it ends it with a :class:`UserError` naming the model and the error
    (the hardware is restored as after any other error), and no number is
    recorded for it.
    """

    class Guarded(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: Any) -> Any:
            try:
                return self.inner(*inputs)
            except Exception as exc:  # the user's forward may fail in any way
                detail = " ".join(str(exc).split())[:200]
                raise UserError(f"--model {model}: its forward failed: {type(exc).__name__}: {detail}") from None

    return Guarded


def _batch_maker(model: str, spec: Any, torch: Any) -> Any:
    """Turn the factory's input description into make_batch(batch_size, dtype) -> tuple of CPU tensors."""
    if callable(spec):

        def from_function(batch: int, dtype: Any) -> tuple[Any, ...]:
            made = spec(batch)
            tensors = made if isinstance(made, (tuple, list)) else (made,)
            if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
                raise UserError(f"the input function of {model} must return a tensor or a tuple of tensors")
            return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)

        return from_function
    inputs = spec if isinstance(spec, list) and spec and isinstance(spec[0], dict) else [spec]
    described = [_one_input(model, item) for item in inputs]

    def from_shapes(batch: int, dtype: Any) -> tuple[Any, ...]:
        generator = torch.Generator().manual_seed(batch)
        tensors = []
        for shape, type_name, high in described:
            full = (batch, *shape)
            if type_name is None or type_name.startswith(("float", "bfloat")):
                tensors.append(torch.randn(full, generator=generator).to(dtype))
            else:
                tensors.append(torch.randint(0, high, full, generator=generator).to(getattr(torch, type_name)))
        return tuple(tensors)

    return from_shapes


def _one_input(model: str, item: Any) -> tuple[tuple[int, ...], str | None, int]:
    shape, type_name, high = item, None, 2
    if isinstance(item, dict):
        shape, type_name, high = item.get("shape"), item.get("dtype"), int(item.get("high", 2))
        if type_name is not None and type_name not in _DTYPES:
            raise UserError(f"{model}: input dtype {type_name!r} is not one of {', '.join(_DTYPES)}")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise UserError(
            f"{model}: input shape per sample must be a list of positive integers (no batch axis), got {shape!r}"
        )
    return tuple(shape), type_name, high
