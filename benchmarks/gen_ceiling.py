"""The regret no study that keeps its bound can avoid on a generated board: the optimum within the noise of the bound.

Usage: python benchmarks/gen_ceiling.py [--boards 1000-1011] [--bound tight] [--windows 2] [--out ceiling.json]

A study's answer is a trial confirmed in ``--windows`` windows whose mean tail latency plus a noise margin meets
the bound (tuner.objective: NOISE_Z x the latency's relative spread, at least NOISE_FLOOR, x sqrt(1 + 1/n)). A
configuration whose true latency is within that margin of the bound is, read by its own windows, as likely over
as under: no honest study can name it as the answer. Per board (tuner.bench's landscape at ``--bound``, the
noise-free sweep as truth): the optimum and how near the bound its latency is, the board's latency noise
(tuner.devices.virtual.generated: Physics.noise_time), the margin a study of it adds, and the regret of the best
configuration whose true latency clears the bound by that margin (the ceiling of any study that keeps the bound),
also at fixed margins of 1-5%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from tuner.bench import _landscapes, device, truth
from tuner.devices.virtual.generated import WORKLOADS
from tuner.objective import NOISE_FLOOR, NOISE_Z

FIXED = (0.01, 0.02, 0.03, 0.05)


def boards(spec: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def ceiling(table: dict[str, tuple[float, float]], bound: float, margin: float, optimum: float) -> float:
    """Regret of the cheapest configuration whose true latency clears ``bound`` by ``margin`` (inf: none)."""
    best = min((j for j, lat in table.values() if lat * (1 + margin) <= bound), default=math.inf)
    return best / optimum - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", default="1000-1011")
    parser.add_argument("--bound", default="tight")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for seed in boards(args.boards):
        name = f"gen:{seed}"
        land = _landscapes("judge boards", name, WORKLOADS[seed % len(WORKLOADS)], [args.bound], "p99")[0]
        table = truth(name, land.model, "p99")
        bound = land.max_latency_ms
        opt_lat = max(lat for j, lat in table.values() if lat <= bound and j == land.optimum_j)
        noise = float(device(name).physics.noise_time)
        margin = NOISE_Z * max(noise, NOISE_FLOOR) * math.sqrt(1 + 1 / args.windows)
        rows.append(
            {
                "board": name,
                "workload": land.model,
                "bound_ms": round(bound, 3),
                "optimum_latency_over_bound": round(opt_lat / bound, 4),
                "latency_noise": round(noise, 4),
                "margin": round(margin, 4),
                "ceiling": ceiling(table, bound, margin, land.optimum_j),
                **{f"ceiling_at_{m:.0%}": ceiling(table, bound, m, land.optimum_j) for m in FIXED},
            }
        )
        r = rows[-1]
        print(
            f"{name} {land.model} bound {bound:.4g} ms: optimum at {r['optimum_latency_over_bound']:.2%} of it; "
            f"noise {noise:.1%}, margin {margin:.1%}: ceiling {r['ceiling']:+.1%}",
            flush=True,
        )
    values = [r["ceiling"] for r in rows]
    result = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python " + " ".join(sys.argv),
        "median_ceiling": statistics.median(values),
        "worst_ceiling": max(values),
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"median ceiling {result['median_ceiling']:+.2%}, worst {result['worst_ceiling']:+.2%}")


if __name__ == "__main__":
    main()
