"""``tune replay``: an arrival-rate trace through the ways of serving it, on a twin.

The ways: ``default`` (the device's default mode with its frequency governors
following the load ``reaction_s`` late, or idling at a card's measured awake
power where the twin carries it; ``default_locked`` with clocks at their
maximum), ``static`` (the policy's band for the trace's peak rate, held all
day) and ``governor`` (the policy's bands switched by
:class:`~tuner.serve.governor.Governor`). Steady stretches are served by the
twin's queueing model and scaled to their length; the time around every
switch is simulated as one run of arrivals, so the queue a switch leaves and
the switch's own time and energy are both counted. The rules and their
sources are in docs/serving.md. The traces are tuner.serve.trace, what a
replay found tuner.serve.replay_report, its figure tuner.serve.figures.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tuner.devices.switching import SwitchCosts, switch_power_w, switch_seconds
from tuner.devices.virtual.queueing import (
    QueueOutcome,
    Reaction,
    ServingProfile,
    poisson_arrivals,
    simulate,
)
from tuner.devices.virtual.twin import TwinDevice
from tuner.errors import ConfigurationError
from tuner.models import profiled
from tuner.serve.estimate import DEFAULT_BURST_SIGMAS, DEFAULT_SMOOTHING_S
from tuner.serve.governor import DEFAULT_DWELL_S, DEFAULT_HEADROOM, DEFAULT_HYSTERESIS, DEFAULT_MIN_SAVING, Governor
from tuner.serve.policy import Band, Policy
from tuner.serve.replay_report import ReplayReport, StrategyResult
from tuner.serve.trace import Trace
from tuner.serve.validate import MAX_REPLAY_STEPS, check_policy_for
from tuner.space import Config

SIM_CAP_S = 20.0
PRE_SWITCH_S = 5.0
POST_SWITCH_S = 20.0
# How late devfreq/cpufreq follow the load under a Jetson's default mode (see the module docstring).
DEFAULT_REACTION_S = 0.025
DEFAULT_INTERVAL_S = 1.0
# How the tuned configurations (static and the governor's bands) hold their clocks; see Replayer.
CLOCKS = ("lock", "cap")


Progress = Callable[[str, int, int], None]
"""How far a replay is: the strategy being served, and its rows (or governor steps) done of all."""


class Replayer:
    """Serves trace pieces on a twin with caching; see the module docstring."""

    def __init__(
        self,
        device: TwinDevice,
        policy: Policy,
        seed: int,
        sim_cap_s: float = SIM_CAP_S,
        clocks: str = "lock",
        reaction_s: float = DEFAULT_REACTION_S,
        progress: Progress | None = None,
    ) -> None:
        if clocks not in CLOCKS:
            raise ConfigurationError(f"unknown clocks setting {clocks!r}: choose lock or cap")
        self.device = device
        self.policy = policy
        self.clocks = clocks
        self.reaction_s = reaction_s
        self.profile = profiled(policy.model)
        self.seed = seed
        self.sim_cap_s = sim_cap_s
        self.bound_s = policy.max_latency_ms / 1000.0
        self._profiles: dict[tuple, ServingProfile] = {}
        self._windows: dict[tuple, QueueOutcome] = {}
        self._tuned: dict[tuple, tuple[float | None, Reaction | None]] = {}
        self.progress = progress

    def tick(self, strategy: str, done: int, total: int) -> None:
        """Tell the progress callback how far one strategy's replay is."""
        if self.progress is not None:
            self.progress(strategy, done, total)

    def tuned(self, config: Config) -> tuple[float | None, Reaction | None]:
        """Idle power and governor reaction of a tuned configuration (static, a band) as its clocks are held.

        ``lock`` (what ``tune apply`` writes: min = max): it idles at its own
        clocks and runs every batch at them (None, None: the profile as it is).
        ``cap`` (max = the configuration's clock, min = the table's floor,
        governors free): between batches the clocks fall to the floor and a
        batch after they fell runs its first ``reaction_s`` there, the same
        model as the default mode as deployed (:func:`deployed_reaction`).
        """
        if self.clocks == "lock":
            return None, None
        key = config.key()
        if key not in self._tuned:
            self._tuned[key] = (unlocked_idle_w(self.device, config), deployed_reaction(self, config, self.reaction_s))
        return self._tuned[key]

    def serving(self, config: Config) -> ServingProfile:
        key = config.key()
        if key not in self._profiles:
            self._profiles[key] = self.device.model.serving(self.profile, config)
        return self._profiles[key]

    def held(self, config: Config) -> ServingProfile:
        """A tuned configuration's serving profile with its clocks held as :meth:`tuned` says."""
        return _overridden(self.serving(config), *self.tuned(config))

    def piece(
        self,
        config: Config,
        timeout_ms: float,
        rate: float,
        seconds: float,
        idle_w: float | None = None,
        reaction: Reaction | None = None,
    ) -> tuple[float, float, float]:
        """Energy (J), queries and queries over the bound of ``seconds`` at ``rate`` under a configuration.

        ``idle_w`` replaces the configuration's idle power between batches
        (a default mode whose governors let the clocks fall), ``reaction`` the
        delay with which those governors follow the load.
        """
        if seconds <= 0:
            return 0.0, 0.0, 0.0
        serving = _overridden(self.serving(config), idle_w, reaction)
        if rate <= 0:
            return serving.idle_w * seconds, 0.0, 0.0
        bucket = round(math.log(rate) / math.log(1.01))
        delay = None if serving.reaction is None else serving.reaction.delay_s
        key = (config.key(), timeout_ms, bucket, serving.idle_w, delay)
        if key not in self._windows:
            rng = np.random.default_rng(zlib.crc32(repr((self.seed, key[:3])).encode()))
            arrivals = poisson_arrivals(1.01**bucket, self.sim_cap_s, rng)
            self._windows[key] = simulate(
                arrivals, serving, config.batch_size, timeout_ms / 1000.0, self.sim_cap_s, rng
            )
        out = self._windows[key]
        scale = seconds / self.sim_cap_s
        extra_idle = max(out.duration_s - self.sim_cap_s, 0.0)
        energy = (out.energy_j - serving.idle_w * extra_idle) * scale
        return energy, out.queries * scale, out.over(self.bound_s) * scale

    def fixed(
        self,
        name: str,
        config: Config,
        timeout_ms: float,
        trace: Trace,
        band: int,
        idle_w: float | None = None,
        reaction: Reaction | None = None,
    ) -> StrategyResult:
        result = StrategyResult(name=name, labels={f"{config.label()} timeout={timeout_ms:g}ms"})
        for i, (rate, seconds) in enumerate(zip(trace.rates, trace.durations, strict=True)):
            self.tick(name, i, len(trace.rates))
            e, q, o = self.piece(config, timeout_ms, float(rate), float(seconds), idle_w, reaction)
            result.energy_j += e
            result.queries += q
            result.over_bound += o
            result.bands.append(band)
            result.power_w.append(e / seconds)
        return result

    def governed(
        self, trace: Trace, interval_s: float, rules: GovernorRules, costs: SwitchCosts | None = None
    ) -> StrategyResult:
        """The governor reading the rate every ``interval_s``; each switch counts from the next interval.

        The governor's choices depend only on the rates it reads, so the
        schedule (one band per interval) is made first and then served: in the
        steady state away from switches, as one simulated run around each.
        """
        costs = SwitchCosts() if costs is None else costs
        result = StrategyResult(name="governor")
        governor = Governor(
            self.policy,
            apply=lambda band: None,
            clock=lambda: 0.0,
            switch_s=(lambda a, b: self.pause_s(costs, a, b)) if rules.weigh_switches else None,
            **rules.kwargs(),
        )
        rng = np.random.default_rng(self.seed)
        governor.observe(float(trace.rates[0]), now=0.0)
        steps: list[Step] = []
        for row, (start, rate, seconds) in enumerate(zip(trace.times, trace.rates, trace.durations, strict=True)):
            t, end = float(start), float(start) + float(seconds)
            while t < end:
                assert governor.current is not None
                step = min(interval_s, end - t)
                steps.append(Step(start=t, seconds=step, rate=float(rate), band=governor.current, row=row))
                t += step
                governor.observe(rng.poisson(float(rate) * step) / step, now=t)
            result.bands.append(int(governor.current or 0))
        energy = np.zeros(len(steps))
        around_switch = np.zeros(len(steps), dtype=bool)
        for lo, hi in self.switch_windows(steps, costs):
            e, q, o, paused = self.serve_run(steps[lo:hi], costs)
            result.queries += q
            result.over_bound += o
            result.switch_s += paused
            span = np.array([s.seconds for s in steps[lo:hi]])
            energy[lo:hi] = e * span / span.sum()
            around_switch[lo:hi] = True
        for k, s in enumerate(steps):
            self.tick("governor", k, len(steps))
            if around_switch[k]:
                continue
            band = self.policy.bands[s.band]
            e, q, o = self.piece(band.config(), band.batch_timeout_ms, s.rate, s.seconds, *self.tuned(band.config()))
            energy[k] = e
            result.queries += q
            result.over_bound += o
        rows = np.array([s.row for s in steps])
        per_row = np.bincount(rows, weights=energy, minlength=len(trace.rates))
        result.energy_j = float(energy.sum())
        result.power_w = [float(e / d) for e, d in zip(per_row, trace.durations, strict=True)]
        result.switches = len(governor.switches) - 1
        result.labels = {self.policy.bands[s.to_band].label() for s in governor.switches}
        return result

    def pause_s(self, costs: SwitchCosts, a: int, b: int) -> float:
        """Seconds a switch from band ``a`` to band ``b`` keeps the device from serving."""
        bands = self.policy.bands
        return switch_seconds(self.device.space(), costs, bands[a].config(), bands[b].config())

    def switch_windows(self, steps: list[Step], costs: SwitchCosts) -> list[tuple[int, int]]:
        """Step ranges ``[lo, hi)`` served as one run: each switch's surroundings, overlapping ones joined."""
        spans: list[tuple[float, float]] = []
        for k in range(1, len(steps)):
            if steps[k].band != steps[k - 1].band:
                pause = self.pause_s(costs, steps[k - 1].band, steps[k].band)
                at = steps[k].start
                spans.append((at - PRE_SWITCH_S, at + POST_SWITCH_S + 20.0 * pause))
        starts = np.array([s.start for s in steps])
        windows: list[tuple[int, int]] = []
        for a, b in spans:
            lo = max(int(np.searchsorted(starts, a, side="right")) - 1, 0)
            hi = int(np.searchsorted(starts, b, side="left"))
            if windows and lo <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(hi, windows[-1][1]))
            else:
                windows.append((lo, hi))
        return windows

    def serve_run(self, steps: list[Step], costs: SwitchCosts) -> tuple[float, float, float, float]:
        """Energy, queries, queries over the bound and seconds paused of consecutive steps served as one run.

        Each stretch of one band serves from when the previous one stopped
        starting batches (or its switch ended) with the queue it inherits; a
        batch already running when a switch starts completes.
        """
        begin = steps[0].start
        rng = np.random.default_rng(zlib.crc32(repr((self.seed, "run", round(begin, 6))).encode()))
        arrivals = np.concatenate([s.start + poisson_arrivals(s.rate, s.seconds, rng) for s in steps])
        stretches: list[tuple[int, float, float]] = []
        for s in steps:
            if stretches and stretches[-1][0] == s.band:
                stretches[-1] = (s.band, stretches[-1][1], s.start + s.seconds)
            else:
                stretches.append((s.band, s.start, s.start + s.seconds))
        jetson = self.device.space().mode_knob is not None
        energy, paused, served, free_at = 0.0, 0.0, 0, begin
        latencies: list[np.ndarray] = []
        for k, (index, a, b) in enumerate(stretches):
            band = self.policy.bands[index]
            serving = self.held(band.config())
            if k > 0:
                previous = stretches[k - 1][0]
                pause = self.pause_s(costs, previous, index)
                paused += pause
                idle_before = self.held(self.policy.bands[previous].config()).idle_w
                power = switch_power_w(costs, idle_before, serving.idle_w, jetson)
                energy += power * max(a + pause - max(a, free_at), 0.0)
                free_at = max(free_at, a + pause)
            free_at = max(free_at, a)
            last = k == len(stretches) - 1
            out = simulate(
                arrivals[served:], serving, band.batch_size, band.batch_timeout_ms / 1000.0, b, rng,
                free_at=free_at, stop_s=np.inf if last else b,
            )  # fmt: skip
            energy += out.energy_j
            latencies.append(out.latencies_s)
            served += out.queries
            free_at = out.free_at
        lat = np.concatenate(latencies)
        return energy, float(len(lat)), float(np.count_nonzero(lat > self.bound_s)), paused


def _overridden(serving: ServingProfile, idle_w: float | None, reaction: Reaction | None) -> ServingProfile:
    """A serving profile with its idle power and governor reaction replaced where given."""
    if idle_w is not None:
        serving = replace(serving, idle_w=idle_w)
    if reaction is not None:
        serving = replace(serving, reaction=reaction)
    return serving


@dataclass
class Step:
    """One interval of the governed replay: the band in force and the trace's rate."""

    start: float
    seconds: float
    rate: float
    band: int
    row: int


@dataclass
class GovernorRules:
    """The governor's switching settings a replay runs with (the defaults of ``tune govern``)."""

    headroom: float = DEFAULT_HEADROOM
    hysteresis: float = DEFAULT_HYSTERESIS
    min_dwell_s: float = DEFAULT_DWELL_S
    smoothing_s: float = DEFAULT_SMOOTHING_S
    burst_sigmas: float = DEFAULT_BURST_SIGMAS
    min_saving: float = DEFAULT_MIN_SAVING
    weigh_switches: bool = True

    def kwargs(self) -> dict[str, float]:
        return {
            "headroom": self.headroom,
            "hysteresis": self.hysteresis,
            "min_dwell_s": self.min_dwell_s,
            "smoothing_s": self.smoothing_s,
            "burst_sigmas": self.burst_sigmas,
            "min_saving": self.min_saving,
        }


def default_band(device: TwinDevice, static: Band) -> tuple[Config, float]:
    """The device's default knobs (MAXN / default clocks) with the peak band's batching."""
    space = device.space()
    config = space.effective(Config(knobs=space.default_config().knobs, batch_size=static.batch_size))
    return config, static.batch_timeout_ms


def floor_config(device: TwinDevice, config: Config) -> Config:
    """A configuration's mode once its governors have let every clock fall to the lowest value.

    The GPU, memory and CPU clocks drop to the lowest the space offers; cores
    online, TPCs and the power limit stay the mode's (devfreq and cpufreq
    scale clocks, not cores).
    """
    roles = device.model.params.knob_map
    space = device.space()
    knobs = dict(config.knobs)
    for role in ("gpu_mhz", "mem_mhz", "cpu_mhz"):
        name = roles.get(role)
        if name is not None and name in space.knobs and name in knobs:
            knobs[name] = min(space.knobs[name].values, key=float)
    return Config(knobs=knobs, batch_size=config.batch_size)


def floor_idle_w(device: TwinDevice, config: Config) -> float:
    """Idle power of a configuration's mode at the floor of its clocks (:func:`floor_config`)."""
    floor = floor_config(device, config).model_copy(update={"batch_size": 1})
    return float(device.model.idle([floor]).power_w[0])


def unlocked_idle_w(device: TwinDevice, config: Config) -> float | None:
    """Idle power between batches with the clocks left to the device's own management.

    The floor (:func:`floor_idle_w`), unless the twin carries the card's
    measured awake power (``awake_idle_w``: the H200, left to its own clock
    management, stayed awake between batches milliseconds apart); then None,
    the serving profile's own idle.
    """
    return None if device.model.params.awake_idle_w is not None else floor_idle_w(device, config)


def deployed_reaction(replayer: Replayer, config: Config, delay_s: float) -> Reaction | None:
    """Governors that follow the load ``delay_s`` late: held at the mode's clocks, slow at the floor's.

    Jetson only (devfreq and cpufreq); None elsewhere and for no delay.
    """
    if delay_s <= 0 or replayer.device.space().mode_knob is None:
        return None
    floor = replayer.serving(floor_config(replayer.device, config))
    return Reaction(
        delay_s=delay_s, held_w=replayer.serving(config).idle_w, service_s=floor.service_s, busy_w=floor.busy_w
    )


def replay(
    policy: Policy,
    device: TwinDevice,
    trace: Trace,
    seed: int = 0,
    interval_s: float = DEFAULT_INTERVAL_S,
    rules: GovernorRules | None = None,
    costs: SwitchCosts | None = None,
    reaction_s: float = DEFAULT_REACTION_S,
    clocks: str = "lock",
    progress: Progress | None = None,
) -> ReplayReport:
    """Run the trace through every strategy; the policy must be for this twin's kind.

    ``costs``: what a switch costs (default :class:`SwitchCosts`;
    ``SwitchCosts.free()`` replays switches as free, as before they were
    modelled). ``reaction_s``: how late the default mode's frequency governors
    follow the load (0: at once, the most favourable reading for the default).
    ``clocks``: how static and the governor's bands hold their clocks,
    ``lock`` (min = max, as ``tune apply`` writes them) or ``cap`` (max only,
    governors free, reacting ``reaction_s`` late as the default's do).
    ``progress(strategy, done, total)`` hears how far each strategy is.
    """
    if not getattr(device, "simulated", False) or not isinstance(device, TwinDevice):
        raise ConfigurationError(f"replay runs on a digital twin, not {device.name}: pass --device sim:<kind>")
    check_policy_for(policy, device)
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ConfigurationError("--interval must be a positive number of seconds, e.g. 1")
    steps = float(trace.durations.sum()) / interval_s
    if not steps <= MAX_REPLAY_STEPS:
        raise ConfigurationError(
            f"trace {trace.name} spans {float(trace.durations.sum()):g} s: at --interval {interval_s:g} s that is "
            f"more than {MAX_REPLAY_STEPS} governor steps; shorten the trace or raise --interval"
        )
    replayer = Replayer(device, policy, seed, clocks=clocks, reaction_s=reaction_s, progress=progress)
    peak = float(trace.rates.max())
    static_index = policy.band_for(peak)
    static_index = policy.top if static_index is None else static_index
    static = policy.bands[static_index]
    maxn, maxn_timeout = default_band(device, static)
    results = {
        "default": replayer.fixed(
            "default",
            maxn,
            maxn_timeout,
            trace,
            -1,
            unlocked_idle_w(device, maxn),
            deployed_reaction(replayer, maxn, reaction_s),
        ),
        "default_locked": replayer.fixed("default_locked", maxn, maxn_timeout, trace, -1),
        "static": replayer.fixed(
            "static", static.config(), static.batch_timeout_ms, trace, static_index, *replayer.tuned(static.config())
        ),
        "governor": replayer.governed(trace, interval_s, rules or GovernorRules(), costs),
    }
    return ReplayReport(trace=trace, policy=policy, device=device.name, results=results)
