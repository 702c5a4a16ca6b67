"""A small Gaussian-process regression learned from the trials: the data-driven model of the search.

Why our own and not Optuna's GP: the strategy needs predictions (mean and
spread) over every configuration of the space at once, an explicit prior
mean (a linear model whose inputs may include the roofline's prediction), and
it must run on the core install without PyTorch. With at most a few dozen
trials an exact GP is cheap: an n x n Cholesky factor and a vectorised kernel
over the grid.

Inputs are every tuned knob of the space whatever its name (ordered knobs by
their index scaled to [0, 1], unordered ones one-hot) and the batch size (by
its index). The kernel is a squared exponential with one length scale per
input (ARD), its hyperparameters set by maximising the marginal likelihood
(analytic gradient, L-BFGS-B). Targets are logarithms (energy per query,
tail latency), so errors are relative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.space import Config, Grid, SearchSpace

NOISE_FLOOR = 0.005**2
RIDGE = 0.05
LOG_SCALE_PRIOR = (np.log(0.6), 1.2)


def encode(space: SearchSpace, configs: list[Config]) -> tuple[np.ndarray, list[str]]:
    """Configurations as rows of numbers in [0, 1] (every tuned knob, then the batch size), and column names."""
    columns: list[str] = []
    blocks: list[np.ndarray] = []
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        lookup = {str(v): i for i, v in enumerate(knob.values)}
        idx = np.array([lookup.get(str(c.knobs[name]), 0) for c in configs], dtype=float)
        if knob.ordered:
            blocks.append((idx / max(len(knob.values) - 1, 1))[:, None])
            columns.append(name)
        else:
            onehot = np.zeros((len(configs), len(knob.values)))
            onehot[np.arange(len(configs)), idx.astype(int)] = 1.0
            blocks.append(onehot)
            columns += [f"{name}={v}" for v in knob.values]
    if len(space.batch_sizes) > 1:
        lookup_b = {b: i for i, b in enumerate(space.batch_sizes)}
        idx = np.array([lookup_b.get(c.batch_size, 0) for c in configs], dtype=float)
        blocks.append((idx / (len(space.batch_sizes) - 1))[:, None])
        columns.append("batch_size")
    if not blocks:
        return np.zeros((len(configs), 0)), columns
    return np.hstack(blocks), columns


def encode_grid(space: SearchSpace, grid: Grid) -> np.ndarray:
    """:func:`encode` of every configuration of the space's grid, built from its per-knob tables.

    The same rows as ``encode(space, space.grid())`` without making a Config
    per point (47,516 on Orin AGX): each column comes from Grid.column.
    """
    blocks: list[np.ndarray] = []
    for name in space.tuned_knobs:
        knob = space.knobs[name]
        lookup = {str(v): i for i, v in enumerate(knob.values)}
        idx = grid.column(name, lambda v, lookup=lookup: lookup.get(str(v), 0))
        if knob.ordered:
            blocks.append((idx / max(len(knob.values) - 1, 1))[:, None])
        else:
            onehot = np.zeros((len(idx), len(knob.values)))
            onehot[np.arange(len(idx)), idx.astype(int)] = 1.0
            blocks.append(onehot)
    if len(space.batch_sizes) > 1:
        steps = np.arange(len(grid.batch_sizes), dtype=float) / (len(space.batch_sizes) - 1)
        blocks.append(np.repeat(steps, grid.per_batch)[:, None])
    if not blocks:
        return np.zeros((len(grid), 0))
    return np.hstack(blocks)


@dataclass
class GaussianProcess:
    """Exact GP regression with a linear prior mean on chosen basis columns."""

    log_scales: np.ndarray
    log_signal: float
    log_noise: float
    x: np.ndarray
    basis: np.ndarray
    beta: np.ndarray
    chol: np.ndarray
    alpha: np.ndarray

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        basis: np.ndarray,
        warm: GaussianProcess | None = None,
        optimize: bool = True,
    ) -> GaussianProcess:
        """Fit the prior mean (ridge least squares on ``basis``) and then the GP on its residuals.

        With ``optimize=False`` the hyperparameters of ``warm`` are kept and
        only the data change (a refit between hyperparameter searches).
        """
        from scipy.linalg import cho_solve
        from scipy.optimize import minimize

        p = basis.shape[1]
        ridge = RIDGE * np.eye(p)
        ridge[0, 0] = 0.0
        beta = np.linalg.solve(basis.T @ basis + ridge + 1e-12 * np.eye(p), basis.T @ y)
        r = y - basis @ beta
        d = x.shape[1]
        if warm is not None and len(warm.log_scales) == d:
            start = np.concatenate([warm.log_scales, [warm.log_signal, warm.log_noise]])
        else:
            var = max(float(np.var(r)), 1e-4)
            start = np.concatenate([np.full(d, np.log(0.6)), [np.log(var), np.log(max(var * 0.01, NOISE_FLOOR))]])
        bounds = [(np.log(0.05), np.log(20.0))] * d + [(np.log(1e-5), np.log(10.0)), (np.log(NOISE_FLOOR), np.log(0.1))]
        if optimize or warm is None:
            result = minimize(
                _neg_log_evidence,
                start,
                args=(x, r, _squared_differences(x)),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": 40},
            )
            theta = result.x if np.all(np.isfinite(result.x)) else start
        else:
            theta = np.clip(start, [b[0] for b in bounds], [b[1] for b in bounds])
        k = _kernel(x, x, theta[:d], theta[d]) + np.exp(theta[d + 1]) * np.eye(len(x))
        chol = np.linalg.cholesky(k + 1e-9 * np.eye(len(x)))
        alpha = cho_solve((chol, True), r, check_finite=False)
        return cls(theta[:d], float(theta[d]), float(theta[d + 1]), x, basis, beta, chol, alpha)

    def predict(
        self, x: np.ndarray, basis: np.ndarray, chunk: int = 8192, latent: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of a new observation (model spread plus measurement noise).

        ``latent``: the spread of the true value alone, without a window's noise.
        """
        from scipy.linalg import solve_triangular

        mean = np.empty(len(x))
        std = np.empty(len(x))
        signal = np.exp(self.log_signal)
        noise = 0.0 if latent else np.exp(self.log_noise)
        for start in range(0, len(x), chunk):
            s = slice(start, start + chunk)
            ks = _kernel(x[s], self.x, self.log_scales, self.log_signal)
            mean[s] = basis[s] @ self.beta + ks @ self.alpha
            v = solve_triangular(self.chol, ks.T, lower=True, check_finite=False)
            std[s] = np.sqrt(np.maximum(signal - (v * v).sum(axis=0), 1e-10) + noise)
        return mean, std

    @property
    def noise(self) -> float:
        """Fitted measurement noise (standard deviation, log units: relative)."""
        return float(np.sqrt(np.exp(self.log_noise)))


def _kernel(a: np.ndarray, b: np.ndarray, log_scales: np.ndarray, log_signal: float) -> np.ndarray:
    """Squared-exponential kernel between the rows of ``a`` and ``b``, in place on one array (thousands of rows)."""
    scaled_a = a / np.exp(log_scales)
    scaled_b = b / np.exp(log_scales)
    sq = (scaled_a**2).sum(1)[:, None] + (scaled_b**2).sum(1)[None, :]
    sq -= 2 * scaled_a @ scaled_b.T
    np.maximum(sq, 0.0, out=sq)
    sq *= -0.5
    np.exp(sq, out=sq)
    sq *= np.exp(log_signal)
    return sq


def _squared_differences(x: np.ndarray) -> np.ndarray:
    """(columns x n x n) squared differences of the inputs per column, the same for every step of a fit."""
    return (x.T[:, :, None] - x.T[:, None, :]) ** 2


def _neg_log_evidence(theta: np.ndarray, x: np.ndarray, r: np.ndarray, squared: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log marginal likelihood plus a weak prior on the length scales, with its gradient.

    ``squared`` is :func:`_squared_differences` of ``x``, computed once per fit:
    the kernel and the length-scale gradients are each one product with it.
    The solution and the inverse come from the Cholesky factor (LAPACK's
    potrs and potri). This runs a few hundred times a proposal.
    """
    from scipy.linalg.lapack import dpotrf, dpotri, dpotrs

    d = x.shape[1]
    n = len(r)
    flat = squared.reshape(d, -1)
    k_signal = (np.exp(theta[d]) * np.exp(-0.5 * (np.exp(-2 * theta[:d]) @ flat))).reshape(n, n)
    noise = np.exp(theta[d + 1])
    chol, info = dpotrf(k_signal + (noise + 1e-9) * np.eye(n), lower=1, clean=1)
    if info != 0:
        return 1e10, np.zeros_like(theta)
    alpha, _ = dpotrs(chol, r, lower=1)
    lower, _ = dpotri(chol, lower=1)
    k_inv = np.tril(lower) + np.tril(lower, -1).T
    value = 0.5 * r @ alpha + np.log(np.diag(chol)).sum() + 0.5 * n * np.log(2 * np.pi)
    weighted = (np.outer(alpha, alpha) - k_inv) * k_signal
    grad = np.empty_like(theta)
    grad[:d] = -0.5 * (flat @ weighted.reshape(-1)) / np.exp(2 * theta[:d])
    grad[d] = -0.5 * np.sum(weighted)
    grad[d + 1] = -0.5 * (alpha @ alpha - np.trace(k_inv)) * noise
    mu, sd = LOG_SCALE_PRIOR
    value += 0.5 * np.sum(((theta[:d] - mu) / sd) ** 2)
    grad[:d] += (theta[:d] - mu) / sd**2
    return float(value), grad
