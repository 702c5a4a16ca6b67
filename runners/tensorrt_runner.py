"""TensorRT engines, and ONNX files built into engines (the optional ``tensorrt`` extra).

Written against the tensorrt Python API that JetPack 5.1+ and 6 ship (TensorRT
8.5 and newer: named I/O tensors, ``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``). Device buffers and the stream come from PyTorch, which
Jetson images carry, so no pycuda is needed.

- ``model.engine``/``model.plan``: a serialized engine. It fixes its
  precision: the precision knob must name its input type (fp32, fp16, int8),
  as with ONNX files.
- ``model.onnx`` with ``--runtime tensorrt``: one engine is built per
  maximum batch size and precision (fp32, fp16, int8 where the GPU has fast
  paths for them), with an optimization profile spanning batch 1 to the
  maximum (tuned for the maximum), and kept for the runner's life, so a study
  builds each once and never inside a window.
- ``infer(n)`` runs n samples: the context's input shape is set to n rows
  of the buffers allocated at the maximum. An engine with a fixed batch axis
  runs every batch at that size (padded). int8 without a calibration cache gets placeholder
  dynamic ranges, as ``trtexec --int8`` does: speed and energy are
  representative, outputs are not.

Not yet run on hardware: tested against a fake of the tensorrt API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runners.base import check_settings
from tuner.errors import UserError

INSTALL_HINT = "TensorRT ships with JetPack (python3-libnvinfer); elsewhere pip install 'powertune[tensorrt]'"
# A placeholder int8 range for every tensor, as trtexec uses without calibration data.
INT8_RANGE = 4.0
WORKSPACE_BYTES = 1 << 30


def _import_trt() -> Any:
    try:
        import tensorrt
    except ImportError:
        raise UserError(f"TensorRT models need the tensorrt Python package: {INSTALL_HINT}") from None
    return tensorrt


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UserError(
            "the TensorRT runner allocates GPU buffers with PyTorch: pip install 'powertune[torch]'"
        ) from None
    return torch


class TensorRTRunner:
    """A TensorRT engine fed synthetic inputs on one CUDA GPU."""

    def __init__(self, path: str | Path, device: str = "cuda:0", trt: Any = None, torch: Any = None) -> None:
        path = Path(path)
        if path.suffix.lower() not in (".engine", ".plan", ".onnx"):
            raise UserError(f"{str(path)!r} is neither a TensorRT engine (.engine/.plan) nor an .onnx file")
        if not path.is_file():
            raise UserError(f"model file {str(path)!r} does not exist")
        if device != "cuda" and not device.startswith("cuda:"):
            raise UserError(f"TensorRT runs on an NVIDIA GPU, not {device!r}: use --device cuda:N or a Jetson board")
        self.trt = trt or _import_trt()
        self.torch = torch or _import_torch()
        self.name = path.stem
        self.device = device
        self.path = path
        self.logger = self.trt.Logger(self.trt.Logger.WARNING)
        self.runtime = self.trt.Runtime(self.logger)
        self._prebuilt = None if path.suffix.lower() == ".onnx" else self._deserialize(path.read_bytes())
        self._engines: dict[tuple[int, str], Any] = {}
        self._context: Any = None
        self._buffers: dict[str, Any] = {}
        self._stream: Any = None
        self._batch_size = 0
        self._dynamic = False
        self._shapes: dict[str, list[int]] = {}
        self._bound = 0
        self.builds = 0

    def _deserialize(self, blob: bytes) -> Any:
        engine = self.runtime.deserialize_cuda_engine(blob)
        if engine is None:
            raise UserError(
                f"TensorRT could not load {self.path.name}: it was built for another TensorRT version or GPU; "
                "rebuild it on this device"
            )
        return engine

    def _inputs(self, engine: Any) -> list[str]:
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        return [n for n in names if engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT]

    def _engine_precision(self, engine: Any) -> str:
        """A prebuilt engine's precision: the type of its first floating (or int8) input; fp32 for token ids."""
        types = {self.trt.DataType.FLOAT: "fp32", self.trt.DataType.HALF: "fp16", self.trt.DataType.INT8: "int8"}
        for name in self._inputs(engine):
            kind = engine.get_tensor_dtype(name)
            if kind in types:
                return types[kind]
        return "fp32"

    def _build(self, batch_size: int, precision: str) -> Any:
        """Parse the ONNX file and build an engine for one batch size and precision."""
        trt = self.trt
        builder = trt.Builder(self.logger)
        if precision == "fp16" and not builder.platform_has_fast_fp16:
            raise UserError(f"this GPU has no fast fp16 path in TensorRT: use precision fp32 for {self.name}")
        if precision == "int8" and not builder.platform_has_fast_int8:
            raise UserError(f"this GPU has no fast int8 path in TensorRT: use fp16 or fp32 for {self.name}")
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse(self.path.read_bytes()):
            first = str(parser.get_error(0)) if parser.num_errors else "unknown error"
            raise UserError(f"TensorRT cannot parse {self.path.name}: {first}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        if precision == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        if precision == "int8":
            config.set_flag(trt.BuilderFlag.INT8)
            config.set_flag(trt.BuilderFlag.FP16)
            self._placeholder_ranges(network)
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = list(tensor.shape)
            if shape and shape[0] not in (-1, batch_size):
                raise UserError(
                    f"{self.name}.onnx has a fixed batch size of {shape[0]}; export it with a dynamic batch axis"
                )
            if any(d < 0 for d in shape[1:]):
                raise UserError(f"input {tensor.name!r} of {self.name}.onnx has dynamic axes beyond the batch axis")
            rest = tuple(shape[1:])
            profile.set_shape(tensor.name, (1, *rest), (batch_size, *rest), (batch_size, *rest))
        config.add_optimization_profile(profile)
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            raise UserError(f"TensorRT failed to build {self.name} at batch {batch_size} in {precision}")
        self.builds += 1
        return self._deserialize(bytes(blob))

    def _placeholder_ranges(self, network: Any) -> None:
        for i in range(network.num_inputs):
            network.get_input(i).set_dynamic_range(-INT8_RANGE, INT8_RANGE)
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            for j in range(layer.num_outputs):
                layer.get_output(j).set_dynamic_range(-INT8_RANGE, INT8_RANGE)

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        run = check_settings(batch_size, precision, options)
        enabled = [name for name, on in (("channels_last", run.channels_last), ("graph", run.graph != "eager")) if on]
        if enabled:
            raise UserError(
                f"the TensorRT runner does not support {', '.join(enabled)}: TensorRT fixes layout and graph"
            )
        if precision == "bf16":
            raise UserError("the TensorRT runner takes fp32, fp16 or int8")
        if self._prebuilt is not None:
            fixed = self._engine_precision(self._prebuilt)
            if precision != fixed:
                raise UserError(
                    f"{self.path.name} computes in {fixed}: the engine fixes the precision; use precision {fixed}"
                )
            engine = self._prebuilt
        else:
            key = (batch_size, precision)
            if key not in self._engines:
                self._engines[key] = self._build(batch_size, precision)
            engine = self._engines[key]
        self._bind(engine, batch_size)
        self.infer()

    def _bind(self, engine: Any, batch_size: int) -> None:
        """Allocate every I/O tensor on the GPU and point the execution context at them."""
        torch, trt = self.torch, self.trt
        dtypes = {
            trt.DataType.FLOAT: torch.float32,
            trt.DataType.HALF: torch.float16,
            trt.DataType.INT8: torch.int8,
            trt.DataType.INT32: torch.int32,
            trt.DataType.BOOL: torch.bool,
        }
        int64 = getattr(trt.DataType, "INT64", None)
        if int64 is not None:
            dtypes[int64] = torch.int64
        context = engine.create_execution_context()
        device = torch.device(self.device)
        buffers: dict[str, Any] = {}
        shapes: dict[str, list[int]] = {}
        dynamic = False
        for name in self._inputs(engine):
            shape = list(engine.get_tensor_shape(name))
            if shape and shape[0] == -1:
                dynamic = True
                low, _, high = (s[0] for s in engine.get_tensor_profile_shape(name, 0))
                if not low <= batch_size <= high:
                    raise UserError(f"{self.path.name} takes batch sizes {low}-{high}, not {batch_size}")
                shape[0] = batch_size
            elif shape and shape[0] != batch_size:
                raise UserError(f"{self.path.name} has a fixed batch size of {shape[0]}; use --batch-sizes {shape[0]}")
            if context.set_input_shape(name, tuple(shape)) is False:
                raise UserError(f"{self.path.name} does not accept shape {tuple(shape)} for input {name!r}")
            shapes[name] = shape
            kind = dtypes[engine.get_tensor_dtype(name)]
            if kind.is_floating_point:
                buffers[name] = torch.randn(shape, device=device).to(kind)
            else:
                buffers[name] = torch.zeros(shape, dtype=kind, device=device)
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if name not in buffers:
                shape = tuple(context.get_tensor_shape(name))
                buffers[name] = torch.empty(shape, dtype=dtypes[engine.get_tensor_dtype(name)], device=device)
        for name, tensor in buffers.items():
            context.set_tensor_address(name, tensor.data_ptr())
        self._context, self._buffers = context, buffers
        self._stream = torch.cuda.Stream(device)
        self._batch_size, self._dynamic, self._shapes, self._bound = batch_size, dynamic, shapes, batch_size

    def infer(self, size: int | None = None) -> int:
        """Run ``size`` samples (default: the prepared maximum); a fixed-batch engine runs its full batch."""
        if self._context is None:
            raise RuntimeError("TensorRTRunner.infer() before prepare()")
        n = self._batch_size if size is None else size
        if not 1 <= n <= self._batch_size:
            raise ValueError(f"a batch of {n} samples does not fit the prepared maximum of {self._batch_size}")
        if not self._dynamic:
            n = self._batch_size
        elif n != self._bound:
            for name, shape in self._shapes.items():
                if self._context.set_input_shape(name, (n, *shape[1:])) is False:
                    raise RuntimeError(f"{self.name}: TensorRT refused batch {n} for input {name!r}")
            self._bound = n
        if not self._context.execute_async_v3(self._stream.cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.name}")
        self._stream.synchronize()
        return n

    def close(self) -> None:
        self._context, self._buffers, self._stream = None, {}, None
        self._engines.clear()
