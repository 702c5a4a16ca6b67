"""Issue 50's LLM targets on one H200, observe-only (no clock, power or mode is ever set).

A Llama-3.2-1B-shaped model (``llama3.2-1b-random``: hidden 2048, 16 layers,
32 heads, 8 KV heads, intermediate 8192, vocabulary 128256, random bf16
weights), 256-token prompts, 128 new tokens:

1. ``generate-eager``: Hugging Face ``generate`` at batch 1, eager (the
   issue's reference: TPOT 10.3 ms, 1.65 J per output token);
2. ``cb-graphs``: ``tune measure`` SingleStream at one sequence with the
   library's CUDA-graph decode (``graph=cudagraphs``);
3. ``study``: ``tune run`` in Server under TTFT p99 <= 500 ms and TPOT p99
   <= 30 ms over the default H200 space (precision, graph, max_batch_tokens,
   batch sizes 1-512; clocks as they are), the product path end to end, with
   a 120 s timeout (the target: a default study ending within 3 min); a
   study still running at its cap is stopped with SIGTERM and its completed
   trials read back from the files it writes;
4. ``generate-static``: ``generate`` at batch 1 over the library's static
   cache with its own compiled forward (``cache_implementation="static"``),
   with the time left.

Energy is NVML's total-energy counter of the GPU (read only). Each section
runs in a subprocess of this script (its GPU memory freed after), under a
time cap, so the whole run ends within ``--budget`` seconds (default 350).

    python3 benchmarks/llm_h200.py OUT [--budget 350] [--target-qps 40]

writes OUT/llm_h200.json (every section's figures) and OUT/llm_h200.md;
``bash benchmarks/h200_llm.sh`` runs it on a lent H200 and brings those back
with the study's trials.csv and fronts.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "llama3.2-1b-random"
PROMPT_TOKENS = 256
NEW_TOKENS = 128
REFERENCE = {"tpot_ms": 10.3, "j_per_token": 1.65}  # the H200 figures, HF generate eager, batch 1
TTFT_BOUND = "500ms"
TPOT_BOUND = "30ms"
STUDY_TIMEOUT_S = 120
SECTIONS = ("generate-eager", "cb-graphs", "study", "generate-static")
CAPS_S = {"generate-eager": 60, "cb-graphs": 80, "study": STUDY_TIMEOUT_S + 80, "generate-static": 120}
# After its --timeout a study finishes the trial it runs and measures its baseline; past the cap it is sent
# SIGTERM, on which it restores the card and writes the completed trials' results (read back from its files).
TERM_GRACE_S = 30


def nvml_energy_j() -> float:
    """The GPU's total energy counter, joules (nvmlDeviceGetTotalEnergyConsumption reads millijoules)."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def generate(static: bool, runs: int = 5) -> dict[str, Any]:
    """HF ``generate`` at batch 1: TTFT from one-token calls, TPOT from the rest, J per output token from NVML."""
    import torch

    from runners.hf_llm_runner import build_model
    from runners.llm_spec import parse_llm

    device = torch.device("cuda:0")
    model = build_model(parse_llm(MODEL), torch.bfloat16, device)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT_TOKENS), device=device)
    kwargs: dict[str, Any] = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    if static:
        kwargs["cache_implementation"] = "static"  # generate then compiles its own forward over the static cache

    def timed(new: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
        torch.cuda.synchronize()
        assert out.shape[1] == PROMPT_TOKENS + new
        return time.perf_counter() - start

    warm_start = time.perf_counter()
    for _ in range(2 if static else 1):
        timed(NEW_TOKENS)
        timed(1)
    warm_s = time.perf_counter() - warm_start
    ttft = sorted(timed(1) for _ in range(runs))
    joules = nvml_energy_j()
    start = time.perf_counter()
    totals = [timed(NEW_TOKENS) for _ in range(runs)]
    seconds = time.perf_counter() - start
    joules = nvml_energy_j() - joules
    ttft_s = ttft[len(ttft) // 2]
    total_s = sorted(totals)[len(totals) // 2]
    return {
        "what": f"HF generate, batch 1, {'static cache + the library compiled forward' if static else 'eager'}",
        "warmup_s": round(warm_s, 2),
        "ttft_ms": ttft_s * 1e3,
        "tpot_ms": (total_s - ttft_s) / (NEW_TOKENS - 1) * 1e3,
        "j_per_token": joules / (runs * NEW_TOKENS),
        "avg_w": joules / seconds,
        "tokens_per_s": runs * NEW_TOKENS / seconds,
        "runs": runs,
    }


def tune(args: list[str], cap_s: float) -> dict[str, Any]:
    """``python -m tuner ARGS --json``: its JSON, or why there is none."""
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", *args, "--json"], capture_output=True, text=True, timeout=cap_s, cwd=REPO
    )
    if proc.returncode not in (0, 3):
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"], "rc": proc.returncode}
    return {"rc": proc.returncode, **json.loads(proc.stdout), "stderr_tail": proc.stderr.strip().splitlines()[-6:]}


def cb_single(prompts: Path) -> dict[str, Any]:
    """``tune measure`` SingleStream, one sequence, transformers' continuous batching with its CUDA graphs."""
    started = time.monotonic()
    args = ["measure", "--model", MODEL, "--device", "cuda:0", "--scenario", "singlestream", "--batch-size", "1"]
    args += ["--set", "precision=bf16", "--set", "graph=cudagraphs", "--prompts", str(prompts), "--window", "5"]
    payload = tune(args, CAPS_S["cb-graphs"] - 5)
    payload["wall_s"] = round(time.monotonic() - started, 1)
    measurements = payload.get("measurements") or []
    if measurements and measurements[0].get("tokens"):
        m = measurements[0]
        payload["figures"] = {**m["tokens"], "avg_w": m["avg_w"], "valid": m["valid"], "reason": m["reason"]}
    return payload


def study(out: Path, prompts: Path, target_qps: float) -> dict[str, Any]:
    """``tune run`` Server under the issue's token bounds, timed from the command's start to its answer."""
    started = time.monotonic()
    args = ["run", "--model", MODEL, "--device", "cuda:0", "--scenario", "server", "--target-qps", f"{target_qps:g}"]
    args += ["--max-ttft", TTFT_BOUND, "--max-tpot", TPOT_BOUND, "--prompts", str(prompts)]
    args += ["--trials", "12", "--timeout", str(STUDY_TIMEOUT_S), "--seed", "0"]
    args += ["--out", str(out / "studies")]
    cmd = [sys.executable, "-m", "tuner", *args, "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    stopped = False
    try:
        stdout, stderr = proc.communicate(timeout=CAPS_S["study"] - TERM_GRACE_S - 5)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=TERM_GRACE_S)
        stopped = True
    wall_s = round(time.monotonic() - started, 1)
    payload: dict[str, Any] = {"rc": proc.returncode, "stopped_by_sigterm": stopped, "wall_s": wall_s}
    payload["stderr_tail"] = stderr.strip().splitlines()[-8:]
    if not stopped and proc.returncode in (0, 3):
        return {**json.loads(stdout), **payload}
    fronts = sorted((out / "studies").glob("*/*/server-*/pareto.json"))
    if fronts:
        pareto = json.loads(fronts[0].read_text())
        payload.update(best=pareto.get("best"), trials_completed=pareto.get("trials_completed"))
    return payload


def write_prompts(out: Path) -> Path:
    """The workload: 256-token prompts, 128 new tokens each."""
    prompts = out / "prompts-256x128.jsonl"
    line = json.dumps({"input_tokens": PROMPT_TOKENS, "output_tokens": NEW_TOKENS})
    prompts.write_text("\n".join([line] * 64) + "\n")
    return prompts


def section(name: str, out: Path, target_qps: float) -> dict[str, Any]:
    prompts = out / "prompts-256x128.jsonl"
    if name == "generate-eager":
        return generate(static=False)
    if name == "generate-static":
        return generate(static=True, runs=5)
    if name == "cb-graphs":
        return cb_single(prompts)
    return study(out, prompts, target_qps)


def run_all(out: Path, budget_s: float, target_qps: float) -> dict[str, Any]:
    started = time.monotonic()
    write_prompts(out)
    smi = "name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
    results: dict[str, Any] = {"nvidia_smi_before": _smi(smi)}
    for name in SECTIONS:
        left = budget_s - (time.monotonic() - started)
        cap = min(CAPS_S[name], left - 5)
        if cap < 20:
            results[name] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        cmd = [sys.executable, __file__, str(out), "--section", name, "--target-qps", f"{target_qps:g}"]
        begun = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, cwd=REPO)
            tail = proc.stderr.strip().splitlines()[-8:]
            results[name] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": tail, "rc": proc.returncode}
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"ran past its cap of {cap:.0f} s"}
        results[name]["section_s"] = round(time.monotonic() - begun, 1)
        print(f"{name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    results["nvidia_smi_after"] = _smi(smi)
    results["total_s"] = round(time.monotonic() - started, 1)
    results["summary"] = summary(results)
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against what ran: J/token 10x below the reference, graphs' TPOT, the study's time."""
    eager = results.get("generate-eager", {})
    graphs = results.get("cb-graphs", {}).get("figures", {})
    static = results.get("generate-static", {})
    best = (results.get("study", {}) or {}).get("best") or {}
    reference = eager.get("j_per_token") or REFERENCE["j_per_token"]
    out: dict[str, Any] = {"reference_j_per_token_measured": eager.get("j_per_token"), "reference_issue": REFERENCE}
    if best.get("j_per_token"):
        out["tuned"] = {k: best.get(k) for k in ("j_per_token", "ttft_p99_ms", "tpot_p99_ms", "tokens_per_s")}
        out["tuned"]["config"] = {**best.get("config", {}), "max_seqs": best.get("batch_size")}
        out["tuned_vs_reference"] = reference / best["j_per_token"]
        out["target_10x_below"] = out["tuned_vs_reference"] >= 10
    batch1 = [tpot for tpot in (graphs.get("tpot_p90_ms"), static.get("tpot_ms")) if tpot]
    if batch1:
        out["batch1_graphs_tpot_ms"] = min(batch1)
        out["target_tpot_1_2ms"] = min(batch1) <= 1.2
    study = results.get("study", {})
    if "wall_s" in study and "error" not in study:
        out["study_wall_s"] = study["wall_s"]
        out["target_study_3min"] = study["wall_s"] <= 180 and not study.get("stopped_by_sigterm")
    return out


def markdown(results: dict[str, Any], command: str) -> str:
    s = results["summary"]
    lines = [
        "# LLM on the H200 (issue 50), observe-only",
        "",
        f"Command: `{command}`. Model {MODEL} (Llama-3.2-1B shape, random bf16 weights), "
        f"{PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens. Total {results['total_s']} s.",
        "",
        "| what | TTFT ms | TPOT ms | J/token | W | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("generate-eager", "generate-static"):
        r = results.get(name, {})
        if "tpot_ms" in r:
            row = f"| {r['what']} | {r['ttft_ms']:.1f} | {r['tpot_ms']:.2f} | {r['j_per_token']:.4g} | "
            lines.append(row + f"{r['avg_w']:.0f} | {r['tokens_per_s']:.0f} |")
        else:
            lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | | |")
    f = results.get("cb-graphs", {}).get("figures")
    if f:
        lines.append(
            f"| continuous batching, 1 sequence, CUDA graphs (p90) | {f['ttft_p90_ms']:.1f} | "
            f"{f['tpot_p90_ms']:.2f} | {f['j_per_token']:.4g} | {f['avg_w']:.0f} | {f['tokens_per_s']:.0f} |"
        )
    else:
        lines.append(f"| cb-graphs | {results.get('cb-graphs', {}).get('error')} | | | | |")
    tuned = s.get("tuned")
    if tuned:
        lines.append(
            f"| tuned Server ({tuned['config']}) (p99) | {tuned['ttft_p99_ms']:.1f} | {tuned['tpot_p99_ms']:.2f} | "
            f"{tuned['j_per_token']:.4g} | | {tuned['tokens_per_s']:.0f} |"
        )
    lines += ["", "Targets: " + json.dumps({k: v for k, v in s.items() if k.startswith("target")}), ""]
    lines += [f"Summary: `{json.dumps(s)}`", ""]
    return "\n".join(lines)


def _smi(fields: str) -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=350.0, help="seconds for the whole run (default 350)")
    parser.add_argument("--target-qps", type=float, default=40.0, help="the study's Server arrival rate")
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section:
        print(json.dumps(section(args.section, args.out, args.target_qps)))
        return
    results = run_all(args.out, args.budget, args.target_qps)
    command = " ".join(["python3", "benchmarks/llm_h200.py", *sys.argv[1:]])
    (args.out / "llm_h200.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "llm_h200.md").write_text(markdown(results, command))
    print(markdown(results, command))


if __name__ == "__main__":
    main()
