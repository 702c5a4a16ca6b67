"""An LLM study's export carries its engine settings and renders them as vLLM's and llama.cpp's flags."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from tuner.deploy import EngineSettings, ExportedConfig, Provenance, engine_settings, load_export
from tuner.deploy.formats import ALL_LIMITS, export_paths, render, write_exports
from tuner.errors import UserError

KNOBS = {"sm_mhz": 1410, "mem_mhz": 3201, "power_limit_w": 400, "precision": "bf16", "graph": "eager"}
METRICS = {"j_per_query": 1.2, "p50_ms": 900.0, "p90_ms": 950.0, "p99_ms": 990.0, "qps": 10.0, "avg_w": 300.0}
METRICS.update(meter="nvml-energy", windows=1, verdict="measured", j_per_token=0.0093, tpot_p99_ms=12.5)


def exported(model: str = "hf:meta-llama/Llama-3.2-1B", knobs: dict | None = None, **extra) -> ExportedConfig:
    knobs = dict(KNOBS if knobs is None else knobs)
    return ExportedConfig(
        device_kind="h200",
        device="cuda:0",
        twin=False,
        model=model,
        batch_size=16,
        knobs=knobs,
        max_latency_ms=2000.0,
        percentile="p99",
        metrics=METRICS,
        provenance=Provenance(study="s", storage="sqlite:///x", trial=7, exported_at="2026-12-04T00:00:00+00:00"),
        engine=engine_settings(model, 16, knobs),
        **extra,
    )


def command(script: str) -> list[str]:
    line = next(line for line in script.splitlines() if line.startswith("exec "))
    return shlex.split(line)[1:]


def test_vllm_gets_the_studys_sequences_dtype_and_graph_mode_beside_the_device_mode():
    script = render(exported(knobs={**KNOBS, "max_batch_tokens": 2048}), "vllm")
    argv = command(script)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.2-1B"]
    flags = " ".join(argv)
    assert "--max-num-seqs 16" in flags and "--dtype bfloat16" in flags and "--enforce-eager" in flags
    assert "--max-num-batched-tokens 2048" in flags
    assert ALL_LIMITS["vllm"] in script
    device = next(line for line in script.splitlines() if "sm_mhz=" in line)
    assert "sm_mhz=1410" in device and "power_limit_w=400" in device and "precision" not in device
    assert "tune apply" in script and "measured j_per_token = 0.0093" in script
    graphs = command(render(exported(knobs={**KNOBS, "graph": "cudagraphs"}), "vllm"))
    assert "--enforce-eager" not in graphs


def test_llama_cpp_gets_slots_every_layer_on_the_gpu_and_the_cache_type():
    script = render(exported(knobs={**KNOBS, "max_batch_tokens": 512}), "llamacpp")
    argv = command(script)
    assert argv[0] == "llama-server" and argv[argv.index("-m") + 1] == "meta-llama/Llama-3.2-1B.gguf"
    flags = " ".join(argv)
    assert "--parallel 16" in flags and "-ngl all" in flags and "--cont-batching" in flags
    assert "--batch-size 512" in flags and "--cache-type-k bf16 --cache-type-v bf16" in flags
    assert "--ctx-size" in script and ALL_LIMITS["llamacpp"] in script


def test_an_engine_studys_export_names_its_server_port_and_the_engine_files_own_knobs(tmp_path):
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        json.dumps({"version": 1, "command": "vllm serve M --port {port} --kv {kv}", "knobs": {"kv": ["auto", "fp8"]}})
    )
    model = f"openai://127.0.0.1:8123/v1?engine={engine}#meta-llama/Llama-3.2-1B"
    export = exported(model, {**KNOBS, "engine:kv": "fp8"})
    ran = "vllm serve M --port 8123 --kv fp8"
    # The command names neither {precision} nor {graph}: the server ran its own, and the export says none.
    assert export.engine == EngineSettings(max_seqs=16, settings={"kv": "fp8"}, command=ran)
    script = render(export, "vllm")
    assert command(script)[:5] == ["vllm", "serve", "meta-llama/Llama-3.2-1B", "--port", "8123"]
    assert "--dtype" not in script and "--enforce-eager" not in script
    assert "kv=fp8" in script and f"the study's command line: {ran}" in script
    assert "kv" not in next(line for line in script.splitlines() if "sm_mhz=" in line)


def test_the_formats_are_written_beside_the_yaml_export_which_keeps_the_engine_settings(tmp_path):
    export = exported()
    paths = write_exports(export, tmp_path / "best.yaml", ["yaml", "vllm", "llamacpp"])
    assert paths["vllm"].name == "best.vllm.sh" and paths["llamacpp"].name == "best.llamacpp.sh"
    back = load_export(paths["yaml"], sealed=True)
    assert back.engine == export.engine and back.engine.max_seqs == 16
    assert export_paths(tmp_path / "serve.sh", ["vllm"]) == {"vllm": tmp_path / "serve.sh"}


def test_a_model_study_has_no_engine_and_its_digest_is_as_before():
    export = exported("resnet50", {"sm_mhz": 1410})
    assert export.engine is None
    # Fields added since (unset here) were not in the file then either.
    body = export.model_dump(mode="json", exclude={"digest", "engine", "saved", "max_ttft_ms", "max_tpot_ms"})
    before = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert export.content_digest() == before
    with pytest.raises(UserError, match="not an LLM study") as caught:
        render(export, "vllm")
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match=r"choose from .*vllm, llamacpp"):
        export_paths(Path("x.yaml"), ["sglang"])


def test_a_random_weight_model_leaves_the_model_to_fill_in():
    script = render(exported("llama3.2-1b-random"), "vllm")
    assert command(script)[2] == "MODEL" and "random weights" in script


def test_tune_export_renders_a_twin_llm_study_for_both_engines(tmp_path):
    from clirun import in_process

    out = tmp_path / "studies"
    study = ("-m", "llama3.2-1b-random", "-d", "sim:h200", "--max-ttft", "500ms", "--max-tpot", "30ms")
    code, _, err = in_process("run", *study, "--trials", "6", "--seed", "1", "--out", str(out))
    assert code == 0, err
    target = tmp_path / "best.yaml"
    code, _, err = in_process("export", *study[:4], "--out", str(out), "-o", str(target), "-f", "yaml,vllm,llamacpp")
    assert code == 0, err
    back = load_export(target, sealed=True)
    assert back.twin and back.engine is not None and back.engine.max_seqs == back.batch_size
    vllm_argv = command((tmp_path / "best.vllm.sh").read_text())
    assert vllm_argv[vllm_argv.index("--max-num-seqs") + 1] == str(back.batch_size)
    llama = (tmp_path / "best.llamacpp.sh").read_text()
    assert f"--parallel {back.batch_size}" in llama and "simulated j_per_token" in llama
