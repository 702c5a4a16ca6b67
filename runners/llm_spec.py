"""Causal language models a user may pass to --model, told apart from CNN models without importing torch.

Three forms name an LLM:

- a built-in name (:data:`LLM_ZOO`): a Llama-shaped configuration with random
  weights, made here with no download (``tiny-llm`` for tests on a CPU,
  ``llama3.2-1b-random`` with Llama-3.2-1B's shape for planning on a GPU);
- ``hf:ORG/NAME``: a Hugging Face model id, read from the local Hugging Face
  cache only (this tool never downloads at run time);
- ``hf:PATH`` or a folder holding ``config.json``: a local model folder.

A folder or id without weight files (``*.safetensors``, ``*.bin``) runs with
random weights made from its ``config.json``: energy and latency follow the
model's shape (layers, widths, vocabulary), not its weights, so such a run is
fit for planning, and :func:`weights_note` says so in a note.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tuner.errors import ConfigurationError

HF_PREFIX = "hf:"
# A model served by an engine behind an OpenAI-compatible API (runners for it: the engine client).
ENGINE_PREFIX = "openai://"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")

# Llama-shaped configurations (transformers.LlamaConfig keyword arguments).
LLM_ZOO: dict[str, dict[str, Any]] = {
    "tiny-llm": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
    # Llama-3.2-1B's published shape (1.24 B parameters, tied embeddings), with random weights.
    "llama3.2-1b-random": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
}


@dataclass(frozen=True)
class LlmSpec:
    """One causal LM as named on the command line.

    ``source``: ``zoo`` (``config`` holds the LlamaConfig arguments), ``folder``
    (``path`` is the model folder) or ``hub`` (``hub_id``, read from the local
    cache). ``has_weights`` is False when the model runs with random weights.
    """

    model: str
    source: Literal["zoo", "folder", "hub"]
    slug: str
    has_weights: bool
    path: Path | None = None
    hub_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


def is_llm(model: str) -> bool:
    """True for a built-in LLM name, an ``hf:`` or ``openai://`` model, or a folder holding a ``config.json``."""
    if model in LLM_ZOO or model.startswith((HF_PREFIX, ENGINE_PREFIX)):
        return True
    path = Path(model)
    return path.is_dir() and (path / "config.json").is_file()


def parse_llm(model: str) -> LlmSpec:
    """The :class:`LlmSpec` of ``model``; a name that is no usable LLM is a one-line error naming the fix."""
    if model in LLM_ZOO:
        return LlmSpec(model, "zoo", model, has_weights=False, config=dict(LLM_ZOO[model]))
    target = model.removeprefix(HF_PREFIX)
    if not target:
        raise ConfigurationError("--model hf: needs a model: hf:ORG/NAME (from the local cache) or hf:PATH")
    path = Path(target).expanduser()
    if path.is_dir() or target.startswith((".", "/", "~")) or not _HUB_ID.match(target):
        return _folder(model, path)
    return _hub(model, target)


def slug_of(model: str) -> str:
    """The folder name of an LLM's results: its spec's slug, or the name made safe if it names nothing usable."""
    try:
        return parse_llm(model).slug
    except ConfigurationError:
        return _slug(model.removeprefix(HF_PREFIX).replace("/", "--"))


def weights_note(spec: LlmSpec) -> str | None:
    """The note a run with random weights prints (None when the model has its weights)."""
    if spec.has_weights:
        return None
    return (
        f"{spec.model} runs with random weights made from its configuration: energy and latency follow its shape, "
        "not its outputs (fit for planning; give a folder with its weights to run the real model)"
    )


def _folder(model: str, path: Path) -> LlmSpec:
    if not path.is_dir():
        raise ConfigurationError(f"model folder {path} not found: give a folder holding config.json, or hf:ORG/NAME")
    if not (path / "config.json").is_file():
        raise ConfigurationError(f"{path} holds no config.json: give a Hugging Face model folder")
    weights = any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file())
    return LlmSpec(model, "folder", _slug(path.resolve().name), has_weights=weights, path=path)


def _hub(model: str, hub_id: str) -> LlmSpec:
    """A hub id found in the local Hugging Face cache (``HF_HUB_CACHE`` or ``HF_HOME``/hub)."""
    root = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    repo = root.expanduser() / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    snapshots = sorted(p for p in repo.iterdir() if (p / "config.json").is_file()) if repo.is_dir() else []
    if not snapshots:
        raise ConfigurationError(
            f"{hub_id} is not in the local Hugging Face cache ({root}): download it first "
            f"(huggingface-cli download {hub_id} config.json) or give its folder"
        )
    folder = snapshots[-1]
    weights = any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir())
    return LlmSpec(model, "hub", _slug(hub_id.replace("/", "--")), has_weights=weights, path=folder, hub_id=hub_id)


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "llm"
