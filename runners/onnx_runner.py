"""User ONNX files run by onnxruntime (the optional ``onnx`` extra, or ``onnx-gpu`` for CUDA).

On ``cuda:N`` the CUDA execution provider runs the graph (onnxruntime-gpu),
with inputs and outputs bound on the GPU so no host copies enter the window.

The file fixes the arithmetic precision and layout, so the runner checks the
requested precision against the graph rather than converting anything. The
batch axis is dynamic: ``infer(n)`` runs exactly n samples, on a view of the
inputs prepared at the maximum batch size (on the GPU, a binding of the first
n rows of the same device buffer, so no copy enters the window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runners.base import check_settings
from tuner.errors import UserError

INSTALL_HINT = "pip install 'powertune[onnx]'"
_FLOAT_TYPES = {"tensor(float)": "fp32", "tensor(float16)": "fp16", "tensor(bfloat16)": "bf16"}
_NUMPY_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"ONNX models need onnxruntime: {INSTALL_HINT}") from None
    return onnxruntime


def _providers(ort: Any, device: str) -> list[Any]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2] or "0"
        if not index.isdigit():
            raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise UserError(f"device {device!r}: this onnxruntime has no CUDA provider; pip install onnxruntime-gpu")
        return [("CUDAExecutionProvider", {"device_id": int(index)})]
    raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


class OnnxRunner:
    """An ONNX graph fed synthetic inputs shaped from its own input signature."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        ort = _import_ort()
        path = Path(path)
        if path.suffix != ".onnx":
            raise UserError(f"{str(path)!r} is not an .onnx file")
        if not path.is_file():
            raise UserError(f"ONNX file {str(path)!r} does not exist")
        self.name = path.stem
        self.device = device
        self._ort = ort
        providers = _providers(ort, device)
        self._cuda_id = providers[0][1]["device_id"] if isinstance(providers[0], tuple) else None
        try:
            self._session = ort.InferenceSession(str(path), providers=providers)
        except Exception as exc:  # onnxruntime's own exception types, not importable stably
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"cannot load ONNX file {str(path)!r}: {first}") from None
        if self._cuda_id is not None and "CUDAExecutionProvider" not in self._session.get_providers():
            # onnxruntime falls back to the CPU, with only a warning, when the CUDA libraries do not load.
            raise UserError(
                f"onnxruntime could not start its CUDA provider for {device!r} (CUDA/cuDNN libraries "
                "missing or mismatched): install the onnxruntime-gpu build that matches the CUDA version"
            )
        self._feeds: dict[str, np.ndarray] | None = None
        self._binding: Any = None
        self._values: dict[str, Any] = {}
        self._batch_size = 0
        self._bound = 0

    def _graph_precision(self) -> str:
        """The precision of the graph's floating inputs; fp32 when it takes none (token ids)."""
        for node in self._session.get_inputs():
            if node.type in _FLOAT_TYPES:
                return _FLOAT_TYPES[node.type]
        return "fp32"

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        run = check_settings(batch_size, precision, options)
        enabled = [name for name, on in (("channels_last", run.channels_last), ("graph", run.graph != "eager")) if on]
        if enabled:
            raise UserError(
                f"the ONNX runner does not support {', '.join(enabled)}; bake layout and "
                "graph optimisations into the exported file instead"
            )
        fixed = self._graph_precision()
        if precision != fixed:
            raise UserError(
                f"{self.name}.onnx computes in {fixed}: the file fixes the precision; "
                f"use precision {fixed} or export a {precision} model"
            )
        rng = np.random.default_rng(batch_size)
        feeds = {}
        for node in self._session.get_inputs():
            feeds[node.name] = self._synthetic(node, batch_size, rng)
        self._feeds = feeds
        self._batch_size = batch_size
        self._binding = self._bind(feeds) if self._cuda_id is not None else None
        self.infer()

    def _bind(self, feeds: dict[str, np.ndarray]) -> Any:
        """Keep inputs and outputs on the GPU, so a window measures the model, not PCIe copies."""
        self._values = {
            name: self._ort.OrtValue.ortvalue_from_numpy(array, "cuda", self._cuda_id) for name, array in feeds.items()
        }
        self._bound = 0
        binding = self._session.io_binding()
        for node in self._session.get_outputs():
            binding.bind_output(node.name, "cuda", self._cuda_id)
        return binding

    def _bind_rows(self, n: int) -> None:
        """Point the binding's inputs at the first n rows of the device buffers (a host-side call, no copy)."""
        assert self._feeds is not None
        for name, array in self._feeds.items():
            self._binding.bind_input(
                name, "cuda", self._cuda_id, array.dtype.type, [n, *array.shape[1:]], self._values[name].data_ptr()
            )
        self._bound = n

    def _synthetic(self, node: Any, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        if node.type not in _NUMPY_TYPES:
            raise UserError(f"input {node.name!r} of {self.name}.onnx has unsupported type {node.type}")
        shape = list(node.shape)
        if not shape:
            raise UserError(f"input {node.name!r} of {self.name}.onnx is a scalar; no batch axis")
        if isinstance(shape[0], int) and shape[0] != batch_size:
            raise UserError(
                f"{self.name}.onnx has a fixed batch size of {shape[0]} on input {node.name!r}; "
                "export it with a dynamic batch axis"
            )
        shape[0] = batch_size
        for axis, dim in enumerate(shape[1:], start=1):
            if not isinstance(dim, int):
                raise UserError(
                    f"input {node.name!r} of {self.name}.onnx has a symbolic dimension {dim!r} "
                    f"at axis {axis}; export it with fixed shapes beyond the batch axis"
                )
        dtype = _NUMPY_TYPES[node.type]
        if np.issubdtype(dtype, np.floating):
            return rng.standard_normal(shape).astype(dtype)
        # Zero is a valid index for any embedding table and a valid mask value.
        return np.zeros(shape, dtype=dtype)

    def infer(self, size: int | None = None) -> int:
        """Run ``size`` samples (default: the prepared batch size) at exactly that batch size."""
        if self._feeds is None:
            raise RuntimeError("OnnxRunner.infer() before prepare()")
        n = self._batch_size if size is None else size
        if not 1 <= n <= self._batch_size:
            raise ValueError(f"a batch of {n} samples does not fit the prepared maximum of {self._batch_size}")
        if self._binding is None:
            self._session.run(None, {name: array[:n] for name, array in self._feeds.items()})
            return n
        if n != self._bound:
            self._bind_rows(n)
        self._session.run_with_iobinding(self._binding)
        self._binding.synchronize_outputs()
        return n

    def close(self) -> None:
        self._feeds = None
        self._binding = None
        self._values = {}
