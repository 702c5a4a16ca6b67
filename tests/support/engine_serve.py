"""A real OpenAI-compatible engine for the tests: ``transformers serve`` on loopback with a tiny model built here.

The model is a two-layer Llama with random weights and a 300-token byte-level
BPE vocabulary trained on one sentence, saved as a Hugging Face folder, so
nothing is downloaded. The server is transformers' own (``transformers
serve``, FastAPI and uvicorn: ``pip install 'transformers[serving]'``), never
a stand-in for the protocol.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

READY_S = 240.0


def serve_binary() -> Path:
    """The ``transformers`` console script of this interpreter's environment, or the test is skipped."""
    pytest.importorskip("transformers")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    found = Path(sys.executable).parent / "transformers"
    if not found.is_file():
        which = shutil.which("transformers")
        if which is None:
            pytest.skip("no transformers console script beside this Python")
        found = Path(which)
    return found


def build_tiny_model(folder: Path) -> Path:
    """A tiny random Llama with its own tokenizer and chat template, saved to ``folder``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 8, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(binary: Path, folder: Path, port: str = "{port}") -> list[str]:
    return [str(binary), "serve", str(folder), "--host", "127.0.0.1", "--port", port, "--device", "cpu"]


def wait_ready(port: int, process: subprocess.Popen, timeout: float = READY_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("transformers serve did not answer in time")


def start(binary: Path, folder: Path) -> tuple[subprocess.Popen, int]:
    """Start the server on a free loopback port (its own session) and wait until it lists the model."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process = subprocess.Popen(
        serve_command(binary, folder, str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        wait_ready(port, process)
    except BaseException:
        stop(process)
        raise
    return process, port


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, reaped by nobody here, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
