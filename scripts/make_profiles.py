"""Regenerate runners/profiles/<model>.json from the zoo's real graphs.

Usage: python scripts/make_profiles.py [MODEL ...]   (all zoo models by default)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

from runners import zoo  # noqa: E402
from runners.profiling import profile_model  # noqa: E402

OUT = ROOT / "runners" / "profiles"


def main(argv: list[str]) -> None:
    names = argv or zoo.model_names()
    for name in names:
        command = f"python scripts/make_profiles.py {name}"
        profile = profile_model(name, generated_by=command)
        path = OUT / f"{name}.json"
        path.write_text(profile.model_dump_json(indent=1) + "\n")
        print(
            f"{name}: {profile.flops_per_sample / 1e9:.3f} GFLOP/sample,"
            f" weights {profile.weight_bytes / 1e6:.1f} MB,"
            f" activations {profile.act_bytes_per_sample / 1e6:.1f} MB/sample -> {path}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
