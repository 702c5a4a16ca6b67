"""A causal LM generating on transformers' continuous batching: the in-process LLM runner.

Imported only when an LLM is asked for (runners.make_runner), so the core
package works without transformers (the ``llm`` extra).

The library schedules: every query is one request to its
ContinuousBatchingManager (``init_continuous_batching``), which admits
requests into the running batch as sequences finish, chunks long prompts
over steps of at most ``max_batch_tokens`` tokens, and keeps the KV cache in
pages (its paged cache). This runner only feeds requests in and reads the
streamed tokens out: the first streamed token of a request is its first
token (TTFT), its last ends it.

Knobs: the batch size is the most sequences in the running batch
(``max_requests_per_batch``); ``precision`` the weights' and activations'
dtype; ``graph`` eager, ``cudagraphs`` (the library captures its decode and
prefill steps as CUDA graphs) or ``compile`` (its torch.compile path, level
1, over those graphs); the window's ``max_batch_tokens`` the tokens one
step holds, and its ``kv_cache``: ``paged`` (continuous batching) or
``static``, the library's ``generate`` over its static KV cache, its decode
compiled unless ``graph=eager`` (runners.hf_static: static batches, the
library's fastest path for few sequences). A
configuration's manager (KV cache, captured graphs) is built on the first
window after prepare() and kept for every later window of it, so a window
never pays for a capture or a compile.

Every query runs to its ``max_new_tokens``: end-of-sequence tokens are off,
so output lengths are the workload's, whatever a random model emits. Prefix
sharing is off too, so each query pays its own prefill, as a benchmark's
distinct prompts would.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from runners.base import (
    DEFAULT_BATCH_TOKENS,
    KV_CACHES,
    LLM_GRAPHS,
    LLM_OPTIONS,
    LLM_WINDOW_OPTIONS,
    PRECISIONS,
    Done,
    FirstToken,
)
from runners.hf_static import StaticGenerate
from runners.llm_spec import LlmSpec
from runners.torch_runner import DTYPES, _parse_device, gpu_uuid
from tuner.errors import UserError

# Tokens of KV cache per page (the library's default), and pages kept spare beyond what the batch needs.
PAGE_SIZE = 256
SPARE_PAGES = 4
READ_TIMEOUT_S = 0.05
SEED = 0


@dataclass(frozen=True)
class LlmSettings:
    """One configuration of the runner: prepare()'s arguments, checked."""

    max_seqs: int
    precision: str
    graph: str


def check_llm_settings(batch_size: int, precision: str, options: dict[str, Any], cuda: bool) -> LlmSettings:
    """Validate prepare()'s arguments; a setting this device cannot run is a one-line error."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"maximum concurrent sequences must be a positive integer, got {batch_size!r}")
    if precision not in PRECISIONS or precision == "int8":
        shown = ", ".join(p for p in PRECISIONS if p != "int8")
        raise UserError(f"precision {precision!r} is not one transformers runs here: use one of {shown}")
    if precision == "fp16" and not cuda:
        raise UserError("fp16 on the CPU is slow or unsupported: use fp32 or bf16 on cpu")
    unknown = sorted(set(options) - set(LLM_OPTIONS))
    if unknown:
        raise UserError(f"unknown LLM runner option(s) {', '.join(unknown)}: known are {', '.join(LLM_OPTIONS)}")
    graph = str(options.get("graph", "eager"))
    if graph not in LLM_GRAPHS:
        raise UserError(f"unknown graph mode {graph!r}: use one of {', '.join(LLM_GRAPHS)}")
    if graph != "eager" and not cuda:
        raise UserError(f"graph={graph} needs a CUDA device (captured or compiled decode): use graph=eager on cpu")
    # channels_last (a device space's knob for CNNs) changes only 2-D convolutions, which an LLM has none of:
    # whatever its value, the LLM runs the same (a study pins it; tune measure may pass the space's default).
    return LlmSettings(batch_size, precision, graph)


def check_kv_cache(options: dict[str, Any]) -> str:
    """The window's ``kv_cache`` (``paged`` unless it says), checked."""
    kv_cache = str(options.get(LLM_WINDOW_OPTIONS[1], KV_CACHES[0]))
    if kv_cache not in KV_CACHES:
        raise UserError(f"unknown kv_cache {kv_cache!r}: use one of {', '.join(KV_CACHES)}")
    return kv_cache


def check_batch_tokens(options: dict[str, Any]) -> int | None:
    """The window's ``max_batch_tokens`` (None: :data:`runners.base.DEFAULT_BATCH_TOKENS`), checked."""
    tokens = options.get(LLM_WINDOW_OPTIONS[0])
    if tokens is None:
        return None
    text = str(tokens).strip()
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"max_batch_tokens must be a positive integer, got {tokens!r}")
    return int(text)


def build_model(spec: LlmSpec, dtype: torch.dtype, device: torch.device) -> Any:
    """The model on ``device`` in ``dtype``: its weights where the spec has them, else random ones (seeded).

    Nothing a model folder holds runs as code (no ``trust_remote_code``): its
    architecture must be one transformers ships.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    if spec.has_weights and spec.path is not None:
        model = AutoModelForCausalLM.from_pretrained(
            spec.path, dtype=dtype, local_files_only=True, trust_remote_code=False
        )
        return model.to(device).eval()
    if spec.source == "zoo":
        config = LlamaConfig(**spec.config)
    else:
        config = AutoConfig.from_pretrained(spec.path, local_files_only=True, trust_remote_code=False)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class HfLlmRunner:
    """One causal LM on the CPU or one CUDA GPU, generating through transformers' continuous batching."""

    generates_tokens = True

    def __init__(self, spec: LlmSpec, device: str = "cpu") -> None:
        try:
            import transformers  # noqa: F401  (the llm extra: checked before any work)
        except ImportError:
            raise UserError("LLM models need transformers: pip install 'powertune[llm]'") from None
        self.spec = spec
        self.name = spec.model
        self._device = _parse_device(device)
        self.device = str(self._device)
        self.gpu_uuid = gpu_uuid(self._device)
        self._model: Any = None
        self._dtype: torch.dtype | None = None
        self._settings: LlmSettings | None = None
        self._batch_tokens: int | None = None
        self._kv_cache = KV_CACHES[0]
        self._manager: Any = None
        self._sized: tuple[int, int] = (0, 0)
        self._longest = (1, 1)
        self._encoded = 0
        self._tokenizer: Any = None
        self._reader: threading.Thread | None = None
        self._reading = threading.Event()
        self._first_seen: set[str] = set()
        self._error = ""
        # The library warns, once per manager, of fast paths this device lacks (flash attention): not the user's to fix.
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)

    @property
    def error(self) -> str:
        """The first failure of the library's loop in this session ("" while none)."""
        static = self._manager.error if isinstance(self._manager, StaticGenerate) else ""
        return self._error or static

    @property
    def vocab_size(self) -> int:
        if self.spec.source == "zoo":
            return int(self.spec.config["vocab_size"])
        return int(self._loaded().config.get_text_config().vocab_size)

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        """Check and keep the configuration; a new precision rebuilds the model, new knobs the manager."""
        settings = check_llm_settings(batch_size, precision, options, self._device.type == "cuda")
        dtype = DTYPES[settings.precision]
        if self._dtype != dtype:
            self._drop_manager()
            if self._model is not None and not self.spec.has_weights:
                # Random weights mean nothing: cast them (milliseconds) rather than draw a new model (seconds).
                self._model = self._model.to(dtype)
            else:
                self._model = None
                self._free()
                self._model = build_model(self.spec, dtype, self._device)
            self._dtype = dtype
        if settings != self._settings:
            self._drop_manager()
            self._settings = settings

    def configure(self, options: dict[str, Any]) -> None:
        """Take the window's ``max_batch_tokens`` and ``kv_cache``; a new value rebuilds the manager at next start."""
        tokens, kv_cache = check_batch_tokens(options), check_kv_cache(options)
        if (tokens, kv_cache) != (self._batch_tokens, self._kv_cache):
            self._drop_manager()
            self._batch_tokens, self._kv_cache = tokens, kv_cache

    def encode(self, sample: Any) -> list[int]:
        """A prompt's token ids: its text through the model's tokenizer (bytes where it has none), or random ids.

        Random ids differ from one prompt to the next (a seeded stream), so no
        two queries share a prefix the cache could reuse.
        """
        vocab = self.vocab_size
        if sample.text is not None:
            tokenizer = self._tokenizer_or_none()
            if tokenizer is not None:
                ids = list(tokenizer(sample.text)["input_ids"])
            else:
                ids = [b % vocab for b in sample.text.encode("utf-8")]
            ids = ids[: max(sample.input_tokens, 1) * 4] or [0]
        else:
            rng = np.random.default_rng([SEED, self._encoded])
            ids = rng.integers(vocab, size=sample.input_tokens).tolist()
        self._encoded += 1
        self._longest = (max(self._longest[0], len(ids)), max(self._longest[1], int(sample.output_tokens)))
        return ids

    def start(self, on_first: FirstToken, on_done: Done) -> None:
        """Open a session: the manager (built for the longest prompt and output encoded so far) and its reader."""
        if self._settings is None:
            raise UserError("prepare() the LLM runner before starting it")
        if self._manager is None or self._longest[0] > self._sized[0] or self._longest[1] > self._sized[1]:
            self._drop_manager()
            self._manager = self._new_manager(self._settings)
        if isinstance(self._manager, StaticGenerate):
            self._error = ""
            self._manager.start(on_first, on_done)
            return
        self._first_seen = set()
        self._error = ""
        self._reading.set()
        self._reader = threading.Thread(
            target=self._read, args=(on_first, on_done), name="powertune-llm-read", daemon=True
        )
        self._reader.start()

    def submit(self, key: int, encoded: list[int], max_new_tokens: int) -> None:
        """Queue one query; the manager admits it into the running batch when a sequence slot frees."""
        if isinstance(self._manager, StaticGenerate):
            self._manager.submit(key, encoded, max_new_tokens)
            return
        self._manager.add_request(
            list(encoded), request_id=str(key), max_new_tokens=int(max_new_tokens), streaming=True, eos_token_id=-1
        )

    def cancel(self, key: int) -> None:
        """Drop one query from the running batch (or the queue): its cache pages go back to the library."""
        if isinstance(self._manager, StaticGenerate):
            self._manager.cancel(key)
        elif self._manager is not None:
            self._manager.cancel_request(str(key))

    def stop(self) -> None:
        """End the session: the reader stops; the manager (cache, graphs) stays for the next window."""
        self._reading.clear()
        if isinstance(self._manager, StaticGenerate):
            self._manager.stop()
        if self._reader is not None:
            self._reader.join()
            self._reader = None

    def close(self) -> None:
        self.stop()
        self._drop_manager()
        self._model = None
        self._free()

    def describe(self) -> dict[str, Any]:
        """What runs, for a trial's record: the library's batching, cache and graph settings."""
        settings = self._settings
        static = self._kv_cache == "static"
        return {
            "llm_runtime": "transformers-generate-static" if static else "transformers-continuous-batching",
            "kv_cache": self._kv_cache,
            "max_seqs": None if settings is None else settings.max_seqs,
            "graph": None if settings is None else settings.graph,
            "max_batch_tokens": self._batch_tokens,
        }

    def _read(self, on_first: FirstToken, on_done: Done) -> None:
        """Hand each request's first streamed token and its completion to the window, until stopped."""
        manager = self._manager
        while self._reading.is_set():
            result = manager.get_result(timeout=READ_TIMEOUT_S)
            if result is None:
                if not manager.is_running() and self._reading.is_set():
                    self._error = self._error or "the continuous batching loop stopped"
                    return
                continue
            key = result.request_id
            if key not in self._first_seen and result.generated_tokens:
                self._first_seen.add(key)
                on_first(int(key))
            if result.is_finished():
                self._first_seen.discard(key)
                if result.error is not None:
                    self._error = self._error or str(result.error).splitlines()[0]
                on_done(int(key), len(result.generated_tokens))

    def _new_manager(self, settings: LlmSettings) -> Any:
        if self._kv_cache == "static":
            self._sized = self._longest
            compiled = settings.graph != "eager"
            return StaticGenerate(self._loaded(), settings.max_seqs, *self._longest, compiled=compiled)
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        prompt, output = self._longest
        per_seq = math.ceil((prompt + output) / PAGE_SIZE) + 1
        # A step must hold one decode token of every running sequence, whatever the chunk.
        tokens = max(self._batch_tokens or DEFAULT_BATCH_TOKENS, settings.max_seqs)
        cuda = self._device.type == "cuda"
        # transformers 5.17 names the tokens of a cache page block_size; later releases page_size.
        fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        page = {"page_size" if "page_size" in fields else "block_size": PAGE_SIZE}
        config = ContinuousBatchingConfig(
            **page,
            num_blocks=settings.max_seqs * per_seq + SPARE_PAGES,
            max_batch_tokens=tokens,
            max_requests_per_batch=settings.max_seqs,
            max_blocks_per_request=per_seq,
            allow_block_sharing=False,
            use_cuda_graph=settings.graph != "eager" and cuda,
            default_compile_level=1 if settings.graph == "compile" else 0,
            seed=SEED,
        )
        generation = GenerationConfig(max_new_tokens=output, do_sample=False, eos_token_id=-1, pad_token_id=0)
        manager = self._loaded().init_continuous_batching(
            generation_config=generation, continuous_batching_config=config
        )
        manager.warmup()
        # The library's generation thread takes its daemon flag from the thread that starts it: started from a
        # daemon thread it never holds the process open at exit (devices are not closed on every path).
        starter = threading.Thread(target=manager.start, name="powertune-llm-start", daemon=True)
        starter.start()
        starter.join()
        self._sized = (prompt, output)
        return manager

    def _drop_manager(self) -> None:
        if isinstance(self._manager, StaticGenerate):
            self._manager.close()
            self._manager = None
            self._sized = (0, 0)
        elif self._manager is not None:
            # A dropped manager's queued requests are nobody's (a cut window's held arrivals): its default stop
            # flushes them first (FLUSH_AND_STOP, up to the timeout), a hard stop fails them at once, where the
            # installed transformers has it.
            hard = {"hard_stop": True} if "hard_stop" in inspect.signature(self._manager.stop).parameters else {}
            self._manager.stop(block=True, timeout=10, **hard)
            self._manager.destroy()
            self._manager = None
            self._sized = (0, 0)

    def _loaded(self) -> Any:
        if self._model is None:
            raise UserError("prepare() the LLM runner before using it")
        return self._model

    def _tokenizer_or_none(self) -> Any:
        if self._tokenizer is None and self.spec.path is not None:
            from transformers import AutoTokenizer

            try:
                self._tokenizer = AutoTokenizer.from_pretrained(
                    self.spec.path, local_files_only=True, trust_remote_code=False
                )
            except (OSError, ValueError):
                self._tokenizer = False
        return self._tokenizer or None

    def _free(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
