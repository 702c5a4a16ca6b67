"""One answer: every reader of a study names the configuration Optuna names best, and it is feasible.

Run's summary, ``tune export``, ``tune pareto``'s marked row, ``tune status``,
``optuna.load_study(...).best_trial`` and the dashboard's API are compared
over many seeds, on the twins and a generated board, after a resume, and in a
two-worker fleet. Each test fails if any one of them drifts.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import wsgiref.util
from pathlib import Path

import optuna
import pytest
from clirun import in_process, run_cli

from tuner.devices.registry import open_device
from tuner.study import run_study

STUDY_BOUNDS = {"sim:orin": 50.0, "sim:h200": 20.0, "sim:orin-nano": 80.0, "gen:3": None}


cli = in_process


def answers(
    out: Path, model: str, device: str, bound_ms: float, summary_trial: int | None, report: bool = False
) -> dict[str, object]:
    """The configuration each reader names (its trial's effective key), per reader; ``report`` adds tune report's."""
    storage = f"sqlite:///{out}/tune.db"
    flags = ["-m", model, "-d", device, "-l", f"{bound_ms:g}ms", "--out", str(out)]
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    best = study.best_trial
    key = best.user_attrs["effective_key"]

    def key_of(number: int) -> str:
        return study.trials[number].user_attrs["effective_key"]

    code, text, err = cli("export", *flags, "-o", str(out / "best.yaml"), "--json")
    assert code == 0, err
    exported = json.loads(text)
    code, text, err = cli("apply", str(out / "best.yaml"), "--device", device, "--dry-run", "--json")
    assert code == 0, err
    applied = json.loads(text)
    code, text, err = cli("pareto", *flags, "--json")
    assert code == 0, err
    marked = [p for front in json.loads(text)["fronts"].values() for p in front if p["recommended"]]
    code, text, err = cli("status", "--out", str(out), "-m", model, "-d", device, "--json")
    assert code == 0, err
    (status,) = json.loads(text)["studies"]
    reported = []
    if report:
        folder = out / "report"
        batch = str(best.user_attrs["batch_size"])
        code, _, err = cli("report", *flags[:6], "--from-study", str(out), "--batch-sizes", batch, "--out", str(folder))
        assert code == 0, err
        reported = json.loads((folder / "report.json").read_text())["answers"]
        assert len(reported) == 1 and f"trial {best.number} of study" in (folder / "report.md").read_text()
    named = {
        "optuna": key,
        "run": key_of(summary_trial),
        "export": key_of(exported["provenance"]["trial"]),
        "apply": key_of(applied["trial"]),
        "status": key_of(status["best"]["trial"]),
        **{f"pareto {i}": key_of(p["trial"]) for i, p in enumerate(marked)},
        **{f"report {i}": key_of(a["trial"]) for i, a in enumerate(reported)},
    }
    assert marked, "pareto marks no row"
    assert all(v <= 0 for v in best.constraints.values()), "Optuna's best is not feasible in the study"
    assert exported["knobs"] == best.user_attrs["effective"] and exported["batch_size"] == best.user_attrs["batch_size"]
    return named


def bound_for(device: str) -> float:
    bound = STUDY_BOUNDS[device]
    if bound is not None:
        return bound
    from tuner.bench import truth  # a generated board's bound: the median tail latency of its sweep

    lats = sorted(lat for _, lat in truth(device, "wl-conv", "p99").values())
    return round(lats[len(lats) // 2], 3)


# A twin and a generated board stay in the fast subset; the other seeds and twins run in the full suite.
FAST = {("sim:orin", "resnet50", 0), ("gen:3", "wl-conv", 0)}
CASES = [("sim:orin", "resnet50", s) for s in range(6)] + [
    ("sim:h200", "bert-base", 1),
    ("sim:h200", "resnet50", 2),
    ("sim:orin-nano", "mobilenet_v2", 3),
    ("gen:3", "wl-conv", 0),
    ("gen:3", "wl-conv", 1),
]


@pytest.mark.parametrize(
    ("device", "model", "seed"), [c if c in FAST else pytest.param(*c, marks=pytest.mark.slow) for c in CASES]
)
def test_every_reader_names_the_same_configuration_and_after_a_resume(twin_study, device, model, seed):
    bound = bound_for(device)
    made = twin_study(device, model=model, max_latency_ms=bound, trials=14, seed=seed)  # run_study, shared
    first, options = made.summary, made.options
    named = answers(made.out, model, device, bound, first.best_trial)
    assert len(set(named.values())) == 1, named
    _, second = run_study(open_device(device), options.model_copy(update={"trials": 8, "seed": seed + 100}))
    named_again = answers(made.out, model, device, bound, second.best_trial, report=True)
    assert len(set(named_again.values())) == 1, named_again
    # A resumed study never reports a dearer answer: it keeps its best unless a cheaper one was confirmed.
    assert second.best["j_per_query"] <= first.best["j_per_query"]
    assert second.previous_best["trial"] == first.best_trial


def test_every_rate_of_a_plan_names_its_study_s_answer(tmp_path):
    """tune plan's bands and points, export --scenario, pareto's star and status --scenario: one trial per rate."""
    out = tmp_path / "plan"
    flags = ["-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(out)]
    # One refine step per rate: its trial is in the study the readers read (the walk itself: test_plan.py).
    code, _, err = cli(
        "plan", *flags, "--rates", "40,90,140", "--trials", "6", "--refine", "1", "--knobs", "nvpmodel,gpu_mhz",
        "--batch-sizes", "1,4,8", "--seed", "2", "-o", str(out / "policy.yaml"),
    )  # fmt: skip
    assert code == 0, err
    assert err.startswith("plan: 3 rates, 0 from existing studies, 3 to tune")
    from tuner.serve.policy import load_policy

    policy = load_policy(out / "policy.yaml")
    storage = f"sqlite:///{out}/tune.db"
    feasible = [p for p in policy.points if p.feasible]
    assert len(feasible) >= 2, policy.points
    for point in feasible:
        scenario = f"server@{point.rate_qps:g}qps"
        best = optuna.load_study(study_name=point.study, storage=storage).best_trial
        code, text, err = cli("export", *flags, "--scenario", scenario, "-o", str(tmp_path / "e.yaml"), "--json")
        assert code == 0, err
        exported = json.loads(text)["provenance"]["trial"]
        code, text, err = cli("pareto", *flags, "--scenario", scenario, "--json")
        assert code == 0, err
        marked = [p["trial"] for front in json.loads(text)["fronts"].values() for p in front if p["recommended"]]
        code, text, err = cli("status", *flags, "--scenario", scenario, "--json")
        assert code == 0, err
        (status,) = json.loads(text)["studies"]
        assert marked and set(marked) == {best.number}, (scenario, marked, best.number)
        assert point.trial == exported == status["best"]["trial"] == best.number, scenario
        band = next(b for b in policy.bands if b.min_qps < point.rate_qps <= b.max_qps)
        assert band.j_per_query == pytest.approx(best.value) or band.provenance.trial != best.number
        if band.max_qps == point.rate_qps:  # the band cites the trial of the rate at its upper edge
            assert band.provenance.trial == best.number and band.provenance.study == point.study


def test_a_resumed_run_says_in_one_line_when_the_answer_changed(tmp_path):
    flags = ["run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(tmp_path), "--seed", "4"]
    code, _, err = cli(*flags, "--trials", "3")
    assert code == 0, err
    code, second, err = cli(*flags, "--trials", "8")  # at seed 4, 8 more trials find a cheaper answer
    assert code == 0, err
    study = optuna.load_study(study_name="resnet50|sim-orin|offline|50ms", storage=f"sqlite:///{tmp_path}/tune.db")
    lines = [line for line in second.splitlines() if line.startswith("the recommendation changed")]
    assert len(lines) == 1 and f"trial {study.best_trial.number} " in lines[0]


@pytest.mark.slow  # two tune processes tuning at once
def test_two_workers_sharing_one_study_name_one_answer(tmp_path):
    """Two processes fill one SQLite study (a fleet of two boards); every reader then names one configuration."""
    base = ["run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(tmp_path), "--study-trials", "16"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tuner", *base, "--seed", str(i), "--worker-id", f"w{i}", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    study = optuna.load_study(study_name="resnet50|sim-orin|offline|50ms", storage=f"sqlite:///{tmp_path}/tune.db")
    assert len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 16
    workers = {t.user_attrs.get("worker") for t in study.trials}
    assert workers == {"w1", "w2"}
    last = max(outs, key=lambda o: len(o[0]))  # both print the study's answer at their end
    named = answers(tmp_path, "resnet50", "sim:orin", 50.0, json.loads(last[0])["best_trial"])
    assert len(set(named.values())) == 1, named


def test_the_dashboard_names_the_same_best_and_reads_in_units(twin_study):
    """optuna-dashboard's own API, served as `tune dashboard` serves it: no index parameters, the same best."""
    pytest.importorskip("optuna_dashboard", reason="needs the dashboard extra: pip install 'powertune[dashboard]'")
    import optuna_dashboard

    from tuner.storage import dashboard_storage

    url = twin_study().url  # resnet50 on sim:orin at 50 ms, 14 trials of the default strategy
    study = optuna.load_study(study_name="resnet50|sim-orin|offline|50ms", storage=url)
    app = optuna_dashboard.wsgi(dashboard_storage(url))

    def get(path: str) -> dict:
        status: list[str] = []
        environ = {"PATH_INFO": path, "wsgi.errors": io.StringIO()}
        wsgiref.util.setup_testing_defaults(environ)
        body = app(environ, lambda s, _h, *_: status.append(s))
        assert status[0].startswith("200"), (status, environ["wsgi.errors"].getvalue()[-2000:])
        return json.loads(b"".join(body))

    study_id = get("/api/studies")["study_summaries"][0]["study_id"]
    detail = get(f"/api/studies/{study_id}")
    (shown,) = detail["best_trials"]
    assert shown["number"] == study.best_trial.number
    names = {p["name"] for t in detail["trials"] for p in t["params"]}
    assert names and not any(n.endswith("_index") for n in names)
    assert {"batch_size", "sm_mhz"} <= names or "batch_size" in names
    some = detail["trials"][0]["params"]
    batch = next(p for p in some if p["name"] == "batch_size")
    assert int(batch["param_external_value"]) in study.user_attrs["batch_sizes"]
    verdicts = [a for t in detail["trials"] for a in t["user_attrs"] if a["key"] == "verdict"]
    assert verdicts and all(a["value"].startswith(("meets", "misses")) for a in verdicts)
    # Feasibility as the dashboard reads it (its Infeasible badge and the History plot's best line).
    assert detail["objective_names"] == ["J/query"]
    bound = {a["key"]: a["value"] for a in detail["user_attrs"]}["latency_bound"]
    assert bound.startswith("p99 <= 50 ms")
    done = [t for t in detail["trials"] if t["state"] == "Complete"]
    assert all(len(t["constraints"]) == 1 for t in done)
    for t in done:
        stored = study.trials[t["number"]]
        assert (t["constraints"][0] <= 0) == all(v <= 0 for v in stored.constraints.values())
    infeasible = [t for t in done if t["constraints"][0] > 0]
    assert infeasible, "the study should hold a trial over the bound for this test to mean anything"
    feasible_values = [t["values"][0] for t in done if t["constraints"][0] <= 0]
    assert shown["values"][0] == min(feasible_values)


def test_the_dashboard_reads_the_constraints_of_a_study_written_before_they_were_mirrored(tmp_path):
    """A study with Optuna's named constraints only (older powertune): tune dashboard still shows them."""
    pytest.importorskip("optuna_dashboard", reason="needs the dashboard extra: pip install 'powertune[dashboard]'")
    import optuna_dashboard

    from tuner.storage import dashboard_storage

    url = f"sqlite:///{tmp_path}/tune.db"
    study = optuna.create_study(study_name="old", storage=url)
    study.set_user_attr("max_latency_ms", 50.0)
    for value, slack in ((1.0, 5.0), (2.0, -1.0)):
        trial = study.ask()
        trial.set_constraint("latency", slack)
        study.tell(trial, value)
    app = optuna_dashboard.wsgi(dashboard_storage(url))
    environ = {"PATH_INFO": "/api/studies/1", "wsgi.errors": io.StringIO()}
    wsgiref.util.setup_testing_defaults(environ)
    detail = json.loads(b"".join(app(environ, lambda *_: None)))
    assert [t["constraints"] for t in detail["trials"]] == [[5.0], [-1.0]]
    assert detail["best_trials"][0]["number"] == 1
    assert detail["objective_names"] == ["J/query"]
    assert {a["key"]: a["value"] for a in detail["user_attrs"]}["latency_bound"].startswith("p99 <= 50 ms")


def test_a_study_with_index_parameters_is_not_resumed(tmp_path):
    """A study an older version wrote stores knob positions; resuming it would mix two encodings."""
    storage = f"sqlite:///{tmp_path}/tune.db"
    old = optuna.create_study(study_name="resnet50|sim-orin|offline|50ms", storage=storage)
    old.add_trial(
        optuna.trial.create_trial(
            value=1.0,
            params={"gpu_mhz_index": 3},
            distributions={"gpu_mhz_index": optuna.distributions.IntDistribution(0, 10)},
        )
    )
    r = run_cli("run", "-m", "resnet50", "-d", "sim:orin", "-l", "50ms", "--out", str(tmp_path), "--trials", "2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "knob positions" in r.stderr and "--out" in r.stderr


def test_pareto_summary_fits_80_columns_with_every_knob_in_full(twin_study):
    """Five knobs vary on the Orin twin: the summary still fits a terminal, and no value is cut."""
    out = twin_study().out  # resnet50 on sim:orin at 50 ms, 14 trials of the default strategy
    code, out, err = cli("pareto", "-m", "resnet50", "-d", "sim:orin", "--out", str(out), "--all")
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out
    assert any(line.lstrip().startswith("*") for line in lines)
