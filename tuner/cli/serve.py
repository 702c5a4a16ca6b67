"""tune plan, tune govern, tune replay: serving under a load that changes."""

from __future__ import annotations

import datetime as dt
import time
from contextlib import ExitStack
from pathlib import Path

import optuna
import typer

from tuner.cli import common, options
from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session, hold
from tuner.devices.switching import SwitchCosts, switch_seconds
from tuner.errors import UserError
from tuner.models import check_model
from tuner.plumbing import atomicfile, interrupts
from tuner.plumbing.units import MAX_TRIALS, check_count
from tuner.records import recommended
from tuner.scenario import format_rate
from tuner.serve.estimate import DEFAULT_SMOOTHING_S
from tuner.serve.figures import plot_policy, plot_replay
from tuner.serve.governor import (
    DEFAULT_DWELL_S,
    DEFAULT_HEADROOM,
    DEFAULT_HYSTERESIS,
    Governor,
    Switch,
    journal_line,
    read_state,
    run_governor,
    write_state,
)
from tuner.serve.plan import (
    PLAN_SAMPLER,
    REFINE_TRIALS,
    PlanOptions,
    RateResult,
    build_policy,
    parse_rates,
    plan_rates,
)
from tuner.serve.policy import Policy, load_policy, write_policy
from tuner.serve.rates import open_rate_source
from tuner.serve.replay import GovernorRules, replay
from tuner.serve.trace import load_trace, shipped_traces, trace_path
from tuner.serve.validate import check_policy_for, check_rules

PlanBound = typer.Option(..., "--max-latency", "-l", help="p99 bound of the Server scenario, e.g. 50ms")
Rates = typer.Option(
    ..., "--rates", help="arrival rates to plan, queries/s: start:stop:step (e.g. 25:300:25) or a list"
)
PlanTrials = typer.Option(40, "--trials", "-n", help="trials per rate that no existing study covers")
Refine = typer.Option(
    REFINE_TRIALS, "--refine", help="further trials per rate walking from the best to cheaper neighbours"
)
PlanSampler = typer.Option(PLAN_SAMPLER, "--sampler", help="as tune run (default tpe: fast per trial)")
PolicyOutput = typer.Option(Path("policy.yaml"), "--output", "-o", help="the policy file to write")
RateSource = typer.Option(
    ...,
    "--rate-source",
    help="file:PATH (last line = rate), unix:PATH (datagram socket), "
    "or http://127.0.0.1:PORT/metrics#METRIC (Prometheus text, loopback only)",
)
PolicyModel = typer.Option(None, "--model", "-m", help="refuse a policy planned for another model")
ObserveOnly = typer.Option(False, "--observe-only", help="print what it would switch to; write nothing")
GovernInterval = typer.Option(1.0, "--interval", help="seconds between rate reads")
Duration = typer.Option(None, "--duration", help="stop after this many seconds (default never)")
Log = typer.Option(None, "--log", help="append every switch as a JSON line here")
StateFile = typer.Option(
    None,
    "--state-file",
    help="write the current band (batch size, timeout) here for the serving process; "
    "rewritten every interval, with the governor's PID and a stale_after time",
)
Trace = typer.Option(
    ..., "--trace", help=f"CSV t_s,rate_qps, or a shipped trace by name: {', '.join(shipped_traces())}"
)
RateScale = typer.Option(1.0, "--rate-scale", help="multiply the trace's rates (fit it to the device)")
ReplaySeed = typer.Option(0, "--seed", help="seed of arrivals and the governor's rate estimates")
ReplayInterval = typer.Option(1.0, "--interval", help="the governor's seconds between rate reads")
Plot = typer.Option(
    None, "--plot", help="rate, band and power over time (default replay-<trace>-<device>.png beside the policy)"
)
Headroom = typer.Option(DEFAULT_HEADROOM, "--headroom", help="choose the band for the rate x (1 + this)")
Hysteresis = typer.Option(
    DEFAULT_HYSTERESIS, "--hysteresis", help="switch down only this fraction below the band's lower edge"
)
Dwell = typer.Option(DEFAULT_DWELL_S, "--min-dwell", help="seconds a band is held before switching down")
Smoothing = typer.Option(
    DEFAULT_SMOOTHING_S,
    "--smoothing",
    help="seconds over which rate readings are averaged (a rise beyond Poisson noise is followed at once; 0: raw)",
)


def _output(path: Path, flag: str) -> None:
    """A file a command will write: checked before any work, as tune run and tune export check theirs."""
    common.check_out_file(path, flag)
    atomicfile.check_target(path, flag)


def _stale_state(path: Path | None) -> None:
    """Say so when a state file left by a governor that died (kill -9) is about to be replaced.

    One that cannot be trusted or read (another user's, hostile JSON) is a
    one-line error before anything is written: it is not this tool's.
    """
    if path is None or not path.is_file():
        return
    state = read_state(path)
    if state["stale"] and state.get("running"):
        common.err_console.print(
            f"warning: {path} was left by governor PID {state.get('pid')}, which stopped without clearing it (stale)"
        )


@interrupts.deferring
def plan(
    model: str = options.Model,
    device: str = options.Device,
    max_latency: str = PlanBound,
    rates: str = Rates,
    trials: int = PlanTrials,
    refine: int = Refine,
    seed: int | None = options.Seed,
    sampler: str = PlanSampler,
    batch_sizes: str | None = options.BatchSizes,
    knobs: str | None = options.Knobs,
    storage: str | None = options.Storage,
    out: Path = options.Out,
    window: float = options.window("trial", adaptive=False),
    meter: str | None = options.Meter,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    output: Path = PolicyOutput,
    as_json: bool = options.Json,
) -> None:
    """Cheapest feasible Server configuration per arrival rate, as a policy (reuses existing studies)."""
    check_count(trials, "--trials", 40)
    if not 0 <= refine <= MAX_TRIALS:
        raise UserError(f"--refine must be 0 (off) or a number of trials up to {MAX_TRIALS}, e.g. 30")
    bound = common.latency(max_latency)
    planned = parse_rates(rates)
    common.run_storage(storage, out)
    plot = output.with_suffix(".png")
    _output(output, "--output")
    _output(plot, "--output")
    dev = options.open_for(device, allow_clock_changes, sysfs_root)
    check_model(model)
    settings = PlanOptions(
        model=model,
        max_latency_ms=bound,
        rates=planned,
        trials=trials,
        refine_trials=refine,
        seed=seed,
        sampler=sampler,
        batch_sizes=common.batch_list(batch_sizes),
        knobs=common.knob_list(knobs),
        storage=storage,
        out=out,
        window=options.window_settings(window, "p99", meter, seed, True),
    )
    progress = PlanProgress(settings, as_json)
    settings.on_trial = progress.trial
    with hold(dev):
        results = plan_rates(
            dev, settings, on_rate=lambda result: _planned(result, dev.simulated), on_start=progress.start
        )
    policy = _write_policy(dev, settings, results, output, plot)
    if as_json:
        common.emit_json({"policy": str(output), "plot": str(plot), **policy.model_dump(mode="json")})
        return
    rows = [[f"{b.min_qps:g}-{b.max_qps:g}", b.label(), b.j_per_query, b.latency_ms, b.avg_w] for b in policy.bands]
    title = f"policy for {model} on {dev.name} (p99 <= {settings.max_latency_ms:g} ms){common.twin_note(dev)}"
    common.out_console.print(common.table(title, ["rate q/s", "config", "J/query", "p99 ms", "avg W"], rows))
    common.out_console.print(f"policy: {output}, plot: {plot}")


def _write_policy(dev: Device, settings: PlanOptions, results: list[RateResult], output: Path, plot: Path) -> Policy:
    """The policy of the planned rates, written to ``output`` and drawn in ``plot``."""
    policy = build_policy(dev, settings, results, "p99")
    write_policy(policy, output)
    plot_policy(policy, plot)
    return policy


class PlanProgress:
    """What tune plan says while it runs: its size first, then a line per finished trial with an ETA.

    The ETA is an upper bound: it assumes every rate still to tune takes its
    most trials (search, refine, verify, cross-check); a rate whose search
    finds nothing cheaper nearby takes fewer.
    """

    def __init__(self, settings: PlanOptions, quiet: bool) -> None:
        self.settings = settings
        self.quiet = quiet
        self.total = 0
        self.done = 0
        self.started = time.monotonic()

    def start(self, to_tune: list[float]) -> None:
        self.total = len(to_tune) * self.settings.trials_per_rate()
        self.started = time.monotonic()
        if self.quiet:
            return
        reused = len(self.settings.rates) - len(to_tune)
        common.err_console.print(
            f"plan: {len(self.settings.rates)} rates, {reused} from existing studies, {len(to_tune)} to tune "
            f"(at most {self.settings.trials_per_rate()} trials each: {self.settings.trials} search, "
            f"{self.settings.refine_trials} refine, verify and cross-check): at most {self.total} trials; "
            "a line per trial follows, with an ETA"
        )

    def trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, _measured: int) -> None:
        self.done += 1
        if self.quiet:
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * max(self.total - self.done, 0)
        value = "failed" if trial.value is None else f"{trial.value:.4g} J/query"
        best = recommended(study)
        shown = "-" if best is None else f"{best.value:.4g} J/query (trial {best.number})"
        rate = format_rate(float(study.user_attrs.get("target_qps", 0.0)))
        common.err_console.print(
            f"{rate} q/s trial {trial.number}: {value}; best {shown}; {self.done}/{self.total} at most; "
            f"elapsed {elapsed / 60:.1f} min, ETA at most {eta / 60:.1f} min",
            soft_wrap=True,
        )


def _planned(result: RateResult, simulated: bool) -> None:
    """One line on stderr per planned rate: its cheapest feasible energy, and whether it was measured now."""
    tuned = "simulated on the digital twin" if simulated else "measured"
    how = tuned if result.measured_by_plan else "from an existing study"
    best = "infeasible" if result.record is None else f"{result.record['j_per_query']:.4g} J/query"
    common.err_console.print(f"{result.rate:g} q/s: {best} ({how})")


def govern(
    policy_file: Path = options.PolicyFile,
    device: str = options.Device,
    rate_source: str = RateSource,
    model: str | None = PolicyModel,
    observe_only: bool = ObserveOnly,
    interval: float = GovernInterval,
    headroom: float = Headroom,
    hysteresis: float = Hysteresis,
    min_dwell: float = Dwell,
    smoothing: float = Smoothing,
    duration: float | None = Duration,
    log: Path | None = Log,
    state_file: Path | None = StateFile,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
) -> None:
    """Follow the observed arrival rate through the policy's bands (hysteresis, dwell, journaled device)."""
    check_rules(interval, headroom, hysteresis, min_dwell, smoothing, duration)
    for path, flag in ((log, "--log"), (state_file, "--state-file")):
        if path is not None:
            _output(path, flag)
    _stale_state(state_file)
    policy = load_policy(policy_file)
    dev = options.open_for(device, allow_clock_changes, sysfs_root)
    check_policy_for(policy, dev, model)
    rules = GovernorRules(headroom, hysteresis, min_dwell, smoothing)
    governor = _governor(policy, dev, rules, None if observe_only else dev, log)
    tick = None if state_file is None else (lambda: write_state(state_file, governor, interval))
    with ExitStack() as stack:
        if not observe_only:  # the device is taken before any socket is touched
            stack.enter_context(interrupts.held())
            stack.enter_context(hold(dev))
        source = open_rate_source(rate_source, _warn)
        stack.callback(source.close)
        if policy.twin:
            _warn("this policy was planned on a digital twin, not on hardware")
        mode = "observe-only: nothing is written" if observe_only else f"governing {dev.name}"
        common.err_console.print(f"{mode}; rate from {source.description}, every {interval:g} s")
        try:
            if observe_only:
                run_governor(governor, source, interval, duration, on_tick=tick)
            else:
                with hardware_session(dev):
                    run_governor(governor, source, interval, duration, on_tick=tick)
                common.err_console.print(f"{dev.name} restored")
        finally:
            if state_file is not None:
                write_state(state_file, governor, interval, running=False)


def _governor(policy: Policy, dev: Device, rules: GovernorRules, applied: Device | None, log: Path | None) -> Governor:
    """The governor of ``policy`` on ``dev``, applying each band to ``applied`` (None: observe only)."""
    space = dev.space()

    def record(switch: Switch) -> None:
        when = dt.datetime.fromtimestamp(switch.time, dt.timezone.utc).isoformat(timespec="seconds")
        common.out_console.print(f"{when} {switch.line()}")
        if log is not None:
            atomicfile.append_line(log, journal_line(switch))

    return Governor(
        policy,
        apply=None if applied is None else (lambda band: applied.apply(band.config())),
        headroom=rules.headroom,
        hysteresis=rules.hysteresis,
        min_dwell_s=rules.min_dwell_s,
        smoothing_s=rules.smoothing_s,
        switch_s=lambda a, b: switch_seconds(space, SwitchCosts(), policy.bands[a].config(), policy.bands[b].config()),
        log=record,
        warn=_warn,
    )


def _warn(message: str) -> None:
    common.err_console.print(f"warning: {message}")


def _say_above_top(above: dict | None) -> None:
    """The replay's line for a trace that goes above the policy's top band (nothing when it stays within)."""
    if above is not None:
        common.out_console.print(
            f"over the policy: the trace reaches {above['peak_qps']:g} q/s, above its top band (up to "
            f"{above['top_band_max_qps']:g} q/s) for {above['seconds']:g} s ({above['trace_pct']:g}% of the trace); "
            f"the governor went over the bound for {above['governor_over_bound_pct']:g}% of queries: plan with "
            f"--rates up to {above['peak_qps']:g}, or lower --rate-scale"
        )


def replay_cmd(
    policy_file: Path = options.PolicyFile,
    trace: str = Trace,
    device: str = options.Device,
    scale: float = RateScale,
    seed: int = ReplaySeed,
    interval: float = ReplayInterval,
    headroom: float = Headroom,
    hysteresis: float = Hysteresis,
    min_dwell: float = Dwell,
    smoothing: float = Smoothing,
    plot: Path | None = Plot,
    as_json: bool = options.Json,
) -> None:
    """Replay an arrival-rate trace on a twin: default mode vs static peak-tuned vs the governor."""
    if not (0 < scale < float("inf")):
        raise UserError("--rate-scale must be a positive number, e.g. 10")
    check_rules(interval, headroom, hysteresis, min_dwell, smoothing, None)
    policy = load_policy(policy_file)
    dev = options.open_for(device, False, None)
    path = trace_path(trace)
    figure = plot or policy_file.parent / f"replay-{path.stem}-{dev.slug}.png"
    _output(figure, "--plot")
    check_policy_for(policy, dev)
    rates = load_trace(path, scale)
    rules = GovernorRules(headroom, hysteresis, min_dwell, smoothing)
    with common.count_progress("replay", "", as_json) as bar:
        task = bar.add_task("replay", total=None)

        def tick(strategy: str, done: int, total: int) -> None:
            bar.update(task, description=f"replay: {strategy}", completed=done, total=total)

        report = replay(policy, dev, rates, seed, interval, rules, progress=tick)  # type: ignore[arg-type]
    plot_replay(report, figure)
    summary = {**report.summary(), "plot": str(figure)}
    if as_json:
        common.emit_json(summary)
        return
    columns = ("strategy", "energy_kj", "j_per_query", "queries", "over_bound_pct", "switches", "switching_s")
    common.out_console.print(
        common.table(
            f"{policy.model} on {dev.name}, trace {rates.name} ({summary['hours']:g} h, peak "
            f"{summary['peak_qps']:g} q/s), {summary['bound']}{common.twin_note(dev)}",
            ["strategy", "energy kJ", "J/query", "queries", "% over bound", "switches", "switching s"],
            [[r[key] for key in columns] for r in summary["strategies"]],
        )
    )
    _say_above_top(summary["above_top_band"])
    saved = report.savings()
    common.out_console.print(
        "energy the governor saves: "
        + ", ".join(
            f"{saved[f'governor_vs_{name}_pct']:+.2f}% vs {name}" for name in ("static", "default", "default_locked")
        )
        + f"; plot: {figure}"
    )
