"""PyTorch models (the zoo or a user's own) run on the CPU or one CUDA GPU.

Imported only when a torch model is asked for (runners.make_runner), so the
core package works without torch.

A runner keeps the prepared variants of its model (one per batch size,
precision, memory format and graph mode) so that a study returning to a
configuration pays model copies, CUDA-graph capture and torch.compile once,
in prepare(), never inside a measured window.

On a GPU every warm-up and every batch that launches kernels op by op
(eager and compiled) runs on one thread the runner owns, whichever thread
calls ``infer``: PyTorch keeps cuDNN's execution plans per thread, so a
shape warmed on one thread costs its plan search again (40-90 ms for
resnet50 on an H200) the first time another thread runs it. A captured graph
replays from the caller's thread; it holds no such state. On the CPU the
caller's thread runs everything (no per-thread plans to keep warm, and a
hand-off per batch costs a busy host more than it saves).
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runners import zoo
from runners.base import RunSettings, check_settings, ladder
from tuner.errors import UserError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WARMUP_BATCHES = 3
# Prepared variants kept per runner: enough for a study's batch sizes x graph
# modes to come back without recompiling, few enough to bound device memory.
MAX_VARIANTS = 8


@dataclass
class ModelSource:
    """How to build a model and feed it: a zoo entry or a user's factory.

    ``build`` returns the fp32 CPU module; ``make_batch(batch_size, dtype)``
    returns CPU input tensors, floating ones already in ``dtype``.
    """

    name: str
    build: Callable[[], nn.Module]
    make_batch: Callable[[int, torch.dtype], tuple[torch.Tensor, ...]]


def zoo_source(model: str) -> ModelSource:
    zoo.spec(model)
    return ModelSource(
        name=model,
        build=lambda: zoo.build_model(model),
        make_batch=lambda batch, dtype: (zoo.input_for(model, batch, "cpu", dtype),),
    )


@dataclass
class _Shape:
    """One prepared batch size of a variant: its static inputs and, under CUDA graphs, the graph replaying them."""

    inputs: tuple[torch.Tensor, ...]
    graph: torch.cuda.CUDAGraph | None = None
    output: Any = None


@dataclass
class _Variant:
    """One prepared configuration: the model copy and its prepared batch sizes (the ladder, or the maximum).

    ``sizes`` maps a batch size to what runs it; ``infer(n)`` runs the
    smallest prepared size that holds n. Eager runs slice the maximum's
    inputs to n, so they run exactly the samples that arrived.
    """

    model: Any
    batch_size: int
    sizes: dict[int, _Shape]
    exact: bool
    warmed: set[int] = field(default_factory=set)

    @property
    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.sizes[self.batch_size].inputs

    def executed(self, n: int) -> int:
        """The batch size that runs n samples: n itself (eager), or the smallest prepared size that holds n."""
        if not 1 <= n <= self.batch_size:
            raise ValueError(f"a batch of {n} samples does not fit the prepared maximum of {self.batch_size}")
        return n if self.exact else min(s for s in self.sizes if s >= n)


class _ModelThread:
    """One daemon thread that runs the calls handed to it, in order, and hands back results or exceptions."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], threading.Event, list[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"powertune-model-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            call, done, box = job
            try:
                box.append((True, call()))
            except BaseException as exc:  # handed to the calling thread
                box.append((False, exc))
            done.set()

    def call(self, call: Callable[[], Any]) -> Any:
        if threading.current_thread() is self._thread:
            return call()
        done, box = threading.Event(), []
        self._jobs.put((call, done, box))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


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


def gpu_uuid(device: torch.device) -> str | None:
    """The UUID of the GPU torch runs on, as NVML and nvidia-smi spell it (GPU-...; MIG-... for an instance).

    The device (tuner.devices.nvml) checks it against the card it meters, so the
    GPU measured is the GPU that ran the model whatever CUDA_VISIBLE_DEVICES says.
    """
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


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
    """A torch model with random (or user) weights, in inference mode.

    The fp32 CPU copy built at construction is kept pristine; each variant
    is derived from it, so switching precision between trials never
    accumulates rounding from earlier casts.
    """

    def __init__(
        self,
        model: str | ModelSource,
        device: str = "cpu",
        weights: str | Path | None = None,
        model_thread: bool | None = None,
    ) -> None:
        self._source = model if isinstance(model, ModelSource) else zoo_source(model)
        self.name = self._source.name
        self._device = _parse_device(device)
        self.device = str(self._device)
        self.gpu_uuid = gpu_uuid(self._device)
        self._base = self._source.build().eval()
        if weights is not None:
            load_weights(self._base, weights, self.name)
        self._variants: OrderedDict[RunSettings, _Variant] = OrderedDict()
        self._active: _Variant | None = None
        self.compiles = 0
        # Eager runs any size: the sizes below the maximum to warm in prepare() are 1 up to this (None: all).
        self.warm_upto: int | None = None
        use_thread = self._cuda if model_thread is None else model_thread
        self._thread = _ModelThread(self.name) if use_thread else None

    @property
    def _cuda(self) -> bool:
        return self._device.type == "cuda"

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        """Make the variant for these settings current, building (and warming) it only the first time."""
        run = check_settings(batch_size, precision, options)
        if precision == "int8":
            raise UserError("int8 needs a TensorRT engine; PyTorch runners take fp32, fp16 or bf16")
        if not self._cuda and precision == "fp16":
            raise UserError(
                "fp16 is not supported by the CPU runner (its kernels are missing or emulated);"
                " use precision bf16 or fp32"
            )
        if run.graph == "cudagraphs" and not self._cuda:
            raise UserError("graph=cudagraphs needs a CUDA device; use graph=eager or compile on cpu")
        family = RunSettings(0, run.precision, run.channels_last, run.graph)
        if family in self._variants:
            self._variants.move_to_end(family)
            variant = self._variants[family]
        else:
            self._active = None
            while len(self._variants) >= MAX_VARIANTS:
                self._variants.popitem(last=False)
            variant = _Variant(self._new_model(run), batch_size, {}, exact=run.graph == "eager")
        try:
            self._on_model_thread(lambda: self._add_sizes(variant, run))
        except torch.cuda.OutOfMemoryError:
            self._release()
            raise UserError(
                f"{self.name} at batch size {batch_size} ({precision}) does not fit in "
                f"{self.device} memory; use a smaller batch size"
            ) from None
        except Exception as exc:
            culprits = [f"precision {precision}"] if precision != "fp32" else []
            culprits += [f"graph={run.graph}"] if run.graph != "eager" else []
            if not culprits:
                raise
            self._variants.pop(family, None)
            self._empty_cache()
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise UserError(
                f"{self.name} failed to run with {' and '.join(culprits)} on {self.device} "
                f"({type(exc).__name__}: {detail}); use fp32 and graph=eager"
            ) from None
        variant.batch_size = batch_size
        self._variants[family] = variant
        self._active = variant

    def _new_model(self, run: RunSettings) -> Any:
        model = copy.deepcopy(self._base).to(device=self._device, dtype=DTYPES[run.precision])
        if run.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if run.graph == "compile":
            model = torch.compile(model)
            self.compiles += 1
        return model

    def _inputs(self, run: RunSettings, batch_size: int) -> tuple[torch.Tensor, ...]:
        inputs = tuple(t.to(self._device) for t in self._source.make_batch(batch_size, DTYPES[run.precision]))
        if run.channels_last:
            inputs = tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)
        return inputs

    def _add_sizes(self, variant: _Variant, run: RunSettings) -> None:
        """Prepare the batch sizes this maximum needs and the variant lacks, largest first.

        Eager runs any size by slicing the maximum's inputs, so it needs only
        the maximum's inputs, and runs the smaller sizes a window will see
        (1 up to ``warm_upto``, then the powers of two) once here: a shape's
        first run selects its kernels (cuDNN and cuBLAS heuristics,
        workspace), which would otherwise stall a window's first batch of that
        size. Offline windows run full batches only (``warm_upto`` 0). CUDA
        graphs and torch.compile run the ladder (1, 2, 4, ..., maximum): one
        graph (or one specialisation) per size, captured or compiled here and
        never inside a window; captures share one memory pool, since a window
        replays one graph at a time.
        """
        sizes = [run.batch_size] if variant.exact else ladder(run.batch_size)
        missing = sorted((b for b in sizes if b not in variant.sizes), reverse=True)
        pool = torch.cuda.graph_pool_handle() if run.graph == "cudagraphs" and missing else None
        for b in missing:
            shape = _Shape(self._inputs(run, b))
            self._warm_up(variant.model, shape, pool)
            variant.sizes[b] = shape
            variant.warmed.add(b)
        if variant.exact:
            inputs = variant.sizes[run.batch_size].inputs
            upto = run.batch_size - 1 if self.warm_upto is None else min(self.warm_upto, run.batch_size - 1)
            powers = {s for s in ladder(run.batch_size) if s < run.batch_size} if upto else set()
            wanted = set(range(1, upto + 1)) | powers
            with torch.inference_mode():
                for n in sorted(wanted):
                    if n not in variant.warmed:
                        variant.model(*(t[:n] for t in inputs))
                        variant.warmed.add(n)
            self._sync()

    def _warm_up(self, model: Any, shape: _Shape, pool: Any) -> None:
        """Run a few batches (lazy init, autotuning, compilation), then capture a graph if a pool is given."""
        with torch.inference_mode():
            if pool is None:
                for _ in range(WARMUP_BATCHES):
                    model(*shape.inputs)
                self._sync()
                return
            # Warm up on a side stream, as graph capture requires.
            stream = torch.cuda.Stream(self._device)
            stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_BATCHES):
                    model(*shape.inputs)
            torch.cuda.current_stream(self._device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                shape.output = model(*shape.inputs)
            shape.graph = graph
            graph.replay()
            self._sync()

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self._device)

    def infer(self, size: int | None = None) -> int:
        """Run ``size`` samples (default: the prepared maximum) and return the batch size that ran them."""
        variant = self._active
        if variant is None:
            raise RuntimeError("TorchRunner.infer() before prepare()")
        n = variant.batch_size if size is None else size
        executed = variant.executed(n)
        shape = variant.sizes.get(executed)
        if shape is not None and shape.graph is not None:
            shape.graph.replay()
            self._sync()
        else:
            self._on_model_thread(lambda: self._run(variant, n, executed))
        return executed

    def _on_model_thread(self, call: Callable[[], Any]) -> Any:
        return call() if self._thread is None else self._thread.call(call)

    def _run(self, variant: _Variant, n: int, executed: int) -> None:
        """One op-by-op batch on the model thread: n rows of the smallest prepared inputs that hold them."""
        with torch.inference_mode():
            if variant.exact:
                holder = variant.sizes[min(s for s in variant.sizes if s >= n)]
                variant.model(*(t[:n] for t in holder.inputs))
            else:
                variant.model(*variant.sizes[executed].inputs)
        self._sync()

    def _empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()

    def _release(self) -> None:
        self._variants.clear()
        self._active = None
        self._empty_cache()

    def close(self) -> None:
        self._release()
        if self._thread is not None:
            self._thread.close()
            self._thread = None
