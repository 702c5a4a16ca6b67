"""``tune roofline``'s work: measure a seeded design on a device, fit the rooflines, plot and write them.

The fit itself is tuner.roofline; this module holds the device on the way
(:func:`tuner.devices.hardware_session.hardware_session`) and writes
roofline.json and roofline.png into the results folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tuner.devices.base import Device
from tuner.devices.hardware_session import hardware_session
from tuner.errors import UserError
from tuner.measure.settings import WindowSettings
from tuner.measurement import Measurement
from tuner.plumbing import atomicfile, interrupts
from tuner.provenance import provenance
from tuner.space import Config


def roofline_report(dev: Device, model: str, points: int, seed: int, window: float, folder: Path) -> dict:
    """Measure a seeded design (see :func:`measure_design`), fit the rooflines, plot them, and write roofline.json."""
    from tuner.models import model_profile
    from tuner.roofline import features, fit_measurements, intensity_summary, layer_intensity
    from tuner.roofline_plot import plot

    space = dev.space()
    measured = measure_design(dev, model, points, seed, window)
    if len(measured) < 2:
        raise UserError(f"only {len(measured)} of {points} roofline points measured validly: check the device")
    profile, source = model_profile(model, dev)
    if profile is None:
        raise UserError(f"{source}: the roofline needs per-layer FLOPs and bytes (a zoo model or an .onnx file)")
    fitted = fit_measurements(profile, space, [c for c, _ in measured], [m.model_dump() for _, m in measured])
    modes = _modes(space)
    params = fitted.mode_parameters(features(space, [c for _, c in modes]))
    plot(fitted, profile, space, [c for _, c in modes], folder / "roofline.png", twin=dev.simulated)
    batch = modes[0][1].batch_size
    intensity = layer_intensity(profile, batch)
    payload = {
        "device": dev.name,
        "twin": dev.simulated,
        "model": model,
        "points": len(measured),
        "fit": fitted.params.model_dump(),
        "modes": [
            {"mode": c.label(), "name": name, "config": c.knobs, "batch_size": c.batch_size, **p}
            for (name, c), p in zip(modes, params, strict=True)
        ],
        "layers": {
            "batch": batch,
            "profile": source,
            **intensity_summary(profile, batch),
            "per_layer": [
                {"name": layer.name, "op": layer.op, "flop_per_byte": float(x)}
                for layer, x in zip(profile.layers, intensity, strict=True)
            ],
        },
        "results": str(folder),
        "provenance": provenance(dev),
    }
    atomicfile.write_text(folder / "roofline.json", json.dumps(payload, indent=1))
    return payload


def measure_design(dev: Device, model: str, points: int, seed: int, window: float) -> list[tuple[Config, Measurement]]:
    """The valid measurements of a seeded design: the default mode at both batch ends, then random points."""
    space = dev.space()
    grid = space.grid()
    rng = np.random.default_rng(seed)
    default = space.default_config()
    design = [
        space.effective(default),
        space.effective(default.model_copy(update={"batch_size": space.batch_sizes[0]})),
    ]
    for i in rng.permutation(len(grid))[: max(points - 2, 0)]:
        if grid[int(i)].key() not in {c.key() for c in design}:
            design.append(grid[int(i)])
    measured = []
    with hardware_session(dev):
        for i, config in enumerate(design[:points]):
            interrupts.check()
            dev.apply(config)
            interrupts.check()
            m = dev.measure(model, config, WindowSettings(window_s=window, seed=seed * 1000 + i))
            if m.valid:
                measured.append((config, m))
    return measured


def _modes(space) -> list[tuple[str, Config]]:
    """The power modes to show, named: each nvpmodel mode at its caps, else the default and the lowest clocks."""
    batch = space.batch_sizes[len(space.batch_sizes) // 2]
    default = space.default_config(batch)
    if space.mode_knob is not None:
        return [
            (str(m), space.effective(Config(knobs={**default.knobs, space.mode_knob: m}, batch_size=batch)))
            for m in space.knobs[space.mode_knob].values
        ]
    low = {k: (v.values[0] if v.ordered and k.endswith("_mhz") else v.default) for k, v in space.knobs.items()}
    return [("default", default), ("lowest clocks", Config(knobs=low, batch_size=batch))]
