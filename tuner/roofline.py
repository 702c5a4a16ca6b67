"""Time and energy rooflines fitted from measurements (Pagoda's form), and predictions over a space.

Per layer, a batch of B samples does W = FLOPs x B work and moves
Q = (weights + activations x B) x precision bytes / 4 bytes. Under a power
mode, Pagoda writes the time and energy of that work as

    T = max(W * tau_flop, Q * tau_mop)        E = eps_flop * W + eps_mop * Q + pi0 * T

To predict modes that were never measured, the per-mode parameters are tied to
the knobs by generic physics whose coefficients are fitted, never read from a
device model: tau_flop = alpha / (GPU clock x active TPCs x precision factor),
tau_mop = beta / memory clock, plus a per-layer launch floor kappa / CPU clock
(eager frameworks launch each operator from the host). Energy per FLOP grows
with the square of the voltage, which rises with the clock, so
eps_flop = e0 + e1 (f/f_max)^2; idle power pi0 is a non-negative mix of
constant, GPU, memory and CPU terms. Time parameters come from a least-squares
fit of log time per batch (batch size / throughput), energy coefficients from a
non-negative least-squares fit of energy per batch; latency is predicted as the
measured ratio of the tail latency to the batch time.

Knobs are given physical roles by name (tuner.space.ROLE_NAMES); a role that a device
lacks is a constant that its fitted coefficient absorbs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel

from runners.profile import ModelProfile
from tuner.errors import UserError
from tuner.space import Config, Grid, Mode, SearchSpace, knob_roles

ENERGY_SHARES = (0.25, 0.15, 0.15, 0.15, 0.1, 0.1, 0.05, 0.05)
ENERGY_PRIOR_WEIGHT = 0.3

PRECISION_BYTES = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25}
SMOOTH_SQUARINGS = 3
"""The fit's smooth maximum is the p-norm of the three times with p = 2 ** SMOOTH_SQUARINGS = 8 (powers by squaring)."""
CHUNK = 256
"""Rows per block of the per-layer time arithmetic (see _time)."""
TimeTerms = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]
"""Per-layer compute, memory and launch times at unit coefficients, and the run mask (see _terms)."""


@dataclass
class Features:
    """Per-configuration physical inputs (arrays), decoded from knobs and the space's mode table."""

    gpu: np.ndarray
    tpcs: np.ndarray
    mem: np.ndarray
    cpu: np.ndarray
    cores: np.ndarray
    batch: np.ndarray
    byte_scale: np.ndarray
    power_limit: np.ndarray
    gpu_max: float = 1.0
    mem_max: float = 1.0
    cpu_max: float = 1.0

    def take(self, index: np.ndarray) -> Features:
        arrays = {
            k: getattr(self, k)[index]
            for k in ("gpu", "tpcs", "mem", "cpu", "cores", "batch", "byte_scale", "power_limit")
        }
        return Features(**arrays, gpu_max=self.gpu_max, mem_max=self.mem_max, cpu_max=self.cpu_max)


def features(space: SearchSpace, configs: list[Config] | Grid) -> Features:
    """Decode configurations (already effective) into the roofline's physical inputs.

    A whole space's :class:`~tuner.space.Grid` is decoded from its per-knob
    tables in numpy, without building a Config per point.
    """
    roles = knob_roles(space)
    grid = configs if isinstance(configs, Grid) else None

    def column(role: str, default: float, value: Callable[[Any], float] = float) -> np.ndarray:
        knob = roles.get(role)
        if knob is None:
            return np.full(len(configs), default)
        if grid is not None:
            return grid.column(knob, value)
        return np.array([value(c.knobs[knob]) for c in configs], dtype=float)

    def top(role: str) -> float:
        knob = roles.get(role)
        if knob is None:
            return 1.0
        return max(float(v) for v in space.knobs[knob].values)

    def tpcs(mode: Mode | None) -> float:
        return float(mode.properties.get("tpcs", 1.0)) if mode is not None else 1.0

    if grid is not None:
        tpc = grid.mode_column(tpcs)
        batch = grid.batch_column()
    else:
        tpc = np.array([tpcs(space.mode_of(c)) for c in configs], dtype=float)
        batch = np.array([float(c.batch_size) for c in configs])
    return Features(
        gpu=column("gpu_mhz", 1.0),
        tpcs=tpc,
        mem=column("mem_mhz", 1.0),
        cpu=column("cpu_mhz", 1.0),
        cores=column("cpu_cores", 1.0),
        batch=batch,
        byte_scale=column("precision", 1.0, lambda v: PRECISION_BYTES.get(str(v), 1.0)),
        power_limit=column("power_limit_w", np.inf),
        gpu_max=top("gpu_mhz"),
        mem_max=top("mem_mhz"),
        cpu_max=top("cpu_mhz"),
    )


@dataclass
class LayerTable:
    """A model's per-layer FLOPs and bytes (per sample, fp32), as arrays.

    ``min_batch`` is the smallest batch at which a layer runs at all (eager
    attention's layout copies are views at batch 1): the twin skips such a
    layer below it, so the prior does too. ``distinct`` indexes one layer of
    each kind (equal FLOPs, bytes and ``min_batch``) and ``copies`` counts
    them: a model repeats its blocks (resnet50: 44 kinds in 174 layers,
    bert-base 12 in 236), and the time arithmetic runs once per kind.
    """

    flops: np.ndarray
    weights: np.ndarray
    acts: np.ndarray
    min_batch: np.ndarray
    distinct: np.ndarray = field(init=False, repr=False)
    copies: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Find the kinds of layer and how often each occurs."""
        table = np.stack([self.flops, self.weights, self.acts, self.min_batch], axis=1).astype(float)
        _, self.distinct, counts = np.unique(table, axis=0, return_index=True, return_counts=True)
        self.copies = counts.astype(float)

    @classmethod
    def of(cls, profile: ModelProfile) -> LayerTable:
        return cls(
            flops=np.array([x.flops for x in profile.layers]),
            weights=np.array([x.weight_bytes for x in profile.layers]),
            acts=np.array([x.act_bytes for x in profile.layers]),
            min_batch=np.array([x.min_batch for x in profile.layers]),
        )

    def runs(self, batch: np.ndarray) -> np.ndarray:
        """(configurations x layers) 1.0 where the layer runs at that configuration's batch size, else 0.0."""
        return (batch[:, None] >= self.min_batch[None, :]).astype(float)

    def work(self, f: Features) -> tuple[np.ndarray, np.ndarray]:
        """Total W (FLOPs) and Q (bytes) per batch for each configuration (the layer sums once per batch size)."""
        batches, at = np.unique(f.batch, return_inverse=True)
        runs = self.runs(batches)
        flops, weights, acts = (runs @ self.flops)[at], (runs @ self.weights)[at], (runs @ self.acts)[at]
        w = flops * f.batch
        q = (weights + acts * f.batch) * f.byte_scale
        return w, q


class RooflineParams(BaseModel):
    """Fitted coefficients; ``residual`` is the RMS relative error of time on the fitted points."""

    version: int = 1
    alpha: float
    beta: float
    kappa: float
    energy: list[float]
    latency_ratio: float
    latency_offset_ms: float = 0.0
    points: int
    residual_time: float
    residual_energy: float


@dataclass
class Roofline:
    """A fitted roofline for one model on one device space."""

    layers: LayerTable
    params: RooflineParams
    extra: dict = field(default_factory=dict)

    def time(self, f: Features, chunk: int = CHUNK) -> np.ndarray:
        """Predicted seconds per batch."""
        logp = np.log([self.params.alpha, self.params.beta, self.params.kappa])
        return _time(self.layers, f, logp, chunk, smooth=False)

    def predict(self, f: Features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predicted (time per batch s, energy per query J, tail latency ms) per configuration."""
        t = self.time(f)
        e = _energy_columns(self.layers, f, t) @ np.array(self.params.energy)
        return t, e / f.batch, t * self.params.latency_ratio * 1000 + self.params.latency_offset_ms

    def power(self, f: Features) -> np.ndarray:
        """Predicted average power (W): a configuration over its power limit would be throttled."""
        t = self.time(f)
        return _energy_columns(self.layers, f, t) @ np.array(self.params.energy) / t

    def mode_parameters(self, f: Features) -> list[dict]:
        """Pagoda's per-mode parameters (tau_flop, tau_mop, eps_flop, eps_mop, pi0) for each configuration."""
        p = self.params
        e = p.energy
        x = f.gpu / f.gpu_max
        out = []
        for i in range(len(f.gpu)):
            tau_flop = p.alpha / (f.gpu[i] * f.tpcs[i] * f.byte_scale[i] ** -1)
            tau_mop = p.beta / f.mem[i]
            pi0 = (
                e[3]
                + e[4] * f.tpcs[i] * x[i]
                + e[5] * f.mem[i] / f.mem_max
                + e[6] * f.cores[i]
                + e[7] * f.cores[i] * (f.cpu[i] / f.cpu_max) ** 2
            )
            out.append(
                {
                    "tau_flop_s": tau_flop,
                    "tau_mop_s": tau_mop,
                    "eps_flop_j": e[0] + e[1] * x[i] ** 2,
                    "eps_mop_j": e[2],
                    "pi0_w": pi0,
                    "ridge_flop_per_byte": tau_mop / tau_flop,
                    "launch_floor_s": p.kappa / f.cpu[i],
                }
            )
        return out


def _time(layers: LayerTable, f: Features, logp: np.ndarray, chunk: int = CHUNK, smooth: bool = True) -> np.ndarray:
    """Seconds per batch; the fit uses a smooth maximum (differentiable), predictions the plain one.

    Rows are taken ``chunk`` at a time so that the (rows x layers) arrays stay
    in the cache: the search predicts thousands of candidates per trial, and
    at 4,096 rows a chunk the same arithmetic ran 2.5 times slower.
    """
    out = np.empty(len(f.batch))
    for start in range(0, len(out), chunk):
        s = slice(start, start + chunk)
        out[s] = _combine(_terms(layers, f, s), logp, layers.copies, smooth)
    return out


def _terms(layers: LayerTable, f: Features, rows: slice) -> TimeTerms:
    """Compute, memory and launch times of each distinct layer at unit coefficients, and where layers run.

    Per row: flops x b x bytes / (gpu x tpcs), (weights + acts x b) x bytes /
    mem and 1 / cpu, to be scaled by alpha, beta and kappa (_combine). The
    arithmetic runs once per distinct layer (a model repeats its blocks) and
    the fit, which tries dozens of coefficients on the same rows, computes
    these once. The mask is None when every layer runs at these batch sizes.
    """
    kinds = layers.distinct
    b = f.batch[rows][:, None]
    scale = f.byte_scale[rows][:, None]
    flop = layers.flops[kinds][None, :] * b
    flop *= scale
    flop /= (f.gpu[rows] * f.tpcs[rows])[:, None]
    mop = layers.acts[kinds][None, :] * b
    mop += layers.weights[kinds][None, :]
    mop *= scale
    mop /= f.mem[rows][:, None]
    launch = (1.0 / f.cpu[rows])[:, None]
    batch = f.batch[rows]
    runs = layers.runs(batch)[:, kinds] if layers.min_batch.max(initial=1) > batch.min() else None
    return flop, mop, launch, runs


def _combine(terms: TimeTerms, logp: np.ndarray, copies: np.ndarray, smooth: bool) -> np.ndarray:
    """Seconds per batch of each row from :func:`_terms`: per layer the maximum (or its smooth form), summed.

    The per-row sum weighs each distinct layer by how often it occurs.
    """
    flop, mop, launch, runs = terms
    alpha, beta, kappa = np.exp(logp)
    t_flop = flop * alpha
    t_mop = mop * beta
    t_launch = launch * kappa
    if not smooth:
        peak = np.maximum(t_flop, t_mop, out=t_flop)
        np.maximum(peak, t_launch, out=peak)
    else:
        peak = np.maximum(np.maximum(t_flop, t_mop), t_launch)
        total = _eighth_power(np.divide(t_flop, peak, out=t_flop))
        total += _eighth_power(np.divide(t_mop, peak, out=t_mop))
        total += _eighth_power(t_launch / peak)
        peak *= _eighth_root(total)
    if runs is not None:
        peak *= runs
    return peak @ copies


def _eighth_power(x: np.ndarray) -> np.ndarray:
    """``x ** 8`` in place by squarings (a general power was most of the fit's arithmetic)."""
    for _ in range(SMOOTH_SQUARINGS):
        np.multiply(x, x, out=x)
    return x


def _eighth_root(x: np.ndarray) -> np.ndarray:
    """``x ** (1 / 8)`` in place by square roots."""
    for _ in range(SMOOTH_SQUARINGS):
        np.sqrt(x, out=x)
    return x


def _energy_columns(layers: LayerTable, f: Features, t: np.ndarray) -> np.ndarray:
    """Columns whose non-negative combination is energy per batch (Pagoda's E with mode-dependent terms)."""
    w, q = layers.work(f)
    x = f.gpu / f.gpu_max
    return np.stack(
        [
            w,
            w * x**2,
            q,
            t,
            t * f.tpcs * x,
            t * f.mem / f.mem_max,
            t * f.cores,
            t * f.cores * (f.cpu / f.cpu_max) ** 2,
        ],
        axis=1,
    )


def fit(
    layers: LayerTable,
    f: Features,
    time_s: np.ndarray,
    energy_j: np.ndarray,
    latency_ms: np.ndarray,
    warm: RooflineParams | None = None,
) -> RooflineParams:
    """Fit time, energy and latency coefficients to measured batches (needs at least one point).

    With fewer points than coefficients the fit leans on weak priors taken from
    the first measurement (all time attributed to compute, or to memory; its
    energy split among the terms, see _energy_prior), so a roofline exists from
    the first trial and sharpens as trials arrive.
    """
    from scipy.optimize import least_squares, nnls

    if len(time_s) == 0:
        raise UserError("the roofline needs at least one measurement: run some trials first")
    w, q = layers.work(f)
    t0 = float(time_s[0])
    prior = np.log(
        [
            t0 * f.gpu[0] * f.tpcs[0] / (w[0] * f.byte_scale[0]),
            t0 * f.mem[0] / q[0],
            0.3 * t0 * f.cpu[0] / len(layers.flops),
        ]
    )
    weight = 0.3 / np.sqrt(len(time_s))

    terms = _terms(layers, f, slice(None))

    def residual(logp: np.ndarray) -> np.ndarray:
        pred = _combine(terms, logp, layers.copies, smooth=True)
        return np.concatenate([np.log(pred) - np.log(time_s), weight * (logp - prior)])

    best = None
    starts = [prior + np.array(s) for s in ([0.0, 0.0, 0.0], [0.0, -1.5, -1.0], [-1.5, 0.0, -1.0], [-1.0, -1.0, 0.5])]
    if warm is not None:
        starts = [np.log([warm.alpha, warm.beta, warm.kappa])]
    for start in starts:
        result = least_squares(residual, start, method="trf", x_scale=1.0, max_nfev=200)
        if best is None or result.cost < best.cost:
            best = result
    logp = best.x
    t_fit = _time(layers, f, logp)
    cols = _energy_columns(layers, f, time_s)
    scale = np.maximum(np.abs(cols).max(axis=0), 1e-30)
    a = cols / scale / energy_j[:, None]
    ridge, target = _energy_prior(a[0], len(energy_j))
    coef, _ = nnls(np.vstack([a, ridge]), np.concatenate([np.ones(len(energy_j)), target]))
    coef = coef / scale
    e_fit = _energy_columns(layers, f, t_fit) @ coef
    ratio, offset = _latency_line(time_s * 1000, latency_ms)
    return RooflineParams(
        alpha=float(np.exp(logp[0])),
        beta=float(np.exp(logp[1])),
        kappa=float(np.exp(logp[2])),
        energy=[float(c) for c in coef],
        latency_ratio=ratio,
        latency_offset_ms=offset,
        points=len(time_s),
        residual_time=float(np.sqrt(np.mean((t_fit / time_s - 1) ** 2))),
        residual_energy=float(np.sqrt(np.mean((e_fit / energy_j - 1) ** 2))),
    )


def _energy_prior(first: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows that pull the energy coefficients toward a split of the first measurement's energy.

    Eight non-negative coefficients from the three trials a search has when
    it first proposes are not determined: a ridge toward zero let the fit put
    the energy on whichever terms fit three points, and on the Orin Nano twin
    the search's model was 24% off near the optimum at trials 4-8. This prior
    divides the first measurement's energy among the terms by ENERGY_SHARES,
    a guess of the usual split (compute, its clock-squared part, memory
    traffic, and idle power fixed and by GPU, memory and CPU), with a relative
    weight of 0.3/sqrt(points) like the time fit's, falling as trials arrive.
    A term absent at the first point (a zero column) keeps a weak ridge
    toward zero. Judged in docs/search.md.
    """
    shares = np.array(ENERGY_SHARES)
    prior = np.where(first > 0, shares / np.maximum(first, 1e-30), 0.0)
    strength = ENERGY_PRIOR_WEIGHT / np.sqrt(points)
    rows = np.where(prior > 0, strength / np.maximum(prior, 1e-30), 1e-3)
    return np.diag(rows), np.where(prior > 0, strength, 0.0)


def _latency_line(time_ms: np.ndarray, latency_ms: np.ndarray) -> tuple[float, float]:
    """Tail latency against batch time: slope and a non-negative offset (jitter), or a ratio with too few points."""
    from scipy.optimize import nnls

    if len(time_ms) >= 3 and np.ptp(time_ms) > 0.2 * time_ms.mean():
        a = np.stack([time_ms, np.ones_like(time_ms)], axis=1) / latency_ms[:, None]
        (slope, offset), _ = nnls(a, np.ones(len(time_ms)))
        if slope > 0:
            return float(slope), float(offset)
    return float(np.median(latency_ms / time_ms)), 0.0


def fit_measurements(
    profile: ModelProfile,
    space: SearchSpace,
    configs: list[Config],
    metrics: list[dict],
    percentile: str = "p99",
    warm: RooflineParams | None = None,
) -> Roofline:
    """Fit from measured configurations and their metrics (j_per_query, qps, latency), e.g. study trials.

    Windows the device reported as throttled ran below their set clocks, so
    they are left out of the fit while unthrottled ones remain. ``warm``
    (the previous fit of a search that adds one trial at a time) starts the
    time fit from its coefficients instead of four spread starts.
    """
    calm = [i for i, m in enumerate(metrics) if not m.get("throttled")]
    if calm and len(calm) < len(metrics):
        configs = [configs[i] for i in calm]
        metrics = [metrics[i] for i in calm]
    layers = LayerTable.of(profile)
    f = features(space, configs)
    batch = f.batch
    qps = np.array([m["qps"] for m in metrics], dtype=float)
    time_s = batch / qps
    energy = np.array([m["j_per_query"] for m in metrics], dtype=float) * batch
    latency = np.array([m[f"{percentile}_ms"] for m in metrics], dtype=float)
    return Roofline(layers=layers, params=fit(layers, f, time_s, energy, latency, warm))


def layer_intensity(profile: ModelProfile, batch: int, byte_scale: float = 1.0) -> np.ndarray:
    """Arithmetic intensity (FLOP per byte) of every layer at a batch size."""
    layers = LayerTable.of(profile)
    q = (layers.weights + layers.acts * batch) * byte_scale
    return layers.flops * batch / np.maximum(q, 1e-30)


def intensity_summary(profile: ModelProfile, batch: int, byte_scale: float = 1.0) -> dict[str, float]:
    """Arithmetic intensity of the whole graph, and the median of its matmul and of its element-wise layers.

    A plain median over layers is misleading: most layers of a CNN are
    element-wise (batch norm, ReLU, add) at 1 FLOP per 8 bytes = 0.125
    FLOP/B, while almost all FLOPs are in convolutions and matmuls.
    """
    layers = LayerTable.of(profile)
    intensity = layer_intensity(profile, batch, byte_scale)
    matmul = np.array([x.matmul for x in profile.layers])
    total = layers.flops.sum() * batch / ((layers.weights.sum() + layers.acts.sum() * batch) * byte_scale)
    return {
        "graph_flop_per_byte": float(total),
        "median_matmul_flop_per_byte": float(np.median(intensity[matmul])) if matmul.any() else 0.0,
        "median_elementwise_flop_per_byte": float(np.median(intensity[~matmul])) if (~matmul).any() else 0.0,
        "median_intensity": float(np.median(intensity)),
    }
