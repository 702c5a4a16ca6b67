"""The prompts an LLM window issues: lengths (and text, where given) and how many tokens each asks for.

``--prompts`` takes a built-in length shape (:data:`SHAPES`: MLPerf's OpenOrca
and CNN-DM) or a JSONL file, one prompt a line, either

- ``{"prompt": "text", "max_tokens": 128}`` (``max_tokens`` optional,
  :data:`DEFAULT_MAX_TOKENS`), tokenized by the runner; or
- ``{"input_tokens": 256, "output_tokens": 128}``: a token-length sample,
  for which the runner makes a prompt of that many tokens.

Every generated sequence runs to its ``output_tokens`` (end-of-sequence
tokens are ignored), as MLPerf's reference SUTs fix the output lengths of a
performance run, so a configuration's energy per token is not a matter of
when a random model happens to stop.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.errors import ConfigurationError
from tuner.plumbing.readfile import read_capped

DEFAULT_MAX_TOKENS = 128
MAX_PROMPTS = 100_000
MAX_FILE_BYTES = 64 << 20
MAX_TOKENS = 1 << 17
SHAPE_SAMPLES = 1024
DEFAULT_SHAPE = "openorca"


class PromptSample(BaseModel):
    """One prompt: its length in tokens (or its text, which the runner tokenizes) and the tokens to generate."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = Field(ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(ge=1, le=MAX_TOKENS)
    text: str | None = None


class PromptSet(BaseModel):
    """The prompts of a workload, in the order LoadGen's sample indices name them (index mod length)."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    name: str
    source: str
    samples: list[PromptSample]

    @property
    def mean_output_tokens(self) -> float:
        return sum(s.output_tokens for s in self.samples) / len(self.samples)

    @property
    def mean_input_tokens(self) -> float:
        return sum(s.input_tokens for s in self.samples) / len(self.samples)


class LengthShape(BaseModel):
    """A dataset's token lengths as a log-normal (median, spread) clipped to [min, max], input and output each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    input_median: float
    input_sigma: float
    input_min: int
    input_max: int
    output_median: float
    output_sigma: float
    output_min: int
    output_max: int


# MLPerf Inference's LLM datasets. The caps are the reference implementations' (mlcommons/inference:
# language/llama2-70b/processorca.py keeps 24,576 OpenOrca GPT-4 samples, a quarter from each of cot, flan,
# niv and t0, with inputs and outputs under 1024 tokens and outputs of at least 3; language/gpt-j/backend.py
# truncates CNN-DailyMail articles to 1919 tokens and generates 30 to 128 new tokens). The log-normal medians
# and spreads between the caps are this tool's approximation, not the datasets' own histograms: give the
# real lengths as a JSONL file of input_tokens/output_tokens to measure on them.
SHAPES: dict[str, LengthShape] = {
    "openorca": LengthShape(
        source="MLPerf llama2-70b OpenOrca shape: inputs 4-1023 and outputs 3-1023 tokens (approximated)",
        input_median=230.0,
        input_sigma=0.75,
        input_min=4,
        input_max=1023,
        output_median=240.0,
        output_sigma=0.8,
        output_min=3,
        output_max=1023,
    ),
    "cnndm": LengthShape(
        source="MLPerf gpt-j CNN-DailyMail shape: articles up to 1919 tokens, summaries of 30-128 (approximated)",
        input_median=780.0,
        input_sigma=0.45,
        input_min=64,
        input_max=1919,
        output_median=60.0,
        output_sigma=0.35,
        output_min=30,
        output_max=128,
    ),
}


# Files read once per process for each version (path, modification time, size): every window reads its workload.
_READ: dict[tuple[str, int, int], PromptSet] = {}


def load_prompts(spec: str | None) -> PromptSet:
    """The workload ``spec`` names: a built-in shape (default :data:`DEFAULT_SHAPE`) or a JSONL file.

    A file that is not a regular file, too large, not JSONL of the two forms
    above, or empty is a one-line :class:`ConfigurationError` naming the line.
    """
    name = spec or DEFAULT_SHAPE
    if name in SHAPES:
        return shaped(name)
    path = Path(name)
    if not path.suffix and not path.exists():
        raise ConfigurationError(
            f"--prompts {name}: no such file and no built-in shape; use {', '.join(SHAPES)} or a JSONL file"
        )
    try:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = None
    if key is not None and key in _READ:
        return _READ[key]
    data = read_capped(path, "prompts file", MAX_FILE_BYTES, "keep it under 64 MiB or sample it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError(f"prompts file {path} is not UTF-8 text: give a JSONL file") from None
    samples = [_sample(path, number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not samples:
        raise ConfigurationError(f"prompts file {path} holds no prompt: one JSON object a line")
    if len(samples) > MAX_PROMPTS:
        raise ConfigurationError(f"prompts file {path} holds {len(samples)} prompts: keep at most {MAX_PROMPTS}")
    prompts = PromptSet(name=path.stem, source=str(path), samples=samples)
    if key is not None:
        _READ[key] = prompts
    return prompts


def shaped(name: str, count: int = SHAPE_SAMPLES, seed: int = 0) -> PromptSet:
    """``count`` token-length samples drawn from a built-in shape, the same for every run (seeded)."""
    shape = SHAPES[name]
    rng = random.Random(f"{name}:{seed}")

    def draw(median: float, sigma: float, low: int, high: int) -> int:
        return min(max(round(median * math.exp(rng.gauss(0.0, sigma))), low), high)

    samples = [
        PromptSample(
            input_tokens=draw(shape.input_median, shape.input_sigma, shape.input_min, shape.input_max),
            output_tokens=draw(shape.output_median, shape.output_sigma, shape.output_min, shape.output_max),
        )
        for _ in range(count)
    ]
    return PromptSet(name=name, source=shape.source, samples=samples)


def _sample(path: Path, number: int, line: str) -> PromptSample:
    where = f"prompts file {path} line {number}"
    try:
        entry = json.loads(line, parse_constant=_refuse)
    except (ValueError, RecursionError):
        raise ConfigurationError(f"{where} is not JSON: one JSON object a line") from None
    if not isinstance(entry, dict):
        raise ConfigurationError(f'{where} is not a JSON object: use {{"prompt": ..., "max_tokens": ...}}')
    try:
        if "prompt" in entry:
            unknown = ", ".join(sorted(set(entry) - {"prompt", "max_tokens"}))
            if unknown:
                raise ConfigurationError(f"{where}: unknown key(s) {unknown}: use prompt and max_tokens")
            prompt = entry["prompt"]
            if not isinstance(prompt, str) or not prompt.strip():
                raise ConfigurationError(f"{where}: prompt must be a non-empty string")
            entry = {
                "input_tokens": _length(prompt),
                "output_tokens": entry.get("max_tokens", DEFAULT_MAX_TOKENS),
                "text": prompt,
            }
        return PromptSample.model_validate(entry, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "line"
        raise ConfigurationError(
            f'{where}: {field}: {first["msg"]}; lines are {{"prompt": text, "max_tokens": n}} '
            f'or {{"input_tokens": n, "output_tokens": n}} with 1 <= n <= {MAX_TOKENS}'
        ) from None


def _length(prompt: str) -> int:
    """A text prompt's length before the runner tokenizes it: about four UTF-8 bytes a token, at least one."""
    return min(max(1, len(prompt.encode("utf-8")) // 4), MAX_TOKENS)


def _refuse(constant: str) -> float:
    raise ValueError(f"{constant} is not a number")
