"""A small fake of the tensorrt Python API (TensorRT 8.5+/10 names), for CI machines without a GPU.

It follows the calls the runner makes, as documented for TensorRT's Python API:
Builder/NetworkDefinition/OnnxParser/IBuilderConfig/IOptimizationProfile to build,
Runtime.deserialize_cuda_engine to load, and ICudaEngine/IExecutionContext with named
I/O tensors (get_tensor_name/mode/shape/dtype, set_input_shape, set_tensor_address,
execute_async_v3). An "ONNX file" for it is the protobuf tag byte 0x08 then JSON naming
the inputs; an engine file is
the JSON the fake builder serialises. It records what it was asked to do; it does not
model kernels, layers, timing or precision loss.

DLAs, as NVIDIA's TensorRT guide ("Working with DLA", "Building and Launching
the Loadable") describes them: ``Builder.num_DLA_cores`` says how many the
platform has (0 off Jetson; set it to 2 for an AGX Orin or Xavier);
``IBuilderConfig.default_device_type = DeviceType.DLA`` with ``DLA_core`` picks
one, and DLA builds take FP16 or INT8 only: an FP32 build, or a core the
platform lacks, fails (``build_serialized_network`` returns None, as the real
builder does after logging the error). ``BuilderFlag.GPU_FALLBACK`` is
recorded; ``Runtime.DLA_core`` is the core a DLA engine is loaded on.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    INT64 = 5


class TensorIOMode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


class BuilderFlag(enum.Enum):
    FP16 = 0
    INT8 = 1
    GPU_FALLBACK = 2


class DeviceType(enum.Enum):
    GPU = 0
    DLA = 1


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class Logger:
    WARNING = 2

    def __init__(self, level: int = 2) -> None:
        self.level = level


class _Tensor:
    def __init__(self, name: str, shape: list[int], dtype: DataType) -> None:
        self.name, self.shape, self.dtype = name, tuple(shape), dtype
        self.dynamic_range: tuple[float, float] | None = None

    def set_dynamic_range(self, low: float, high: float) -> bool:
        self.dynamic_range = (low, high)
        return True


class _Layer:
    def __init__(self, outputs: list[_Tensor]) -> None:
        self.outputs = outputs
        self.num_outputs = len(outputs)

    def get_output(self, i: int) -> _Tensor:
        return self.outputs[i]


class _Network:
    def __init__(self) -> None:
        self.inputs: list[_Tensor] = []
        self.layers: list[_Layer] = []
        self.output_spec: list[tuple[str, list[int]]] = []

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> _Tensor:
        return self.inputs[i]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, i: int) -> _Layer:
        return self.layers[i]


class OnnxParser:
    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.errors: list[str] = []

    def parse(self, blob: bytes) -> bool:
        try:
            graph = json.loads(blob[1:] if blob[:1] == b"\x08" else blob)
        except ValueError:
            self.errors.append("ModelImporter: failed to parse the ONNX protobuf")
            return False
        for item in graph["inputs"]:
            self.network.inputs.append(_Tensor(item["name"], item["shape"], DataType[item.get("dtype", "FLOAT")]))
        out = _Tensor(graph["output"]["name"], graph["output"]["shape"], DataType.FLOAT)
        self.network.layers.append(_Layer([out]))
        self.network.output_spec.append((out.name, graph["output"]["shape"]))
        return True

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> str:
        return self.errors[i]


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name: str, low: tuple, opt: tuple, high: tuple) -> None:
        self.shapes[name] = (tuple(low), tuple(opt), tuple(high))


class _Config:
    def __init__(self) -> None:
        self.flags: set[BuilderFlag] = set()
        self.profiles: list[_Profile] = []
        self.pool: dict = {}
        self.default_device_type = DeviceType.GPU
        self.DLA_core = -1

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pool[pool] = size

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class Builder:
    platform_has_fast_fp16 = True
    platform_has_fast_int8 = True
    num_DLA_cores = 0
    built: ClassVar[list[dict]] = []

    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        return _Network()

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        """An engine whose tensors are -1 on every axis the profile lets vary, as TensorRT reports them."""
        profile = config.profiles[0].shapes
        half = BuilderFlag.FP16 in config.flags
        dla = config.default_device_type == DeviceType.DLA
        if dla and not (half or BuilderFlag.INT8 in config.flags):
            return None  # DLA runs FP16 and INT8 networks only
        if dla and not 0 <= config.DLA_core < self.num_DLA_cores:
            return None

        def engine_shape(low: tuple, high: tuple) -> list[int]:
            return [lo if lo == hi else -1 for lo, hi in zip(low, high, strict=True)]

        first = profile[network.inputs[0].name]
        batch = engine_shape(first[0][:1], first[2][:1])
        record = {
            "device": config.default_device_type.name,
            "dla_core": config.DLA_core if dla else -1,
            "flags": sorted(f.name for f in config.flags),
            "int8_ranges": all(
                layer.get_output(j).dynamic_range for layer in network.layers for j in range(layer.num_outputs)
            ),
            "inputs": [
                {"name": t.name, "shape": engine_shape(profile[t.name][0], profile[t.name][2]), "dtype": t.dtype.name,
                 "profile": profile[t.name]}
                for t in network.inputs
            ],
            "outputs": [
                {"name": name, "shape": [*batch, *shape[1:]], "dtype": "HALF" if half else "FLOAT"}
                for name, shape in network.output_spec
            ],
        }  # fmt: skip
        Builder.built.append(record)
        return json.dumps(record).encode()


class _Context:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.runs = 0
        self.batches: list[int] = []

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        """False for a shape outside the engine's profile (or a fixed axis changed), as TensorRT returns."""
        spec = self.engine.tensors[name]
        low, _, high = spec.get("profile") or (spec["shape"],) * 3
        if len(shape) != len(low) or not all(lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple:
        """Inputs as set; outputs resolved from the inputs' batch, as TensorRT's shape inference does."""
        if name in self.shapes:
            return self.shapes[name]
        shape = list(self.engine.tensors[name]["shape"])
        if shape and shape[0] == -1 and self.shapes:
            shape[0] = next(iter(self.shapes.values()))[0]
        return tuple(shape)

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream: int) -> bool:
        missing = set(self.engine.tensors) - set(self.addresses)
        if missing:
            raise RuntimeError(f"unbound tensors {missing}")
        inputs = [n for n, t in self.engine.tensors.items() if t["mode"] == TensorIOMode.INPUT]
        unset = [n for n in inputs if -1 in self.engine.tensors[n]["shape"] and n not in self.shapes]
        if unset:
            raise RuntimeError(f"dynamic input shapes not set: {unset}")
        self.runs += 1
        self.batches.append(self.get_tensor_shape(inputs[0])[0])
        return True


class _Engine:
    def __init__(self, record: dict) -> None:
        self.record = record
        self.tensors = {t["name"]: {**t, "mode": TensorIOMode.INPUT} for t in record["inputs"]}
        self.tensors.update({t["name"]: {**t, "mode": TensorIOMode.OUTPUT} for t in record["outputs"]})
        self.names = list(self.tensors)
        self.contexts: list[_Context] = []
        self.dla_core = -1

    @property
    def num_io_tensors(self) -> int:
        return len(self.names)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.tensors[name]["mode"]

    def get_tensor_shape(self, name: str) -> tuple:
        return tuple(self.tensors[name]["shape"])

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self.tensors[name]["dtype"]]

    def get_tensor_profile_shape(self, name: str, profile: int) -> tuple:
        return tuple(tuple(s) for s in self.tensors[name]["profile"])

    def create_execution_context(self) -> _Context:
        context = _Context(self)
        self.contexts.append(context)
        return context


class Runtime:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger
        self.DLA_core = -1

    def deserialize_cuda_engine(self, blob: bytes) -> _Engine | None:
        try:
            engine = _Engine(json.loads(blob))
        except ValueError:
            return None
        if engine.record.get("device") == "DLA":
            engine.dla_core = self.DLA_core if self.DLA_core >= 0 else engine.record["dla_core"]
        return engine


def module() -> SimpleNamespace:
    """The fake as a module-like object to put in sys.modules['tensorrt']."""
    Builder.built = []
    Builder.num_DLA_cores = 0
    return SimpleNamespace(
        DataType=DataType,
        TensorIOMode=TensorIOMode,
        BuilderFlag=BuilderFlag,
        DeviceType=DeviceType,
        NetworkDefinitionCreationFlag=NetworkDefinitionCreationFlag,
        MemoryPoolType=MemoryPoolType,
        Logger=Logger,
        Builder=Builder,
        OnnxParser=OnnxParser,
        Runtime=Runtime,
        __version__="10.3.0-fake",
    )


def onnx_file(path: Path, batch: int = -1) -> Path:
    """A model file this fake parses: an image input and a logits output, batch axis ``batch`` (-1: dynamic)."""
    spec = {
        "inputs": [{"name": "images", "shape": [batch, 3, 8, 8]}],
        "output": {"name": "logits", "shape": [batch, 10]},
    }
    path.write_bytes(b"\x08" + json.dumps(spec).encode())  # the first byte of an ONNX protobuf
    return path


def cpu_torch() -> SimpleNamespace:
    """PyTorch with every 'cuda' buffer on the CPU and a stream that only counts, for the fake engine."""
    import torch

    class Stream:
        cuda_stream = 0

        def __init__(self, device: object) -> None:
            self.synced = 0

        def synchronize(self) -> None:
            self.synced += 1

    names = ("float32", "float16", "int8", "int32", "int64", "bool", "randn", "zeros", "empty")
    return SimpleNamespace(
        **{n: getattr(torch, n) for n in names},
        device=lambda name: torch.device("cpu"),
        cuda=SimpleNamespace(Stream=Stream),
    )
