"""The ranges every serving command checks up front: one validator for plan, govern and replay.

A policy that ``tune govern`` refuses must not be simulated by ``tune
replay`` either (an unknown knob, an unsupported clock, a batch size of
1e9 that takes all the memory), and a number a user can type (a rate, an
interval, a trace's span) bounds the work it can ask for. Each limit is
named in its one-line error.
"""

from __future__ import annotations

import math

from tuner.devices.base import Device
from tuner.errors import ConfigurationError, UserError
from tuner.scenario import TIMEOUT_KNOB, TIMEOUTS_MS
from tuner.serve.policy import Policy, check_policy

MAX_PLAN_RATES = 200
# The governor's settings, seconds: an interval is also how long the first
# signal may wait for the loop's next safe point.
MAX_INTERVAL_S = 3600.0
MAX_SECONDS = 7 * 86400.0
# A replayed trace: rows read, and governor intervals simulated (a week at 1 s is 604,800).
MAX_TRACE_BYTES = 16 << 20
MAX_TRACE_ROWS = 200_000
MAX_REPLAY_STEPS = 1_000_000


def check_rules(
    interval: float, headroom: float, hysteresis: float, min_dwell: float, smoothing: float, duration: float | None
) -> None:
    """The governor's switching settings, as ``tune govern`` and ``tune replay`` take them."""
    if not (math.isfinite(interval) and 0 < interval <= MAX_INTERVAL_S):
        raise ConfigurationError(f"--interval must be a number of seconds in (0, {MAX_INTERVAL_S:g}], e.g. 1")
    for value, flag in ((headroom, "--headroom"), (hysteresis, "--hysteresis")):
        if not 0 <= value < 1:
            raise ConfigurationError(f"{flag} must be a fraction in [0, 1), e.g. 0.1")
    for value, flag in ((min_dwell, "--min-dwell"), (smoothing, "--smoothing")):
        if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
            raise ConfigurationError(f"{flag} must be from 0 to {MAX_SECONDS:g} seconds, e.g. 30")
    if duration is not None and not (math.isfinite(duration) and 0 < duration <= 100 * 365 * 86400.0):
        raise ConfigurationError(
            "--duration must be a positive number of seconds, e.g. 3600 (leave it out to run until stopped)"
        )


def check_policy_for(policy: Policy, device: Device, model: str | None = None) -> None:
    """Refuse a policy this device cannot run as written, before anything is applied or simulated.

    The kind and model must match; every band's knobs must be the device's,
    each at a value it supports; its batch size one of the space's; its
    batching timeout one of the serving timeouts.
    """
    check_policy(policy, device.kind, model)
    space = device.space()
    for i, band in enumerate(policy.bands):
        try:
            space.validate_config(band.config())
        except UserError as exc:
            raise ConfigurationError(f"policy band {i}: {exc}") from None
        if band.batch_size not in space.batch_sizes:
            sizes = ",".join(map(str, space.batch_sizes))
            raise ConfigurationError(
                f"policy band {i}: batch_size {band.batch_size} is not one of {device.kind}'s: {sizes}"
            )
        if band.batch_timeout_ms not in TIMEOUTS_MS:
            shown = ", ".join(f"{t:g}" for t in TIMEOUTS_MS)
            raise ConfigurationError(
                f"policy band {i}: {TIMEOUT_KNOB} {band.batch_timeout_ms:g} is not one of {shown} (ms)"
            )
