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
- On a Jetson with DLAs, ``dla_cores`` engines run beside the GPU's, one per
  DLA core, each at ``dla_batch_size``: built with DLA as the default device
  and GPU fallback for the layers DLA lacks, in fp16 or int8 (DLA runs no
  fp32), as NVIDIA's TensorRT guide "Working with DLA" sets them up, and
  cached per (engine, batch size, precision) like the GPU's. :meth:`lanes`
  lists the engines, and the measurement window feeds them all from one
  queue of samples, so each reports its own throughput.

Not yet run on hardware: tested against a fake of the tensorrt API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.base import check_settings
from tuner.errors import UserError

INSTALL_HINT = "TensorRT ships with JetPack (python3-libnvinfer); elsewhere pip install 'powertune[tensorrt]'"
# A placeholder int8 range for every tensor, as trtexec uses without calibration data.
INT8_RANGE = 4.0
WORKSPACE_BYTES = 1 << 30


@dataclass
class _Bound:
    """One engine ready to run: its execution context, I/O buffers and CUDA stream."""

    engine: Any
    batch_size: int
    context: Any
    buffers: dict[str, Any]
    stream: Any
    dynamic: bool
    shapes: dict[str, list[int]]
    rows: int


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
        self._engines: dict[tuple[str, int, str], Any] = {}
        self._bound: dict[str, _Bound] = {}
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

    def _build(self, batch_size: int, precision: str, dla_core: int = -1) -> Any:
        """Parse the ONNX file and build an engine for one batch size and precision, on the GPU or a DLA core."""
        trt = self.trt
        builder = trt.Builder(self.logger)
        if dla_core >= 0 and precision not in ("fp16", "int8"):
            raise UserError(f"a DLA runs fp16 or int8 networks, not {precision}: use precision fp16 or int8 with DLAs")
        if dla_core >= 0 and dla_core >= int(getattr(builder, "num_DLA_cores", 0)):
            raise UserError(
                f"this device has {int(getattr(builder, 'num_DLA_cores', 0))} DLA core(s), not {dla_core + 1}: "
                "use fewer dla_cores (AGX Orin and Xavier have 2, Orin Nano none)"
            )
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
        if dla_core >= 0:
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = dla_core
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
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
        where = f" on DLA core {dla_core}" if dla_core >= 0 else ""
        if blob is None:
            raise UserError(f"TensorRT failed to build {self.name} at batch {batch_size} in {precision}{where}")
        self.builds += 1
        if dla_core >= 0:
            self.runtime.DLA_core = dla_core
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
            if run.dla_cores:
                raise UserError(
                    f"{self.path.name} is a built engine, which fixes its device: give the .onnx file to use DLAs"
                )
            engine = self._prebuilt
        else:
            engine = self._engine("gpu", batch_size, precision, -1)
        bound = {"gpu": self._bind(engine, batch_size)}
        for core in range(run.dla_cores):
            name = f"dla{core}"
            bound[name] = self._bind(self._engine(name, run.dla_batch_size, precision, core), run.dla_batch_size)
        self._bound = bound
        for lane in self._bound.values():
            self._run(lane)

    def _engine(self, name: str, batch_size: int, precision: str, dla_core: int) -> Any:
        """The cached engine for (GPU or DLA core, batch size, precision), built on first use."""
        key = (name, batch_size, precision)
        if key not in self._engines:
            self._engines[key] = self._build(batch_size, precision, dla_core)
        return self._engines[key]

    def lanes(self) -> list[tuple[str, int, Callable[[int | None], int]]]:
        """The engines a window feeds from one queue when DLAs run beside the GPU; none when the GPU is alone."""
        if len(self._bound) < 2:
            return []
        return [
            (name, lane.batch_size, self.infer if name == "gpu" else self._fixed(lane))
            for name, lane in self._bound.items()
        ]

    def _bind(self, engine: Any, batch_size: int) -> _Bound:
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
        return _Bound(engine, batch_size, context, buffers, torch.cuda.Stream(device), dynamic, shapes, batch_size)

    def _fixed(self, lane: _Bound) -> Callable[[int | None], int]:
        """A DLA lane's infer: its engine runs its whole batch, whatever arrived."""

        def infer(size: int | None = None) -> int:
            self._run(lane)
            return lane.batch_size

        return infer

    def _run(self, lane: _Bound) -> None:
        if not lane.context.execute_async_v3(lane.stream.cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.name}")
        lane.stream.synchronize()

    def infer(self, size: int | None = None) -> int:
        """Run ``size`` samples on the GPU engine (default: the prepared maximum); the DLAs run through lanes.

        A fixed-batch engine runs its full batch.
        """
        lane = self._bound.get("gpu")
        if lane is None:
            raise RuntimeError("TensorRTRunner.infer() before prepare()")
        n = lane.batch_size if size is None else size
        if not 1 <= n <= lane.batch_size:
            raise ValueError(f"a batch of {n} samples does not fit the prepared maximum of {lane.batch_size}")
        if not lane.dynamic:
            n = lane.batch_size
        elif n != lane.rows:
            for name, shape in lane.shapes.items():
                if lane.context.set_input_shape(name, (n, *shape[1:])) is False:
                    raise RuntimeError(f"{self.name}: TensorRT refused batch {n} for input {name!r}")
            lane.rows = n
        self._run(lane)
        return n

    def close(self) -> None:
        self._bound = {}
        self._engines.clear()
