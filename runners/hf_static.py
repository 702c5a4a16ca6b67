"""The LLM runner's ``kv_cache=static`` engine: transformers' ``generate`` over its static KV cache, compiled.

With ``cache_implementation="static"`` the library's ``generate`` keeps the
KV cache in fixed tensors and, on a CUDA device unless ``compiled`` is off
(``graph=eager``), compiles its own decode forward (torch.compile, its
default ``CompileConfig``: inductor, ``reduce-overhead``, i.e. CUDA graphs)
on the first call: the library's
fastest path for few sequences (benchmarks/results/llm-h200.md: TPOT 2.40 ms
at batch 1 on an H200 against 4.81 ms for its continuous batching with
graphs). ``generate`` has no continuous batching, so queued queries run in
static batches: whatever waits when a batch starts, up to the most
sequences, the batch padded to that many rows and every prompt left-padded
to the workload's longest, and every row run for the workload's longest
output, so each batch has the same shapes and the compiled graph is reused
(a new shape would compile again, tens of seconds). A query's first token is
the first step the library streams (``streamer.put``); a query ends at its
own output length, reported then, though its row runs on with the batch.

The batches run on one thread kept for the engine's life: the compiled
graphs are recorded in the thread that first runs them. PyTorch before
2.13 keeps its CUDA-graph trees (``reduce-overhead``) in thread-local state
set up for the importing thread only, and asserts in any other Python
thread (pytorch/pytorch#123177, fixed by #184357, which sets that state up
lazily per thread); :func:`graph_trees_for_this_thread` does the same where
the installed torch does not.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

READ_TIMEOUT_S = 0.05
PAD_ID = 0


def graph_trees_for_this_thread() -> None:
    """Give this thread its own CUDA-graph-tree state where the installed torch would assert instead.

    What #184357's lazy ``_initialize_tls`` does, for a torch without it: a
    tree manager per device for this thread. A torch that has it (2.13), or
    no inductor at all, is left alone.
    """
    try:
        from torch._inductor import cudagraph_trees
    except ImportError:
        return
    local = getattr(cudagraph_trees, "local", None)
    if local is None or hasattr(local, "tree_manager_containers") or hasattr(cudagraph_trees, "_initialize_tls"):
        return
    if torch._C._is_key_in_tls("tree_manager_containers"):
        return
    local.tree_manager_containers = {}
    local.tree_manager_locks = defaultdict(threading.Lock)


@dataclass
class _Row:
    key: int
    ids: list[int]
    new_tokens: int
    first: bool = False
    done: bool = False


@dataclass
class _Session:
    on_first: Callable[[int], None]
    on_done: Callable[[int, int], None]
    open: threading.Event = field(default_factory=threading.Event)


class StaticGenerate:
    """One configuration's static batches: ``max_seqs`` rows, prompts of ``prompt_len``, ``new_tokens`` steps."""

    def __init__(self, model: Any, max_seqs: int, prompt_len: int, new_tokens: int, compiled: bool = True) -> None:
        self.model = model
        self.compiled = compiled
        self.max_seqs = max_seqs
        self.prompt_len = prompt_len
        self.new_tokens = new_tokens
        self.error = ""
        self._queue: queue.Queue[_Row] = queue.Queue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._closed = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._loop, name="powertune-llm-static", daemon=True)
        self._thread.start()

    def start(self, on_first: Callable[[int], None], on_done: Callable[[int, int], None]) -> None:
        session = _Session(on_first, on_done)
        session.open.set()
        with self._lock:
            self._session = session
            self._cancelled = set()

    def submit(self, key: int, ids: list[int], new_tokens: int) -> None:
        self._queue.put(_Row(key, list(ids)[-self.prompt_len :] or [PAD_ID], min(int(new_tokens), self.new_tokens)))

    def cancel(self, key: int) -> None:
        with self._lock:
            self._cancelled.add(key)

    def stop(self) -> None:
        """End the session: queued queries are dropped, the running batch stops at its next step."""
        with self._lock:
            if self._session is not None:
                self._session.open.clear()
            self._session = None
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._idle.wait()

    def close(self) -> None:
        self.stop()
        self._closed.set()
        self._thread.join()

    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._closed.is_set()

    def _loop(self) -> None:
        graph_trees_for_this_thread()
        while not self._closed.is_set():
            try:
                first = self._queue.get(timeout=READ_TIMEOUT_S)
            except queue.Empty:
                continue
            self._idle.clear()
            try:
                rows = [first]
                while len(rows) < self.max_seqs:
                    try:
                        rows.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                with self._lock:
                    session = self._session
                if session is not None and session.open.is_set():
                    self._run(rows, session)
            except Exception as exc:  # the library's failure is the window's error, said once
                self.error = self.error or (str(exc).splitlines() or [type(exc).__name__])[0]
                self._closed.set()
            finally:
                self._idle.set()

    def _run(self, rows: list[_Row], session: _Session) -> None:
        """One static batch through ``generate``; each row's first token and end reported as streamed."""
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        device = self.model.device
        batch = torch.full((self.max_seqs, self.prompt_len), PAD_ID, dtype=torch.long)
        mask = torch.zeros((self.max_seqs, self.prompt_len), dtype=torch.long)
        for i in range(self.max_seqs):
            ids = rows[min(i, len(rows) - 1)].ids  # rows past the queries repeat the last one; nobody reads them
            batch[i, self.prompt_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[i, self.prompt_len - len(ids) :] = 1
        engine = self

        class Stream(BaseStreamer):
            prompt_seen = False
            steps = 0

            def put(self, value: Any) -> None:
                if not self.prompt_seen:  # the first put is the prompt
                    self.prompt_seen = True
                    return
                self.steps += int(value.shape[-1]) if value.dim() > 1 else 1
                for row in rows:
                    if row.done or row.key in engine._cancelled:
                        continue
                    if not row.first:
                        row.first = True
                        session.on_first(row.key)
                    if self.steps >= row.new_tokens:
                        row.done = True
                        session.on_done(row.key, row.new_tokens)

            def end(self) -> None:
                for row in rows:
                    if not row.done and row.key not in engine._cancelled and session.open.is_set():
                        row.done = True
                        session.on_done(row.key, max(self.steps, 1))

        # The two answers the criterion gives, made once: a step launches no kernel of ours to ask it.
        answers = {flag: torch.full((self.max_seqs,), flag, dtype=torch.bool, device=device) for flag in (False, True)}

        class Stop(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                return answers[not session.open.is_set() or all(r.done or r.key in engine._cancelled for r in rows)]

        # min_new_tokens: the model's own end-of-sequence token (its generation config fills an unset one) is
        # masked for the whole batch, so no row ends early and every batch runs the same steps.
        config = GenerationConfig(
            max_new_tokens=self.new_tokens,
            min_new_tokens=self.new_tokens,
            do_sample=False,
            pad_token_id=PAD_ID,
            cache_implementation="static",
            disable_compile=not self.compiled,
        )
        # An unpadded batch (every prompt of the longest length) is given no mask, as generate is called plainly:
        # the library then builds its own causal mask over the static cache.
        padded = {"attention_mask": mask.to(device)} if bool((mask == 0).any()) else {}
        with torch.inference_mode():
            self.model.generate(
                batch.to(device),
                **padded,
                generation_config=config,
                streamer=Stream(),
                stopping_criteria=StoppingCriteriaList([Stop()]),
            )
