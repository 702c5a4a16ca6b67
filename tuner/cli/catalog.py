"""The command list of ``tune --help``, readable without importing the commands.

``tune --help`` and ``tune --version`` are answered from here by tuner.launch
before Typer, Optuna or NumPy are imported, so they return at once. A test
holds this list to the commands the CLI registers and their docstrings.
"""

from __future__ import annotations

import shutil
import textwrap

SUMMARY = "Find the power mode and batch size that minimise energy per query under a latency bound."

COMMANDS: tuple[tuple[str, str], ...] = (
    ("run", "Run (or resume) a study: minimum energy per query (per output token for an LLM) under the bound(s)."),
    ("sweep", "Measure every configuration of the (narrowed) space: ground truth and characterization."),
    ("measure", "Measure one configuration (repeatably, with --repeat)."),
    ("pareto", "Summarise a study: its recommended configuration, then each batch size's front; rewrite its files."),
    (
        "export",
        "Write the study's recommended configuration: YAML for tune apply, or nvpmodel, Triton, trtexec, env, JSON, "
        "and an LLM study's vLLM or llama.cpp server command line.",
    ),
    (
        "dashboard",
        "Browse the studies in optuna-dashboard, read-only (optional extra: pip install 'powertune[dashboard]').",
    ),
    ("apply", "Apply an exported best mode, or a hand-chosen one with --set, at deploy time (undo with tune restore)."),
    ("restore", "Put a device back as it was before tune apply or a crashed run, from the journal."),
    ("verify", "Check an export on this unit (at most 3 windows); re-tune locally if it does not hold."),
    ("status", "Progress of a study across workers: trials done, running, failed, recommended configuration so far."),
    ("bench", "Benchmark search strategies against the noise-free sweep optimum (trials to within 2%/5%)."),
    (
        "roofline",
        "Fit time and energy rooflines (Pagoda's form) from measurements; print per-mode parameters, plot them.",
    ),
    ("devices", "List every device kind, and for each whether it can measure here (and why not)."),
    ("plan", "Cheapest feasible Server configuration per arrival rate, as a policy (reuses existing studies)."),
    ("govern", "Follow the observed arrival rate through the policy's bands (hysteresis, dwell, journaled device)."),
    ("replay", "Replay an arrival-rate trace on a twin: default mode vs static peak-tuned vs the governor."),
    ("report", "Measure models on devices across power modes and batch sizes; write report.md and report.html."),
    ("meter-serve", "Serve a local meter over TCP (named start/stop/read, token required) to a tuner on another host."),
)


def root_help(width: int | None = None) -> str:
    """``tune --help``: usage, the summary, the options and every command with its whole summary, wrapped."""
    width = min(width or shutil.get_terminal_size().columns, 100)
    name_width = max(len(name) for name, _ in COMMANDS) + 2
    lines = [
        "Usage: tune [OPTIONS] COMMAND [ARGS]...",
        "",
        *textwrap.wrap(SUMMARY, width, initial_indent="  ", subsequent_indent="  "),
        "",
        "Options:",
        "  --version  print the version and exit",
        "  --help     Show this message and exit.",
        "",
        "Commands:",
    ]
    for name, summary in COMMANDS:
        lead = f"  {name:<{name_width}}"
        lines += textwrap.wrap(
            summary, max(width, len(lead) + 30), initial_indent=lead, subsequent_indent=" " * len(lead)
        )
    lines += ["", "Each command has --help; e.g. tune run --help."]
    return "\n".join(lines)
