"""One trial: suggest a configuration, reduce it to what the hardware runs, reuse or measure it.

Energy per query is the objective; the latency bound is an Optuna constraint
(<= 0 is feasible). A trial's verdict is final when it completes, so Optuna's
own best trial is the study's answer (tuner.records):

- a window that misses the bound, or costs more than the best so far, stays
  one window: its value and latency are that window's;
- a window that meets the bound and costs no more than the best so far is
  confirmed in the same trial by up to ``CONFIRM_WINDOWS`` more windows (an
  LLM's by ``LLM_CONFIRM_WINDOWS``); the
  trial then carries their mean, and its constraint adds a noise margin, so
  it is feasible only if a fresh window would also meet the bound with about
  95% probability. A single lucky window therefore never holds the best value.
  With ``confirm_within`` (a strategy's setting) only a close call is
  confirmed: a first window within that share of the best, or one whose
  latency is near its bound. A clear win (or the first feasible window) stays
  one window, its constraint with the same noise margin for one window: it is
  soon beaten while a search is far from its answer, and the final
  contenders, close to each other, are the ones confirmed.
  Confirming stops as soon as its answer is known (:func:`settled`): the
  windows agree and their mean is as precise as the study asks (or as the
  first window could get within the longest window), or their mean already
  costs more than the best.

A window also ends as soon as its verdict cannot change (tuner.measure.stopping):
its tail is proven past the bound, or its energy per query is above the best
feasible trial's by more than its interval. Such a trial is still a COMPLETE
trial with its measured value and latency constraint, never a pruned one:
the constrained samplers keep learning from it (most samplers ignore pruned
trials), its ``cut`` and ``verdict`` attributes say what happened, and it can
never be the best trial (its constraint is violated, or its value is above a
best that only falls). Each window's energy per query is reported as an
intermediate value, so optuna-dashboard plots it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import zlib
from typing import Any

import optuna

from runners.llm_spec import is_llm
from tuner.confirm import engine_rates, half_width, pooled, rel_std, settled
from tuner.devices.base import Device, switch_seconds_of
from tuner.errors import NeedsReboot
from tuner.llm import STOP_RESOLUTION
from tuner.measure.stopping import STOP_COSTLIER, STOP_TAIL
from tuner.measurement import METRIC_KEYS, TOKEN_KEYS, Measurement
from tuner.models import model_slug
from tuner.plumbing import interrupts
from tuner.records import recommended
from tuner.run_options import RunOptions
from tuner.scenario import label, split
from tuner.space import Config, SearchSpace
from tuner.storage import named_constraints, set_constraint, set_user_attrs

CONFIRM_WINDOWS = 2
LLM_CONFIRM_WINDOWS = 1
"""At most this many more windows confirm a first window which would become the best, in the same trial."""
CONFIRM_CI_CAP = 0.5
# What a measurement leaves on its trial besides the metrics; a reuse copies exactly these and the metrics.
ORIGIN_KEYS = ("meter", "rails", "twin", "throttled", "temps_c", "extra")
NOISE_Z = 1.645
NOISE_FLOOR = 0.01
# A clear win whose latency is within this many one-window noise margins of its bound is confirmed all the same: its
# feasibility, not its energy, is the close call (on twins, one window there put 10-40% of fresh windows over).
LATENCY_CLOSE = 2.0
# Where a trial's seconds went (user attributes, trials.csv, the run summary):
# setup (apply, model load and preparation, warm-up), windows, and search: the
# rest since the previous trial ended (the sampler, storage writes, progress).
TIME_KEYS = ("setup_s", "windows_s", "search_s")
SETUP_EXTRAS = ("runner_load_s", "runner_prepare_s", "warmup_s")


class MeasurementRejected(Exception):
    """A trial whose number must not be trusted (invalid window, throttling, failed apply)."""


def trial_seed(seed: int | None, number: int) -> int | None:
    """Per-trial measurement seed: reproducible runs, but a fresh noise draw per trial."""
    if seed is None:
        return None
    return zlib.crc32(f"{seed}:{number}".encode())


def measurement_attrs(m: Measurement) -> dict[str, Any]:
    """The user attributes a trial carries for one measurement (empty temperatures and extras left off)."""
    attrs: dict[str, Any] = {key: getattr(m, key) for key in (*METRIC_KEYS, *ORIGIN_KEYS)}
    if m.tokens is not None:
        attrs.update({key: getattr(m.tokens, key) for key in TOKEN_KEYS})
    return {key: value for key, value in attrs.items() if value or key not in ("temps_c", "extra")}


def record_measurement(trial: optuna.Trial, m: Measurement, **more: Any) -> None:
    set_user_attrs(trial, {**measurement_attrs(m), **more})


class Objective:
    """The function Optuna calls per trial; also counts how many trials really measured."""

    def __init__(
        self,
        device: Device,
        space: SearchSpace,
        options: RunOptions,
        study: optuna.Study,
        confirm_within: float | None = None,
    ) -> None:
        self.device = device
        self.confirm_within = confirm_within
        self.space = space
        self.options = options
        self.worker = options.worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.measured = 0
        self.seconds = dict.fromkeys(TIME_KEYS, 0.0)
        self._clock = dict.fromkeys(TIME_KEYS, 0.0)
        self._last_end = time.monotonic()
        self.cache: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            key = t.user_attrs.get("effective_key")
            if key is not None and "j_per_query" in t.user_attrs:
                self.cache.setdefault(key, t.number)
        self.study = study

    def __call__(self, trial: optuna.Trial) -> float:
        self._clock = dict.fromkeys(TIME_KEYS, 0.0)
        try:
            return self._trial(trial)
        finally:
            ended = time.monotonic()
            spent = self._clock["setup_s"] + self._clock["windows_s"]
            self._clock["search_s"] = max(ended - self._last_end - spent, 0.0)
            self._last_end = ended
            for key, value in self._clock.items():
                self.seconds[key] += value
            try:
                set_user_attrs(trial, {key: round(value, 3) for key, value in self._clock.items()})
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # a trial a fleet's heartbeat already failed takes no attributes (tuner.study._optimize)

    def _trial(self, trial: optuna.Trial) -> float:
        config = self.space.suggest(trial)
        effective = self.space.effective(config)
        key = json.dumps(effective.key())
        # Written before measuring, so peers and tune status see who runs what while it runs.
        identity = {
            "config": config.knobs,
            "batch_size": config.batch_size,
            "effective": effective.knobs,
            "effective_key": key,
            "device": self.device.name,
            "device_kind": self.device.kind,
            "host": socket.gethostname(),
            "worker": self.worker,
            "latency_key": f"{self.options.window.percentile}_ms",
        }
        set_user_attrs(trial, identity)
        repeat_of = trial.user_attrs.get("repeat_of")
        if key in self.cache and repeat_of is None:
            return self._reuse(trial, self.cache[key])
        applying = time.monotonic()
        self._apply(trial, effective)
        self._clock["setup_s"] += time.monotonic() - applying
        best = recommended(self.study) if repeat_of is None else None
        windows = [self._window(trial, effective, 0, None if best is None else float(best.value))]
        note, margin = "", False
        first = windows[0]
        if first.extra.get("cut") == STOP_COSTLIER and best is not None and first.objective <= float(best.value):
            # Judged costlier on the blocks so far, its whole window came out at or below the best: not costlier
            # after all (a cut trial must never hold the best value), so it contends as any other window.
            first = windows[0] = first.model_copy(
                update={"extra": {k: v for k, v in first.extra.items() if k != "cut"}}
            )
        if repeat_of is None and not first.extra.get("cut"):
            if self._meets(first):
                if self._clear_win(first, best, key):
                    margin = True
                    note = "a clear win: one window (only close calls are confirmed)"
                elif best is None or first.objective <= float(best.value):
                    # The precision the study asks, or what the first window reached within the longest window.
                    ci, extra = self._confirm_ci()
                    target = max(ci, half_width(first, ci))
                    aims = [ci]
                    for k in range(1, extra + 1):
                        aims.append(min(target * math.sqrt(1 + extra), CONFIRM_CI_CAP))
                        windows.append(self._window(trial, effective, k, None, aims[-1]))
                        if windows[-1].extra.get("cut"):
                            break
                        outcome = settled(windows, aims, target, None if best is None else float(best.value))
                        if outcome:
                            trial.set_user_attr("confirmation", outcome)
                            break
                else:
                    note = f"costs more than trial {best.number}, the best so far: not confirmed"
        self.measured += 1
        self.cache.setdefault(key, trial.number)
        cut = [w for w in windows if w.extra.get("cut")]
        if cut:
            return self._cut_verdict(trial, cut[0], best)
        earlier = self._windows_of(key) if repeat_of is not None else []
        return self._verdict(trial, key, windows, earlier, note, margin)

    def _confirm_ci(self) -> tuple[float, int]:
        """The precision a contender is confirmed to and the most windows that adds: ``--ci`` and
        :data:`CONFIRM_WINDOWS`; an LLM's at least its stop resolution, with one window.

        An LLM study stops on a plateau :data:`tuner.llm.STOP_RESOLUTION` wide, so a contender confirmed finer
        than that spends windows (a Server window is hundreds of generated answers) on a difference the study
        does not act on; one repeat judges the first window against the next, which is all a token window's
        noise can be read from (it reports no interval of its own).
        """
        ci = self.options.window.ci
        if is_llm(self.options.model):
            return max(ci, STOP_RESOLUTION), LLM_CONFIRM_WINDOWS
        return ci, CONFIRM_WINDOWS

    def _apply(self, trial: optuna.Trial, effective: Config) -> None:
        """Put the device in the configuration; its switch time goes on the trial (``switch_s``).

        A configuration the device takes only after a reboot fails the trial
        (never rebooted, the device as it was) and the study goes on; the
        trial names the mode (``needs_reboot``) so a strategy can leave it out.
        """
        hardware, _ = split(effective)
        try:
            interrupts.check()
            self.device.apply(hardware)
        except MeasurementRejected as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        except NeedsReboot as exc:
            mode = self.space.mode_knob
            set_user_attrs(
                trial,
                {
                    "fail_reason": str(exc),
                    "verdict": f"skipped: {exc}",
                    "needs_reboot": str(effective.knobs.get(mode, "")) if mode else "",
                },
            )
            raise MeasurementRejected(str(exc)) from None
        switch = switch_seconds_of(self.device)
        if switch is not None:
            trial.set_user_attr("switch_s", round(switch, 4))

    def _window(
        self, trial: optuna.Trial, effective: Config, k: int, best: float | None, ci: float | None = None
    ) -> Measurement:
        """Window ``k`` of this trial (the configuration is applied): its own noise seed and log folder.

        Every window may end once its tail is proven past the study's bound;
        a first window also once it costs more than ``best`` (the best
        feasible energy per query so far) beyond its interval. ``ci``: the
        interval a confirming window aims at.
        """
        seed = trial_seed(self.options.seed, trial.number)
        update: dict = {
            "seed": None if seed is None else seed + k,
            "bound_ms": self.options.max_latency_ms if math.isfinite(self.options.max_latency_ms) else None,
            "cut_j_per_query": best,
        }
        if not self.device.simulated:
            folder = self.options.out / self.device.slug / model_slug(self.options.model) / "loadgen"
            if self.options.window.scenario != "offline":
                folder = folder / label(self.options.window).replace("@", "-")
            folder = folder / (f"trial-{trial.number:04d}" + (f"-window{k + 1}" if k else ""))
            update["log_dir"] = str(folder)
            if k == 0:
                trial.set_user_attr("loadgen_logs", str(folder))
        hardware, serving = split(effective)
        settings = self.options.window
        if ci is not None:
            update["ci"] = ci
        settings = settings.model_copy(update={**update, "options": {**settings.options, **serving}})
        called = time.monotonic()
        try:
            interrupts.check()
            measurement = self.device.measure(self.options.model, hardware, settings)
            interrupts.check()
        except MeasurementRejected as exc:
            trial.set_user_attr("fail_reason", str(exc))
            raise
        finally:
            self._clock["windows_s"] += time.monotonic() - called
        if measurement.valid:
            setup = sum(float(measurement.extra.get(key, 0.0)) for key in SETUP_EXTRAS)
            self._clock["setup_s"] += setup
            self._clock["windows_s"] -= setup
            if math.isfinite(measurement.objective):
                trial.report(measurement.objective, k)
        if not measurement.valid:
            record_measurement(trial, measurement, fail_reason=measurement.reason or "measurement not trustworthy")
            raise MeasurementRejected(measurement.reason)
        return measurement

    def _clear_win(self, first: Measurement, best: optuna.trial.FrozenTrial | None, key: str) -> bool:
        """Whether a first window that meets the bound stays unconfirmed: lazy confirmation is on and it is no close
        call, in energy (no best yet, or below the best by more than ``confirm_within``) nor in latency (every
        bounded latency clears its bound by more than ``LATENCY_CLOSE`` x one window's noise margin)."""
        if self.confirm_within is None:
            return False
        if best is not None and first.objective >= float(best.value) * (1.0 - self.confirm_within):
            return False
        figures = first.figures()
        for attr, bound in self.options.bounds().values():
            spread = max(self._pooled_spread(attr, key, [figures[attr]]), NOISE_FLOOR)
            if figures[attr] * (1 + LATENCY_CLOSE * NOISE_Z * spread * math.sqrt(2)) > bound:
                return False
        return True

    def _meets(self, m: Measurement) -> bool:
        """Whether one window meets every bound of the study (the query latency's, and TTFT's and TPOT's)."""
        figures = m.figures()
        return all(figures.get(attr, math.inf) <= bound for attr, bound in self.options.bounds().values())

    def _windows_of(self, key: str) -> list[dict[str, float]]:
        """Every window measured so far of one configuration (its trials' own windows, not reuses)."""
        return [
            w
            for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("effective_key") == key and "reused_from" not in t.user_attrs
            for w in t.user_attrs.get("windows", [])
        ]

    def _verdict(
        self, trial: optuna.Trial, key: str, new: list[Measurement], earlier: list[dict], note: str, margin: bool
    ) -> float:
        """Record the trial's windows and settle its value and constraint for good.

        One window: its own energy and latency (``margin``: a clear win, with
        the noise margin of one window). Several (a confirmation, or a
        requested re-measurement with the configuration's earlier windows):
        their pooled figures (:func:`pooled`), and a constraint raised by z x
        the latency's relative spread (for one future window and the error of
        the mean).
        """
        own = [m.figures() for m in new]
        windows = earlier + own
        bounds = self.options.bounds()
        if len(windows) == 1 and not margin:
            record_measurement(trial, new[0], windows=own, measurements=1)
            for name, (attr, bound) in bounds.items():
                set_constraint(trial, name, own[0][attr] - bound)
            trial.set_user_attr("verdict", verdict_text(own[0], bounds, 1, {}, note))
            return new[0].objective
        mean = pooled(windows)
        margins: dict[str, float] = {}
        for name, (attr, _bound) in bounds.items():
            values = [w[attr] for w in windows]
            spread = max(self._pooled_spread(attr, key, values), NOISE_FLOOR)
            margins[name] = NOISE_Z * spread * math.sqrt(1 + 1 / len(values))
        extra = {**new[-1].extra, **engine_rates(new, mean["qps"])}
        more = {f"{name}_margin": margin for name, margin in margins.items() if name != "latency"}
        record_measurement(
            trial,
            new[-1],
            **mean,
            **more,
            extra=extra,
            windows=own,
            measurements=len(windows),
            latency_margin=margins.get("latency", 0.0),
        )
        for name, (attr, bound) in bounds.items():
            set_constraint(trial, name, mean[attr] * (1 + margins[name]) - bound)
        trial.set_user_attr("verdict", verdict_text(mean, bounds, len(windows), margins, note))
        return mean["j_per_token"] if "j_per_token" in mean else mean["j_per_query"]

    def _cut_verdict(self, trial: optuna.Trial, m: Measurement, best: optuna.trial.FrozenTrial | None) -> float:
        """A window cut once its verdict was known: its own figures, and a constraint that says that verdict.

        A tail proven past the bound is infeasible whatever the partial
        window's percentile reads; a costlier window keeps its measured
        latency (it may well meet the bound) and its value, above the best.
        """
        if m.tokens is not None:
            return self._token_cut_verdict(trial, m)
        percentile = self.options.window.percentile
        bound = self.options.max_latency_ms
        latency = m.latency_ms(percentile)
        reason = str(m.extra["cut"])
        seconds = f"after {m.duration_s:.2g} s"
        if reason == STOP_TAIL:
            over = m.extra.get("tail_over_queries")
            constraint = max(latency - bound, math.ulp(bound))
            proof = f", {int(over)} queries past it" if over is not None else ""
            line = f"misses the bound: {percentile} proven over {bound:g} ms, cut {seconds}{proof}"
        else:
            constraint = latency - bound
            verb = "meets" if latency <= bound else "misses"
            whom = f"trial {best.number}, the best so far" if best is not None else "the best so far"
            line = (
                f"{verb} the bound: {latency:.4g} ms vs {bound:g} ms; costs more than {whom} "
                f"beyond its interval: cut {seconds}"
            )
        own = [m.figures()]
        record_measurement(trial, m, windows=own, measurements=1, cut=reason)
        set_constraint(trial, "latency", constraint)
        trial.set_user_attr("verdict", line)
        return m.objective

    def _token_cut_verdict(self, trial: optuna.Trial, m: Measurement) -> float:
        """An LLM window cut once its TTFT or TPOT tail was proven past its bound: infeasible on that bound.

        Its other bounds keep the figures measured up to the cut; the value is
        the energy per output token of the tokens completed by then.
        """
        figures, bounds = m.figures(), self.options.bounds()
        proven = str(m.extra.get("cut_bound", ""))
        for name, (attr, bound) in bounds.items():
            value = figures[attr] - bound
            set_constraint(trial, name, max(value, math.ulp(bound)) if name == proven else value)
        over = m.extra.get("tail_over_queries")
        past = f", {int(over)} queries past it" if over is not None else ""
        bound = bounds[proven][1] if proven in bounds else math.nan
        line = (
            f"misses the bounds: {proven} {self.options.window.percentile} proven over {bound:g} ms, "
            f"cut after {m.duration_s:.2g} s{past}"
        )
        record_measurement(trial, m, windows=[m.figures()], measurements=1, cut=str(m.extra["cut"]))
        trial.set_user_attr("verdict", line)
        return m.objective

    def _pooled_spread(self, lat_key: str, key: str, lats: list[float]) -> float:
        """Relative spread of the latency, pooled over every configuration measured more than once.

        Three windows of one configuration say little about the noise; the
        noise of one device and model is much the same across configurations.
        """
        groups: dict[str, list[float]] = {key: lats}
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            other = t.user_attrs.get("effective_key")
            if other != key and "reused_from" not in t.user_attrs:
                groups.setdefault(other, []).extend(float(w[lat_key]) for w in t.user_attrs.get("windows", []))
        squares, dof = 0.0, 0
        for values in groups.values():
            if len(values) >= 2:
                squares += rel_std(values) ** 2 * (len(values) - 1)
                dof += len(values) - 1
        return math.sqrt(squares / dof) if dof else 0.0

    def _reuse(self, trial: optuna.Trial, source: int) -> float:
        """Copy an earlier trial's measurement of the same effective configuration."""
        earlier = self.study.get_trials(deepcopy=False)[source]
        kept = (*METRIC_KEYS, *TOKEN_KEYS, *ORIGIN_KEYS, "verdict", "cut")
        copied = {k: v for k, v in earlier.user_attrs.items() if k in kept}
        set_user_attrs(trial, {**copied, "reused_from": source})
        for key, value in named_constraints(earlier.system_attrs).items():
            set_constraint(trial, key, value)
        return float(earlier.value)


def verdict_text(
    figures: dict[str, float], bounds: dict[str, tuple[str, float]], windows: int, margins: dict[str, float], note: str
) -> str:
    """The trial's verdict on every bound of its study, in a line; a query-latency study's reads as it always did."""
    if list(bounds) == ["latency"]:
        attr, bound = bounds["latency"]
        return _verdict_line(figures[attr], bound, windows, margins.get("latency", 0.0), note)
    parts, meets = [], True
    for name, (attr, bound) in bounds.items():
        margin = margins.get(name, 0.0)
        judged = figures[attr] * (1 + margin)
        meets = meets and judged <= bound
        noise = f" + {margin:.1%} noise margin" if margin else ""
        parts.append(f"{name} {attr.split('_')[-2]} {figures[attr]:.4g} ms{noise} vs {bound:g} ms")
    seen = "one window" if windows == 1 else f"mean of {windows} windows"
    line = f"{'meets' if meets else 'misses'} the bounds ({seen}): {', '.join(parts)}"
    return f"{line}; {note}" if note else line


def _verdict_line(latency: float, bound: float, windows: int, margin: float, note: str) -> str:
    """The trial's feasibility and why, in a line (a user attribute, shown in optuna-dashboard)."""
    seen = "one window" if windows == 1 else f"mean of {windows} windows"
    if margin:
        judged = latency * (1 + margin)
        verb = "meets" if judged <= bound else "misses"
        line = f"{verb} the bound: {latency:.4g} ms ({seen}) + {margin:.1%} noise margin vs {bound:g} ms"
        return f"{line}; {note}" if note else line
    verb = "meets" if latency <= bound else "misses"
    line = f"{verb} the bound: {latency:.4g} ms ({seen}) vs {bound:g} ms"
    return f"{line}; {note}" if note else line
