"""The engine's server as a process the tool starts, restarts with new settings, and always stops.

An engine file (``openai://HOST:PORT/v1?engine=FILE#NAME``) holds the command
that starts the server, with placeholders for what is tuned, and the engine
settings that are knobs::

    version: 1
    command: vllm serve meta-llama/Llama-3.2-1B --port {port} --max-num-seqs {max_num_seqs} --dtype {precision}
    knobs:
      max_num_seqs: [8, 16, 32]
    ready_timeout_s: 300

Placeholders: ``{host}``, ``{port}``, ``{model}`` (the name after ``#``),
``{batch_size}`` (the requests in flight), ``{precision}``, ``{graph}``,
``{max_batch_tokens}`` and every knob the file names (its first value is the
default). A knob NAME is the study's knob ``engine:NAME`` (tuner.engine adds
them to the space): each configuration that changes one restarts the
server, which is ready when ``GET /v1/models`` lists the model, within
``ready_timeout_s``.

The server is the tool's to stop, as hardware is the tool's to restore: on
a window's error, when the runner closes, on every signal the tuner turns
into an exception (tuner.plumbing.interrupts), and at interpreter exit. It runs in a
session of its own (a Ctrl-C at the terminal reaches the tool, which stops
it), and is stopped with SIGTERM to its process group, SIGKILL after
``stop_timeout_s``. A tool killed with SIGKILL cannot stop it.
"""

from __future__ import annotations

import atexit
import collections
import os
import shlex
import signal
import string
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuner.errors import ConfigurationError, MeasurementError
from tuner.plumbing import interrupts
from tuner.plumbing.yamlfile import load_yaml_model

if TYPE_CHECKING:
    from runners.openai_engine import EngineClient, EngineTarget

ENGINE_VERSION = 1
# What a command may name besides the file's knobs.
BUILTIN = ("host", "port", "model", "batch_size", "precision", "graph", "max_batch_tokens")
OUTPUT_LINES = 20
POLL_S = 0.25
PROBE_TIMEOUT_S = 2.0

EngineValue = int | float | str


class EngineFile(BaseModel):
    """An engine file: the server's command line, the settings it tunes by restarting, how long it may take."""

    model_config = ConfigDict(extra="forbid")

    version: int = ENGINE_VERSION
    command: str = Field(min_length=1)
    knobs: dict[str, list[EngineValue]] = Field(default_factory=dict)
    ready_timeout_s: float = Field(default=300.0, gt=0, le=3600)
    stop_timeout_s: float = Field(default=15.0, gt=0, le=300)

    @field_validator("knobs")
    @classmethod
    def _knobs_named_and_valued(cls, knobs: dict[str, list[EngineValue]]) -> dict[str, list[EngineValue]]:
        for name, values in knobs.items():
            if not name.isidentifier() or name in BUILTIN:
                raise ValueError(f"knob {name!r} must be a name other than {', '.join(BUILTIN)}")
            if not values or len({str(v) for v in values}) != len(values):
                raise ValueError(f"knob {name!r} needs distinct values")
        return knobs

    def placeholders(self) -> list[str]:
        """The fields the command names, checked against what the tool can fill in."""
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.command) if f is not None]
        except ValueError as exc:
            raise ConfigurationError(
                f"engine command {self.command!r} is not a template ({exc}): name a setting as {{name}}"
            ) from None
        known = (*BUILTIN, *self.knobs)
        unknown = sorted({f for f in fields if f not in known})
        if unknown:
            raise ConfigurationError(
                f"engine command names {', '.join('{' + f + '}' for f in unknown)}, which is neither built in "
                f"({', '.join(BUILTIN)}) nor a knob of the file: add it under knobs, or fix the command"
            )
        return sorted(set(fields))

    def argv(self, values: dict[str, Any]) -> list[str]:
        """The command line for these values (each placeholder filled in, then split as a shell would)."""
        used = self.placeholders()
        missing = [f for f in used if f not in values]
        if missing:
            raise ConfigurationError(f"no value for {', '.join(missing)} in the engine command")
        try:
            argv = shlex.split(self.command.format(**{f: str(values[f]) for f in used}))
        except ValueError as exc:
            raise ConfigurationError(f"engine command {self.command!r} does not split into words ({exc})") from None
        if not argv:
            raise ConfigurationError("the engine command is empty: give the command that starts the server")
        return argv


def load_engine(path: str | Path) -> EngineFile:
    """Read an engine file (it says what the tool runs, so it must pass the trust rule, tuner.plumbing.trust)."""
    engine = load_yaml_model(
        Path(path), EngineFile, "engine file", "see docs/llm-engines.md", version=ENGINE_VERSION, trusted=True
    )
    engine.placeholders()
    return engine


_RUNNING: weakref.WeakSet[EngineServer] = weakref.WeakSet()


def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


atexit.register(_stop_all)


class EngineServer:
    """One engine server process: started with a configuration's values, ready when it lists the model."""

    def __init__(self, engine: EngineFile, target: EngineTarget) -> None:
        self.engine = engine
        self.target = target
        self.command_line = ""
        self._argv: list[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=OUTPUT_LINES)
        self._reader: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def refuse_if_taken(self, client: EngineClient) -> None:
        """Something already answering at the engine's address would be mistaken for the server started here."""
        try:
            client.models(timeout_s=PROBE_TIMEOUT_S)
        except MeasurementError:
            return
        raise ConfigurationError(
            f"something already serves at {self.target.url}, where the engine file's command would start its "
            "server: stop it, or drop engine= from --model to measure that server as it runs"
        )

    def values(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Every placeholder's value: the target's, the configuration's, else the knob's first value."""
        values: dict[str, Any] = {k: v[0] for k, v in self.engine.knobs.items()}
        values.update(host=self.target.host, port=self.target.port, model=self.target.name, graph="eager")
        values.setdefault("max_batch_tokens", 2048)
        values.update({k: v for k, v in settings.items() if v is not None})
        return values

    def ensure(self, settings: dict[str, Any], client: EngineClient) -> None:
        """The server running with these settings: started, or restarted when its command line would differ."""
        argv = self.engine.argv(self.values(settings))
        if self.running and argv == self._argv:
            return
        self.stop()
        try:
            self._start(argv)
            self._wait_ready(client)
        except BaseException:
            self.stop()
            raise

    def _start(self, argv: list[str]) -> None:
        self._output.clear()
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConfigurationError(f"cannot run the engine command {argv[0]!r} ({exc.strerror or exc})") from None
        self._argv = argv
        self.command_line = shlex.join(argv)
        _RUNNING.add(self)
        self._reader = threading.Thread(target=self._drain, name="powertune-engine-output", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        """Keep the server's last lines of output (for an error message); its pipe must never fill."""
        process = self._process
        if process is None or process.stdout is None:
            return
        for line in process.stdout:
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                self._output.append(text)

    def last_output(self) -> str:
        return self._output[-1][:200] if self._output else "no output"

    def _wait_ready(self, client: EngineClient) -> None:
        deadline = time.monotonic() + self.engine.ready_timeout_s
        while True:
            interrupts.check()
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise MeasurementError(
                    f"the engine command exited ({code}) before it served {self.target.url}: {self.last_output()}"
                )
            try:
                client.check()
                return
            except ConfigurationError:
                raise
            except MeasurementError:
                if time.monotonic() >= deadline:
                    raise MeasurementError(
                        f"the engine did not answer {self.target.url}/models within {self.engine.ready_timeout_s:g} s "
                        f"({self.last_output()}): raise ready_timeout_s in the engine file, or fix its command"
                    ) from None
            time.sleep(POLL_S)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``stop_timeout_s``; idempotent."""
        process, self._process = self._process, None
        _RUNNING.discard(self)
        self._argv = None
        if process is None:
            return
        with interrupts.restoring():
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=self.engine.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    _signal_group(process.pid, signal.SIGKILL)
                    process.wait()
            # Its children too: a launcher (a shell, a Python entry point) may leave workers behind.
            _signal_group(process.pid, signal.SIGKILL)
            if self._reader is not None:
                self._reader.join(timeout=self.engine.stop_timeout_s)
                self._reader = None
            if process.stdout is not None:
                process.stdout.close()


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
