"""The engine a user deploys: an OpenAI-compatible server driven with streaming requests.

``--model openai://HOST:PORT/v1#NAME`` names a server (vLLM, llama.cpp's
server, TensorRT-LLM's trtllm-serve, ``transformers serve``) and the model it
serves. Each query is one streaming request (``/v1/completions``, or
``/v1/chat/completions`` with ``?api=chat``) read as server-sent events: its
first streamed token is its first token (LoadGen's FirstTokenComplete), the
end of the stream its completion. The standard library's http.client is the
whole client.

Options ride in the URL's query: ``api=chat``; ``ignore_eos=true`` asks the
server to run every answer to its ``max_tokens`` (vLLM's and llama.cpp's
extension; strict servers such as ``transformers serve`` refuse unknown
fields, so it is off by default and the tokens a server did stream are what
is counted); ``engine=FILE`` names an engine file (runners.engine_server):
the command that starts the server, and the engine settings that are knobs,
set by restarting it.

A server that cannot be reached, answers something other than an
OpenAI-compatible API, or does not serve NAME is a one-line error when the
runner is made, before any window.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runners.base import Done, FirstToken
from runners.llm_spec import ENGINE_PREFIX
from tuner.errors import ConfigurationError, MeasurementError

APIS = ("completions", "chat")
# Seconds to connect, and the longest silence between two streamed events, before a request is given up.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0
# The most requests in flight at once whatever the batch size: each is a thread and a connection.
MAX_CONCURRENCY = 1024
# A token-length prompt without text: this word once per token (one token in common BPE vocabularies, an
# approximation: the server's own count of prompt tokens is not known to the window).
FILLER = " the"
MAX_ERROR_CHARS = 200
# An engine file's knob NAME is the study's knob ``engine:NAME``, a serving knob (a window option).
ENGINE_KNOB_PREFIX = "engine:"


@dataclass(frozen=True)
class EngineTarget:
    """Where the server is and what to ask it: from ``openai://HOST:PORT/PATH?OPTIONS#NAME``."""

    host: str
    port: int
    base: str
    name: str
    api: str = "completions"
    ignore_eos: bool = False
    engine: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.base}"

    @property
    def path(self) -> str:
        return f"{self.base}/chat/completions" if self.api == "chat" else f"{self.base}/completions"


def parse_target(model: str) -> EngineTarget:
    """The server a ``openai://`` model names; a malformed one is a one-line configuration error."""
    example = "e.g. openai://127.0.0.1:8000/v1#meta-llama/Llama-3.2-1B"
    if not model.startswith(ENGINE_PREFIX):
        raise ConfigurationError(f"{model!r} is not an engine URL: {example}")
    parts = urllib.parse.urlsplit("http://" + model[len(ENGINE_PREFIX) :])
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or not parts.fragment:
        raise ConfigurationError(f"{model!r} needs a host, a port and #MODEL_NAME: {example}")
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - {"api", "ignore_eos", "engine"})
    if unknown:
        shown = ", ".join(unknown)
        raise ConfigurationError(f"unknown engine option(s) {shown} in {model!r}: use api, ignore_eos or engine")
    api = options.get("api", "completions")
    if api not in APIS:
        raise ConfigurationError(f"engine option api={api!r}: use api=completions or api=chat")
    eos = options.get("ignore_eos", "false").lower()
    if eos not in ("true", "false", "1", "0"):
        raise ConfigurationError(f"engine option ignore_eos={eos!r}: use true or false")
    return EngineTarget(
        host=parts.hostname,
        port=port,
        base=parts.path.rstrip("/") or "/v1",
        name=urllib.parse.unquote(parts.fragment),
        api=api,
        ignore_eos=eos in ("true", "1"),
        engine=options.get("engine") or None,
    )


def engine_slug(model: str) -> str:
    """The folder of an engine study's results: its host, port and model name, made safe for a path."""
    target = parse_target(model)
    return re.sub(r"[^\w.-]+", "_", f"engine-{target.host}-{target.port}-{target.name}").strip("_")


@dataclass
class Streamed:
    """One streamed answer on the monotonic clock: sent, first token, end; the tokens the server counted."""

    sent: float
    first: float | None
    done: float
    tokens: int


class EngineClient:
    """Requests to one server: its model list, and one streaming generation at a time per call."""

    def __init__(self, target: EngineTarget, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.target = target
        self.read_timeout_s = read_timeout_s

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.target.host, self.target.port, timeout=timeout_s)

    def _unreachable(self, exc: BaseException) -> MeasurementError:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return MeasurementError(
            f"cannot reach the engine at {self.target.url} ({reason}): start the server there, or fix --model"
        )

    def models(self, timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
        """The model ids ``GET /v1/models`` lists; anything but an OpenAI-style list is an error."""
        conn = self._connection(timeout_s)
        try:
            conn.request("GET", f"{self.target.base}/models", headers={"Accept": "application/json"})
            response = conn.getresponse()
            body = response.read(1 << 20)
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None
        finally:
            conn.close()
        if response.status != 200:
            raise self._not_openai(f"GET {self.target.base}/models answered HTTP {response.status}")
        try:
            listed = json.loads(body)["data"]
            return [str(entry["id"]) for entry in listed]
        except (ValueError, KeyError, TypeError):
            raise self._not_openai(f"GET {self.target.base}/models answered no model list") from None

    def _not_openai(self, what: str) -> MeasurementError:
        return MeasurementError(
            f"{self.target.url} is not an OpenAI-compatible server ({what}): point --model at the engine's /v1 API"
        )

    def check(self) -> None:
        """The server answers and serves the model asked for, or a one-line error naming what it serves."""
        served = self.models()
        if self.target.name not in served:
            shown = ", ".join(served[:5]) + (" ..." if len(served) > 5 else "") if served else "none"
            raise ConfigurationError(
                f"the engine at {self.target.url} does not serve {self.target.name!r} (it serves {shown}): "
                "name one of those after '#'"
            )

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.target.name,
            "max_tokens": int(max_tokens),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.target.api == "chat":
            request["messages"] = [{"role": "user", "content": prompt}]
        else:
            request["prompt"] = prompt
        if self.target.ignore_eos:
            request["ignore_eos"] = True
        return request

    def stream(
        self, prompt: str, max_tokens: int, on_first: Any = None, cancelled: Any = None, opened: Any = None
    ) -> Streamed:
        """One streaming generation; ``on_first()`` is called at its first token, as soon as it is read.

        ``cancelled()`` is asked between events: a true answer ends the request early. ``opened(conn)``
        gets the connection before the request is sent (and ``opened(None)`` after it is closed), so a
        caller can shut it down from another thread.
        """
        conn = self._connection(CONNECT_TIMEOUT_S)
        if opened is not None:
            opened(conn)
        payload = json.dumps(self.body(prompt, max_tokens)).encode()
        sent = time.monotonic()
        first: float | None = None
        chunks, usage = 0, None
        try:
            conn.request("POST", self.target.path, body=payload, headers=_JSON_STREAM)
            if conn.sock is not None:
                conn.sock.settimeout(self.read_timeout_s)
            response = conn.getresponse()
            if response.status != 200:
                raise MeasurementError(
                    f"the engine at {self.target.url} refused a request: HTTP {response.status} "
                    f"{_detail(response.read(4096))}"
                )
            for event in _events(response, self._not_openai):
                if cancelled is not None and cancelled():
                    break
                usage = event.get("usage") or usage
                if _has_token(event, self.target.api):
                    chunks += 1
                    if first is None:
                        first = time.monotonic()
                        if on_first is not None:
                            on_first()
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None
        finally:
            conn.close()
            if opened is not None:
                opened(None)
        counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = int(counted) if isinstance(counted, int) and counted >= 0 else chunks
        return Streamed(sent, first, time.monotonic(), tokens)


_JSON_STREAM = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def _detail(body: bytes) -> str:
    """The server's own error message, shortened to one line."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
        found = parsed.get("detail") or parsed.get("error") or parsed if isinstance(parsed, dict) else parsed
        if isinstance(found, dict):
            found = found.get("message", found)
        text = str(found)
    except ValueError:
        pass
    return " ".join(text.split())[:MAX_ERROR_CHARS]


def _events(response: http.client.HTTPResponse, not_openai: Any) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, up to ``[DONE]`` or its end."""
    seen = False
    while True:
        line = response.readline(1 << 20)
        if not line:
            return
        text = line.decode("utf-8", errors="replace").strip()
        if not text or text.startswith(":") or text.startswith(("event:", "id:", "retry:")):
            continue
        if not text.startswith("data:"):
            raise not_openai(f"a streamed answer held {text[:40]!r}, not server-sent events")
        data = text[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise not_openai(f"a streamed event was not JSON: {data[:40]!r}") from None
        if not isinstance(event, dict) or ("choices" not in event and "usage" not in event and not seen):
            raise not_openai(f"a streamed event had no choices: {data[:40]!r}")
        seen = True
        if "error" in event:
            raise MeasurementError(f"the engine failed a request: {_detail(data.encode())}")
        yield event


def _has_token(event: dict[str, Any], api: str) -> bool:
    """True for an event carrying generated text (not the role-only opening or the closing finish event)."""
    for choice in event.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
        if isinstance(piece, str) and (piece or not choice.get("finish_reason")):
            return True
    return False


class EngineRunner:
    """The token-runner protocol (runners.base.TokenRunner) over an OpenAI-compatible server.

    ``batch_size`` is the most requests in flight at once (the client's
    concurrency; the server batches what it receives). ``submit`` queues a
    query; worker threads send it and report its first token and its end.
    With an engine file, ``configure`` (the window's options: the
    ``engine:NAME`` knobs, ``max_batch_tokens``) (re)starts the server with
    the prepared settings whenever its command line would change
    (runners.engine_server), ``start`` starts it if nothing did, and
    ``close`` stops it.
    """

    generates_tokens = True

    def __init__(self, model: str, device: str = "engine") -> None:
        from runners.engine_server import EngineServer, load_engine

        self.name = model
        self.device = device
        self.target = parse_target(model)
        self.client = EngineClient(self.target)
        self.engine = load_engine(self.target.engine) if self.target.engine else None
        self.server = EngineServer(self.engine, self.target) if self.engine is not None else None
        if self.server is None:
            self.client.check()
        else:
            self.server.refuse_if_taken(self.client)
        self.concurrency = 1
        self._settings: dict[str, Any] = {}
        self._engine_values: dict[str, Any] = {}
        self.error = ""
        self._queue: queue.Queue[tuple[int, str, int] | None] = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._running = threading.Event()
        self._open: dict[int, http.client.HTTPConnection] = {}
        self._keys: dict[int, int] = {}
        self._cancelled: set[int] = set()
        self._open_lock = threading.Lock()

    def prepare(self, batch_size: int, precision: str, options: dict[str, Any]) -> None:
        """The concurrency, and the server's settings: restarted with them when they differ from its own."""
        if not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_CONCURRENCY:
            raise ConfigurationError(
                f"batch size (requests in flight) must be 1 to {MAX_CONCURRENCY}, got {batch_size!r}"
            )
        self.concurrency = batch_size
        self._settings = {**options, "precision": precision, "batch_size": batch_size}

    def configure(self, options: dict[str, Any]) -> None:
        """The window's options: the engine's own knobs (``engine:NAME``) and the tokens per step; the server
        is (re)started with them and the prepared settings."""
        own = {k[len(ENGINE_KNOB_PREFIX) :]: v for k, v in options.items() if k.startswith(ENGINE_KNOB_PREFIX)}
        if "max_batch_tokens" in options:
            own["max_batch_tokens"] = options["max_batch_tokens"]
        self._engine_values = own
        self._ensure()

    def _ensure(self) -> None:
        if self.server is not None:
            self.server.ensure({**self._settings, **self._engine_values}, self.client)

    def encode(self, sample: Any) -> str:
        """The prompt's text, or for a token-length sample a text of about that many tokens."""
        return sample.text if sample.text is not None else FILLER * int(sample.input_tokens)

    def start(self, on_first: FirstToken, on_done: Done) -> None:
        self.stop()
        self._cancelled = set()
        if self.server is not None and not self.server.running:
            self._ensure()
        self.error = ""
        self._running.set()
        self._queue = queue.Queue()
        self._workers = [
            threading.Thread(target=self._work, args=(on_first, on_done), name=f"powertune-engine-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, key: int, encoded: str, max_new_tokens: int) -> None:
        self._queue.put((key, encoded, max_new_tokens))

    def cancel(self, key: int) -> None:
        """Drop one query: not sent if it is still queued, its connection shut if it is in flight; no answer."""
        with self._open_lock:
            self._cancelled.add(key)
            for ident, running in self._keys.items():
                conn = self._open.get(ident)
                if running == key and conn is not None and conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # already closed by its worker

    def stop(self) -> None:
        """End the session: queued queries are dropped, requests in flight are cut (their connections shut)."""
        self._running.clear()
        for _ in self._workers:
            self._queue.put(None)
        with self._open_lock:
            for conn in self._open.values():
                if conn.sock is not None:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # already closed by its worker
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for worker in self._workers:
            worker.join(timeout=max(0.1, deadline - time.monotonic()))
        self._workers = []

    def close(self) -> None:
        self.stop()
        if self.server is not None:
            self.server.stop()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"llm_runtime": "openai-engine", "engine_url": self.target.url}
        described["api"] = self.target.api
        if self.server is not None:
            described["engine_command"] = self.server.command_line
        return described

    def _work(self, on_first: FirstToken, on_done: Done) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, prompt, max_tokens = item
            with self._open_lock:
                if not self._running.is_set() or key in self._cancelled:
                    continue
                self._keys[threading.get_ident()] = key
            try:
                streamed = self.client.stream(
                    prompt,
                    max_tokens,
                    on_first=lambda key=key: on_first(key),
                    cancelled=lambda key=key: self._cut(key),
                    opened=self._opened,
                )
            except MeasurementError as exc:
                if self._answers(key):
                    self.error = self.error or str(exc)
                    on_done(key, 0)
                continue
            if self._answers(key):  # a request cut by stop() or cancel() is not an answer
                on_done(key, streamed.tokens)

    def _answers(self, key: int) -> bool:
        with self._open_lock:
            self._keys.pop(threading.get_ident(), None)
            return self._running.is_set() and key not in self._cancelled

    def _opened(self, conn: http.client.HTTPConnection | None) -> None:
        with self._open_lock:
            if conn is None:
                self._open.pop(threading.get_ident(), None)
            else:
                self._open[threading.get_ident()] = conn

    def _cut(self, key: int) -> bool:
        return not self._running.is_set() or key in self._cancelled
