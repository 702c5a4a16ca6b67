"""Zoo models run by PyTorch on the CPU or one CUDA GPU.

Imported only when a torch model is asked for (runners.make_runner), so the
core package works without torch.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runners import zoo
from runners.base import check_settings
from tuner.errors import UserError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WARMUP_BATCHES = 3


def _parse_device(device: str) -> torch.device:
    """Accept cpu, cuda and cuda:N, and check that the GPU exists before any work."""
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        raise UserError(f"unknown torch device {device!r}: use cpu, cuda or cuda:N")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown torch device {device!r}: use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r}: this torch build sees no CUDA GPU; use cpu")
        index = 0 if parsed.index is None else parsed.index
        if index >= torch.cuda.device_count():
            raise UserError(f"device {device!r}: only {torch.cuda.device_count()} CUDA GPU(s) visible")
        parsed = torch.device("cuda", index)
    return parsed


def load_weights(model: nn.Module, path: str | Path, model_name: str) -> None:
    """Load a user's state_dict file into a zoo model, strictly."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise UserError(
            f"cannot read weights file {str(path)!r} ({type(exc).__name__}): save it with "
            "torch.save(model.state_dict(), path)"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UserError(
            f"weights file {str(path)!r} holds a {type(state).__name__}, not a state_dict: "
            "save it with torch.save(model.state_dict(), path)"
        )
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a key whose tensor has the wrong shape
        raise UserError(
            f"weights file {str(path)!r} does not fit model {model_name!r}: {str(exc).splitlines()[-1].strip()}"
        ) from None
    problems = [*result.missing_keys[:3], *result.unexpected_keys[:3]]
    if problems:
        raise UserError(
            f"weights file {str(path)!r} does not fit model {model_name!r} "
            f"({len(result.missing_keys)} missing, {len(result.unexpected_keys)} unexpected "
            f"keys, e.g. {', '.join(problems)})"
        )


class TorchRunner:
    """A zoo model with random (or user) weights, in inference mode.

    The fp32 CPU copy built at construction is kept pristine; each prepare()
    derives the device/precision copy from it, so switching precision between
    trials never accumulates rounding from earlier casts.
    """

    def __init__(self, model: str, device: str = "cpu", weights: str | Path | None = None) -> None:
        self.name = model
        self._spec = zoo.spec(model)
        self._device = _parse_device(device)
        self.device = str(self._device)
        self._base = zoo.build_model(model)
        if weights is not None:
            load_weights(self._base, weights, model)
        self._model: nn.Module | None = None
        self._input: torch.Tensor | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._output: torch.Tensor | None = None

    @property
    def _cuda(self) -> bool:
        return self._device.type == "cuda"

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        opts = check_settings(batch_size, precision, options)
        if not self._cuda and precision == "fp16":
            raise UserError(
                "fp16 is not supported by the CPU runner (its kernels are missing or emulated);"
                " use precision bf16 or fp32"
            )
        if opts["cuda_graphs"] and not self._cuda:
            raise UserError("cuda_graphs needs a CUDA device; turn it off for cpu")
        self._release()
        try:
            self._build(batch_size, DTYPES[precision], opts)
            self._warm_up(opts["cuda_graphs"])
        except torch.cuda.OutOfMemoryError:
            self._release()
            raise UserError(
                f"{self.name} at batch size {batch_size} ({precision}) does not fit in "
                f"{self.device} memory; use a smaller batch size"
            ) from None
        except Exception as exc:
            culprits = [f"precision {precision}"] if precision != "fp32" else []
            culprits += [key for key in ("compile", "cuda_graphs") if opts[key]]
            if not culprits:
                raise
            self._release()
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(
                f"{self.name} failed to run with {' and '.join(culprits)} on {self.device} "
                f"({type(exc).__name__}: {detail}); use fp32 and turn compile/cuda_graphs off"
            ) from None

    def _build(self, batch_size: int, dtype: torch.dtype, opts: dict[str, bool]) -> None:
        model = copy.deepcopy(self._base).to(device=self._device, dtype=dtype)
        batch = zoo.input_for(self.name, batch_size, self._device, dtype)
        if opts["channels_last"] and self._spec.cnn:
            model = model.to(memory_format=torch.channels_last)
            batch = batch.contiguous(memory_format=torch.channels_last)
        if opts["compile"]:
            model = torch.compile(model)
        self._model, self._input = model, batch

    def _warm_up(self, cuda_graphs: bool) -> None:
        """Run a few batches (lazy init, autotuning, compilation), then capture a graph."""
        assert self._model is not None and self._input is not None
        with torch.inference_mode():
            if not cuda_graphs:
                for _ in range(WARMUP_BATCHES):
                    self._model(self._input)
                self._sync()
                return
            # Warm up on a side stream, as graph capture requires.
            stream = torch.cuda.Stream(self._device)
            stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_BATCHES):
                    self._model(self._input)
            torch.cuda.current_stream(self._device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._output = self._model(self._input)
            self._graph = graph
            graph.replay()
            self._sync()

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._device)

    def infer(self) -> None:
        if self._model is None or self._input is None:
            raise RuntimeError("TorchRunner.infer() before prepare()")
        if self._graph is not None:
            self._graph.replay()
        else:
            with torch.inference_mode():
                self._model(self._input)
        self._sync()

    def _release(self) -> None:
        self._model = self._input = self._output = None
        self._graph = None
        if self._cuda:
            torch.cuda.empty_cache()

    def close(self) -> None:
        self._release()
