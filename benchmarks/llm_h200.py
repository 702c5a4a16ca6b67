"""Issue 50's LLM targets on one H200, observe-only (no clock, power or mode is ever set).

A Llama-3.2-1B-shaped model (``llama3.2-1b-random``: hidden 2048, 16 layers,
32 heads, 8 KV heads, intermediate 8192, vocabulary 128256, random bf16
weights), 256-token prompts, 128 new tokens:

1. ``generate-eager``: Hugging Face ``generate`` at batch 1, eager (the
   issue's reference: TPOT 10.3 ms, 1.65 J per output token);
2. ``study``: the default LLM study as a user types it, ``tune run ...
   --scenario server --target-qps R --max-ttft 500ms --max-tpot 30ms
   --prompts FILE`` (no --trials, no --timeout), once per rate R of
   ``--target-qps`` (default 40; a list runs one study each, one after
   another, results under ``study@R``, files in study-Rqps/): it must end by itself
   within 3 min with a J/token 10x below the reference. Past its cap
   (``STUDY_CAP_S``) it is sent SIGTERM, on which it restores the card and
   writes the completed trials' results, read back from its files
   (pareto.json, trials.csv);
3. ``tune-static``: ``tune measure`` SingleStream at one sequence on the
   runner's ``kv_cache=static`` (the library's ``generate`` over its static
   cache, decode compiled: ``graph=cudagraphs``), the tool's path to a
   batch-1 TPOT near the memory floor;
4. ``generate-static``: ``generate`` at batch 1 over the static cache with
   its compiled forward, called directly (what item 3 should match);
5. ``cb-graphs``: ``tune measure`` SingleStream at one sequence on
   continuous batching with its CUDA graphs (``graph=cudagraphs``).

Energy is NVML's total-energy counter of the GPU (read only). Each section
runs in a subprocess of this script (its GPU memory freed after), under a
time cap, so the whole run ends within ``--budget`` seconds (default 480).

    python3 benchmarks/llm_h200.py OUT [--budget 480] [--target-qps 40[,20]] [--sections a,b] [--cpu]

writes OUT/llm_h200.json (every section's figures) and OUT/llm_h200.md;
``bash benchmarks/h200_llm.sh`` runs it on a lent H200 and brings those back
with the study's trials.csv and fronts. ``--cpu`` is the dry run of the same
script here: ``tiny-llm`` on the CPU, short prompts, a constant-power meter
plugin (tests/fakes) and no energy for the generate sections; ``--study-cap``
shortens the study's cap (the SIGTERM path).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAKES = REPO / "tests" / "fakes"
REFERENCE = {"tpot_ms": 10.3, "j_per_token": 1.65}  # the issue's H200 figures, HF generate eager, batch 1
TTFT_BOUND = "500ms"
TPOT_BOUND = "30ms"
# The target is a default study that ends by itself within 180 s; past STUDY_CAP_S it is sent SIGTERM, on which it
# restores the card and writes the completed trials' results (read back from its files) within TERM_GRACE_S.
STUDY_TARGET_S = 180
STUDY_CAP_S = 200
TERM_GRACE_S = 30
SECTIONS = ("generate-eager", "study", "tune-static", "generate-static", "cb-graphs")
CAPS_S = {
    "generate-eager": 60,
    "study": STUDY_CAP_S + TERM_GRACE_S + 10,
    "tune-static": 90,
    "generate-static": 70,
    "cb-graphs": 80,
}


@dataclass(frozen=True)
class Target:
    """Where the sections run: the H200 (the issue's model and workload) or the CPU dry run."""

    model: str = "llama3.2-1b-random"
    device: str = "cuda:0"
    prompt_tokens: int = 256
    new_tokens: int = 128
    meter: list[str] = field(default_factory=list)
    dtype: str = "bf16"
    graph: str | None = "cudagraphs"  # None: the device has no graph knob (the CPU runs eager)

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"


CPU = Target(
    model="tiny-llm",
    device="cpu",
    prompt_tokens=16,
    new_tokens=8,
    meter=["--meter", "py:fakemeter:ConstantMeter"],
    dtype="fp32",
    graph=None,
)


def nvml_energy_j(target: Target) -> float:
    """The GPU's total energy counter, joules (nvmlDeviceGetTotalEnergyConsumption reads millijoules); CPU: 0."""
    if target.cpu:
        return 0.0
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def generate(target: Target, static: bool, runs: int = 5) -> dict[str, Any]:
    """HF ``generate`` at batch 1: TTFT from one-token calls, TPOT from the rest, J per output token from NVML."""
    import torch

    from runners.hf_llm_runner import build_model
    from runners.llm_spec import parse_llm
    from runners.torch_runner import DTYPES

    device = torch.device(target.device)
    model = build_model(parse_llm(target.model), DTYPES[target.dtype], device)
    ids = torch.randint(0, model.config.vocab_size, (1, target.prompt_tokens), device=device)
    new_tokens = target.new_tokens
    kwargs: dict[str, Any] = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    if static:
        kwargs["cache_implementation"] = "static"  # generate then compiles its own forward over the static cache

    def sync() -> None:
        if not target.cpu:
            torch.cuda.synchronize()

    def timed(new: int) -> float:
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
        sync()
        assert out.shape[1] == target.prompt_tokens + new
        return time.perf_counter() - start

    warm_start = time.perf_counter()
    for _ in range(2 if static else 1):
        timed(new_tokens)
        timed(1)
    warm_s = time.perf_counter() - warm_start
    ttft = sorted(timed(1) for _ in range(runs))
    joules = nvml_energy_j(target)
    start = time.perf_counter()
    totals = [timed(new_tokens) for _ in range(runs)]
    seconds = time.perf_counter() - start
    joules = nvml_energy_j(target) - joules
    ttft_s = ttft[len(ttft) // 2]
    total_s = sorted(totals)[len(totals) // 2]
    return {
        "what": f"HF generate, batch 1, {'static cache + the library compiled forward' if static else 'eager'}",
        "warmup_s": round(warm_s, 2),
        "ttft_ms": ttft_s * 1e3,
        "tpot_ms": (total_s - ttft_s) / (new_tokens - 1) * 1e3,
        "j_per_token": None if target.cpu else joules / (runs * new_tokens),
        "avg_w": None if target.cpu else joules / seconds,
        "tokens_per_s": runs * new_tokens / seconds,
        "runs": runs,
    }


def _env(cpu: bool) -> dict[str, str]:
    """The subprocesses' environment: this one, with the meter plugin's folder (tests/fakes) and no RAPL on the CPU.

    Python's fault handler is on: a study that dies in native code (one did, of SIGSEGV, at 40 q/s) leaves every
    thread's stack in its stderr.
    """
    path = os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]), str(REPO), str(FAKES)])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONFAULTHANDLER": "1"}
    if cpu:
        env.setdefault("TUNE_POWERCAP_ROOT", "/nonexistent")
    return env


def tune(args: list[str], cap_s: float, cpu: bool) -> dict[str, Any]:
    """``python -m tuner ARGS --json``: its JSON, or why there is none."""
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=cap_s,
        cwd=REPO,
        env=_env(cpu),
    )
    if proc.returncode not in (0, 3):
        return {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"], "rc": proc.returncode}
    return {"rc": proc.returncode, **json.loads(proc.stdout), "stderr_tail": proc.stderr.strip().splitlines()[-6:]}


def measure_single(target: Target, prompts: Path, sets: list[str], cap_s: float) -> dict[str, Any]:
    """``tune measure`` SingleStream at one sequence with the runner knobs ``sets`` (``--set k=v`` each)."""
    started = time.monotonic()
    args = ["measure", "--model", target.model, "--device", target.device, "--scenario", "singlestream"]
    args += ["--batch-size", "1", "--set", f"precision={target.dtype}", *target.meter]
    for assignment in sets:
        args += ["--set", assignment]
    args += ["--prompts", str(prompts), "--window", "5"]
    payload = tune(args, cap_s - 5, target.cpu)
    payload["wall_s"] = round(time.monotonic() - started, 1)
    measurements = payload.get("measurements") or []
    if measurements and measurements[0].get("tokens"):
        m = measurements[0]
        payload["figures"] = {**m["tokens"], "avg_w": m["avg_w"], "valid": m["valid"], "reason": m["reason"]}
        payload["figures"]["prepare_s"] = m["extra"].get("runner_prepare_s")
        payload["figures"]["warmup_s"] = m["extra"].get("warmup_s")
    return payload


def study_command(target: Target, prompts: Path, target_qps: float, out: Path) -> list[str]:
    """The default LLM study as a user types it (no --trials, no --timeout), its results under ``out``."""
    args = ["run", "--model", target.model, "--device", target.device, "--scenario", "server"]
    args += ["--target-qps", f"{target_qps:g}", "--max-ttft", TTFT_BOUND, "--max-tpot", TPOT_BOUND]
    return [*args, "--prompts", str(prompts), *target.meter, "--out", str(out)]


def study(target: Target, out: Path, prompts: Path, target_qps: float, cap_s: float) -> dict[str, Any]:
    """The default study timed from the command's start to its answer; past ``cap_s`` SIGTERM, its files read."""
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tuner", *study_command(target, prompts, target_qps, out / "studies"), "--json"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env(target.cpu)
    )
    stopped = False
    try:
        stdout, stderr = proc.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stopped = True
    wall_s = round(time.monotonic() - started, 1)
    payload: dict[str, Any] = {"rc": proc.returncode, "stopped_by_sigterm": stopped, "wall_s": wall_s}
    payload["command"] = " ".join(["tune", *study_command(target, prompts, target_qps, out / "studies")])
    payload["stderr_tail"] = stderr.strip().splitlines()[-8:]
    (out / "study-stderr.txt").write_text(stderr)
    payload.update(read_study(out / "studies"))
    if not stopped and proc.returncode in (0, 3):
        answer = json.loads(stdout)
        payload.update({k: answer.get(k) for k in ("stopped", "measured", "total_trials", "best", "saved")})
    return payload


def read_study(studies: Path) -> dict[str, Any]:
    """What a study's result files hold (whether it ended or was stopped): its best and every trial's figures."""
    fronts = sorted(studies.glob("*/*/server-*/pareto.json"))
    if not fronts:
        return {"files": "no pareto.json written"}
    pareto = json.loads(fronts[0].read_text())
    keys = ("trial", "state", "batch_size", "precision", "graph", "max_batch_tokens", "kv_cache", "j_per_token")
    keys += ("ttft_p99_ms", "tpot_p99_ms", "tokens_per_s", "feasible", "windows", "cut", "setup_s", "windows_s")
    with open(fronts[0].parent / "trials.csv", newline="") as fh:
        trials = [{k: row.get(k) for k in keys} for row in csv.DictReader(fh)]
    return {"best": pareto.get("best"), "trials_completed": pareto.get("trials_completed"), "trials": trials}


def write_prompts(target: Target, out: Path) -> Path:
    """The workload: fixed-length prompts and answers (256 + 128 tokens on the H200)."""
    prompts = out / f"prompts-{target.prompt_tokens}x{target.new_tokens}.jsonl"
    line = json.dumps({"input_tokens": target.prompt_tokens, "output_tokens": target.new_tokens})
    prompts.write_text("\n".join([line] * 64) + "\n")
    return prompts


def section(name: str, target: Target, out: Path, target_qps: float, study_cap_s: float) -> dict[str, Any]:
    """One section's figures (``study`` at ``target_qps``), run in this script's subprocess."""
    prompts = write_prompts(target, out)
    if name == "generate-eager":
        return generate(target, static=False)
    if name == "generate-static":
        return generate(target, static=True, runs=5)
    graph = [f"graph={target.graph}"] if target.graph else []
    if name == "cb-graphs":
        return measure_single(target, prompts, graph, CAPS_S[name])
    if name == "tune-static":
        return measure_single(target, prompts, [*graph, "kv_cache=static"], CAPS_S[name])
    return study(target, out / f"study-{target_qps:g}qps", prompts, target_qps, study_cap_s)


def run_all(
    target: Target, out: Path, budget_s: float, rates: list[float], study_cap_s: float, sections: list[str]
) -> dict[str, Any]:
    started = time.monotonic()
    smi = "name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
    results: dict[str, Any] = {"target": target.__dict__, "nvidia_smi_before": _smi(smi, target)}
    runs = [(n, r) for n in sections for r in (rates if n == "study" else [rates[0]])]
    for name, target_qps in runs:
        key = f"study@{target_qps:g}" if name == "study" else name
        left = budget_s - (time.monotonic() - started)
        cap = min(CAPS_S[name] if name != "study" else study_cap_s + TERM_GRACE_S + 10, left - 5)
        if cap < 20:
            results[key] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        cmd = [sys.executable, __file__, str(out), "--section", name, "--target-qps", f"{target_qps:g}"]
        cmd += ["--study-cap", f"{min(study_cap_s, cap - TERM_GRACE_S - 10):g}", *(["--cpu"] if target.cpu else [])]
        begun = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, cwd=REPO, env=_env(target.cpu))
            tail = proc.stderr.strip().splitlines()[-8:]
            results[key] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": tail, "rc": proc.returncode}
        except subprocess.TimeoutExpired:
            results[key] = {"error": f"ran past its cap of {cap:.0f} s"}
        results[key]["section_s"] = round(time.monotonic() - begun, 1)
        print(f"{key}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    results["nvidia_smi_after"] = _smi(smi, target)
    results["total_s"] = round(time.monotonic() - started, 1)
    results["summary"] = summary(results)
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against what ran: J/token 10x below the reference, batch-1 TPOT, each study's time."""
    eager = results.get("generate-eager", {})
    reference = eager.get("j_per_token") or REFERENCE["j_per_token"]
    out: dict[str, Any] = {"reference_j_per_token_measured": eager.get("j_per_token"), "reference_issue": REFERENCE}
    for key in sorted(k for k in results if k.startswith("study@")):
        out[key] = _study_summary(results[key] or {}, reference)
    batch1 = {
        "tune-static": results.get("tune-static", {}).get("figures", {}).get("tpot_p90_ms"),
        "cb-graphs": results.get("cb-graphs", {}).get("figures", {}).get("tpot_p90_ms"),
        "generate-static": results.get("generate-static", {}).get("tpot_ms"),
    }
    out["batch1_tpot_ms"] = {k: v for k, v in batch1.items() if v}
    if batch1["tune-static"]:
        out["target_tpot_1_2ms"] = batch1["tune-static"] <= 1.2
    return out


def _study_summary(study: dict[str, Any], reference: float) -> dict[str, Any]:
    """One study against the targets: its answer's J/token over the reference's, its wall time, why it ended."""
    out: dict[str, Any] = {}
    best = study.get("best") or {}
    if best.get("j_per_token"):
        out["tuned"] = {k: best.get(k) for k in ("j_per_token", "ttft_p99_ms", "tpot_p99_ms", "tokens_per_s")}
        out["tuned"]["config"] = {**best.get("config", {}), "max_seqs": best.get("batch_size")}
        out["tuned_vs_reference"] = reference / best["j_per_token"]
        out["target_10x_below"] = out["tuned_vs_reference"] >= 10
    if "wall_s" in study and "error" not in study:
        out["wall_s"] = study["wall_s"]
        out["trials"] = study.get("trials_completed")
        out["stopped"] = study.get("stopped")
        out["setup_s"] = [t.get("setup_s") for t in study.get("trials", [])]
        out["target_study_3min"] = study["wall_s"] <= STUDY_TARGET_S and not study.get("stopped_by_sigterm")
    return out


def _row(what: str, ttft: Any, tpot: Any, j: Any, w: Any, tps: Any) -> str:
    def fmt(value: Any, spec: str) -> str:
        return "" if value is None else format(value, spec)

    return (
        f"| {what} | {fmt(ttft, '.1f')} | {fmt(tpot, '.2f')} | {fmt(j, '.4g')} | {fmt(w, '.0f')} | {fmt(tps, '.0f')} |"
    )


def markdown(results: dict[str, Any], command: str) -> str:
    s, target = results["summary"], results["target"]
    lines = [
        "# LLM on the H200 (issue 50), observe-only",
        "",
        f"Command: `{command}`. Model {target['model']} on {target['device']}, {target['prompt_tokens']}-token "
        f"prompts, {target['new_tokens']} new tokens. Total {results['total_s']} s.",
        "",
        "| what | TTFT ms | TPOT ms | J/token | W | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("generate-eager", "generate-static"):
        r = results.get(name, {})
        if "tpot_ms" in r:
            lines.append(_row(r["what"], r["ttft_ms"], r["tpot_ms"], r["j_per_token"], r["avg_w"], r["tokens_per_s"]))
        else:
            lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | | |")
    for name, what in (
        ("tune-static", "tune measure, 1 sequence, kv_cache=static (generate, compiled) (p90)"),
        ("cb-graphs", "tune measure, 1 sequence, continuous batching, CUDA graphs (p90)"),
    ):
        r = results.get(name, {})
        f = r.get("figures")
        if f:
            lines.append(
                _row(what, f["ttft_p90_ms"], f["tpot_p90_ms"], f["j_per_token"], f["avg_w"], f["tokens_per_s"])
            )
        else:
            lines.append(f"| {name} | {r.get('error') or r.get('skipped')} | | | | |")
    studies = sorted(k for k in results if k.startswith("study@"))
    for key in studies:
        tuned = s[key].get("tuned")
        if tuned:
            what = f"tuned Server {key[6:]} q/s ({tuned['config']}) (p99)"
            figures = (tuned["ttft_p99_ms"], tuned["tpot_p99_ms"], tuned["j_per_token"], None, tuned["tokens_per_s"])
            lines.append(_row(what, *figures))
    for key in studies:
        study = results[key]
        if study.get("command"):
            lines += ["", f"Study: `{study['command']}`: {study.get('wall_s')} s, {study.get('stopped') or ''}"]
            completed = study.get("trials_completed")
            lines += [f"SIGTERM at its cap: {study.get('stopped_by_sigterm')}; trials completed: {completed}"]
    targets = {k: v for k, v in s.items() if k.startswith("target")}
    targets.update({key: {k: v for k, v in s[key].items() if k.startswith("target")} for key in studies})
    lines += ["", "Targets: " + json.dumps(targets), ""]
    lines += [f"Summary: `{json.dumps(s)}`", ""]
    return "\n".join(lines)


def _smi(fields: str, target: Target) -> str:
    if target.cpu:
        return "cpu dry run"
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    parser.add_argument("--target-qps", default="40", help="the studies' Server arrival rates, comma-separated")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which sections run, comma-separated")
    parser.add_argument("--study-cap", type=float, default=STUDY_CAP_S, help="seconds before the study gets SIGTERM")
    parser.add_argument("--cpu", action="store_true", help="the dry run here: tiny-llm on the CPU")
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    target = CPU if args.cpu else Target()
    rates = [float(r) for r in args.target_qps.split(",")]
    if args.section:
        print(json.dumps(section(args.section, target, args.out, rates[0], args.study_cap)))
        return
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}: choose from {', '.join(SECTIONS)}")
    results = run_all(target, args.out, args.budget, rates, args.study_cap, sections)
    command = " ".join(["python3", "benchmarks/llm_h200.py", *sys.argv[1:]])
    (args.out / "llm_h200.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "llm_h200.md").write_text(markdown(results, command))
    print(markdown(results, command))


if __name__ == "__main__":
    main()
