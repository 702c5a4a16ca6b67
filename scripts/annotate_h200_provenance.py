"""Write what the committed H200 results were measured on into them (they predate recorded provenance).

The studies under studies/h200 and studies/h200-serve were run before the tool
recorded hardware provenance: their files say ``cuda:0`` and ``h200`` but not
the GPU's name or driver. Those were recorded beside them: the GPU name and
driver in the nvidia-smi files read before each call, the software in the
benchmark notes. This script copies them into every study's attributes (so
``tune results`` and ``tune export`` carry them from now on), into each
pareto.json and best.yaml, and into the ``--json`` outputs, marked as
annotated afterwards. Idempotent.

    .venv/bin/python scripts/annotate_h200_provenance.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import yaml

from tuner.plumbing import atomicfile

ROOT = Path(__file__).resolve().parents[1]
# folder -> (nvidia-smi file read before the call, the note that records date, command and software)
SOURCES = {
    "studies/h200": (
        "benchmarks/results/h200-observe/nvidia-smi-before-resnet50.csv",
        "benchmarks/results/measurement.md",
    ),
    "studies/h200/adaptive-30": ("benchmarks/results/runtimes/nvidia-smi-before.csv", "benchmarks/results/runtimes.md"),
    "studies/h200-serve": ("studies/h200-serve/nvidia-smi-before.csv", "benchmarks/results/serve-h200.md"),
}
# As the notes above record them: torch from the machine's image, the rest carried as wheels.
SOFTWARE = {"powertune": "0.1.0", "python": "3.12", "torch": "2.11.0+cu130", "loadgen": "6.0.17", "optuna": "5.0.0"}


def measured_on(smi: Path, note: str) -> dict:
    with smi.open() as fh:
        row = next(csv.DictReader(fh, skipinitialspace=True))
    return {
        "device": "cuda:0",
        "device_kind": "h200",
        "twin": False,
        "hardware": row["name"].strip(),
        "driver": row["driver_version"].strip(),
        "host": "the workplace's lent H200 machine (16 host cores)",
        "software": dict(SOFTWARE),
        "annotated": f"written afterwards from {smi.relative_to(ROOT)} and {note}; not read by the tool at run time",
    }


def owned(folder: Path, name: str) -> list[Path]:
    """Files ``name`` under ``folder`` that no deeper folder of SOURCES holds (adaptive-30 is its own)."""
    deeper = [ROOT / f for f in SOURCES if (ROOT / f) != folder and (ROOT / f).is_relative_to(folder)]
    return [p for p in sorted(folder.rglob(name)) if not any(p.is_relative_to(d) for d in deeper)]


def annotate(folder: Path, record: dict) -> list[Path]:
    touched = []
    db = folder / "tune.db"
    if db.is_file():
        url = f"sqlite:///{db}"
        for summary in optuna.get_all_study_summaries(url):
            study = optuna.load_study(study_name=summary.study_name, storage=url)
            study.set_user_attr("provenance", record)
        touched.append(db)
    for path in owned(folder, "pareto.json"):
        data = json.loads(path.read_text())
        data["provenance"] = record
        atomicfile.write_text(path, json.dumps(data, indent=2) + "\n")
        touched.append(path)
    for path in owned(folder, "best.yaml"):
        text = path.read_text()
        header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        data = yaml.safe_load(text)
        data["provenance"]["measured_on"] = {k: v for k, v in record.items() if k != "software"}
        data["provenance"]["software"] = record["software"]
        atomicfile.write_text(path, header + yaml.safe_dump(data, sort_keys=False))
        touched.append(path)
    for path in sorted(folder.glob("*-run.json")):
        data = json.loads(path.read_text())
        data["provenance"] = record
        atomicfile.write_text(path, json.dumps(data, indent=2) + "\n")
        touched.append(path)
    return touched


def main() -> None:
    for folder, (smi, note) in SOURCES.items():
        for path in annotate(ROOT / folder, measured_on(ROOT / smi, note)):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
