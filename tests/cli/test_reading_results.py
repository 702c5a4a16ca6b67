"""What a user reads back from a finished study: pareto's rows, its plot, apply on a twin, the dashboard.

Each test drives the command or the module a user reaches and would fail if what it names broke.
"""

from __future__ import annotations

import io
import json
import re
import wsgiref.util

import pytest
from clirun import in_process

from tuner.pareto import ParetoFile, build_pareto, completed_records, plot_front
from tuner.plumbing import atomicfile


def test_pareto_says_how_many_rows_of_each_front_it_shows(twin_study):
    """A batch size whose front within the bound has more points than the summary keeps says 'n of m'."""
    made = twin_study(device="sim:orin-nano", trials=40)
    code, out, err = in_process("pareto", "-m", "resnet50", "-d", "sim:orin-nano", "--out", str(made.out))
    assert code == 0, err
    pareto = ParetoFile.model_validate_json(next(made.out.rglob("pareto.json")).read_text())
    totals = {
        pts[0].batch_size: sum(p.feasible for p in pts)
        for name, pts in pareto.fronts.items()
        if name != "global" and any(p.feasible for p in pts)
    }
    said = {int(b): (int(n), int(m)) for b, n, m in re.findall(r"batch (\d+): (\d+) of (\d+)", " ".join(out.split()))}
    assert said, f"the study should have a front longer than the summary keeps: {totals}"
    for batch, (shown, total) in said.items():
        assert total == totals[batch] and shown < total
    assert all(totals[b] <= 4 for b in totals if b not in said)


def test_the_plot_draws_no_front_line_past_the_bound(twin_study, monkeypatch):
    """pareto.png joins a batch size's front only within the bound; points past it are open markers."""
    made = twin_study(device="sim:orin-nano", trials=40)
    import optuna

    study = optuna.load_study(study_name=made.name, storage=made.url)
    pareto = build_pareto(study)
    assert any(not p.feasible for n, pts in pareto.fronts.items() if n != "global" for p in pts)
    drawn = []
    monkeypatch.setattr(atomicfile, "write_figure", lambda path, fig, **kw: drawn.append(fig))
    plot_front(pareto, completed_records(study), made.out / "front.png")
    (fig,) = drawn
    lines = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("bs=")]
    assert lines
    for line in lines:
        assert all(x <= pareto.max_latency_ms for x in line.get_xdata()), line.get_label()


def test_apply_on_a_twin_writes_nothing_and_offers_no_restore(twin_study, tmp_path):
    made = twin_study()
    best = tmp_path / "best.yaml"
    code, _, err = in_process("export", "-m", "resnet50", "-d", "sim:orin", "-o", str(best), "--out", str(made.out))
    assert code == 0, err
    code, out, err = in_process("apply", str(best))
    assert code == 0, err
    assert "applied:" not in out and "undo with" not in out
    assert "digital twin: nothing was written and there is nothing to restore" in " ".join(out.split())
    code, out, _ = in_process("restore", "--device", "sim:orin")
    assert code == 0 and "nothing to restore" in out


def _call(app, method: str, path: str) -> tuple[str, bytes]:
    status: list[str] = []
    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "wsgi.errors": io.StringIO()}
    wsgiref.util.setup_testing_defaults(environ)
    body = b"".join(app(environ, lambda s, _h, *_: status.append(s)))
    return status[0], body


def test_the_dashboard_reads_and_refuses_every_change(twin_study):
    """Delete study, create study, fail trial: refused with the reason the dashboard shows; the study is intact."""
    pytest.importorskip("optuna_dashboard", reason="needs the dashboard extra: pip install 'powertune[dashboard]'")
    import optuna

    from tuner.dashboard import dashboard_app

    made = twin_study()
    before = len(optuna.load_study(study_name=made.name, storage=made.url).trials)
    app = dashboard_app(made.url)
    status, body = _call(app, "GET", "/api/studies")
    assert status.startswith("200")
    study_id = json.loads(body)["study_summaries"][0]["study_id"]
    for method, path in (
        ("DELETE", f"/api/studies/{study_id}"),
        ("POST", "/api/studies"),
        ("POST", "/api/trials/1/tell"),
    ):
        status, body = _call(app, method, path)
        assert status.startswith("403") and "read-only" in json.loads(body)["reason"], (method, path)
    assert len(optuna.load_study(study_name=made.name, storage=made.url).trials) == before


def test_dashboard_on_a_port_in_use_is_one_line(twin_study):
    pytest.importorskip("optuna_dashboard", reason="needs the dashboard extra: pip install 'powertune[dashboard]'")
    import socket

    made = twin_study()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = in_process("dashboard", "--storage", made.url, "--host", "127.0.0.1", "--port", str(port))
    assert code == 2 and "give another --port" in err and "Traceback" not in err
