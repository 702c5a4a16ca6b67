"""Fleets: workers sharing one study through PostgreSQL (or one SQLite file), and workers that die.

The PostgreSQL tests start a private cluster (tests/support/pgserver.py) and skip only
when no PostgreSQL server binaries exist; CI installs them, and there a skip
is a failure. Workers are real ``tune run`` processes (tests/support/fleet_worker.py
makes each twin measurement take real time, and can park one worker inside a
trial so it is killed mid-trial on purpose).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fleetproc
import optuna
import pgserver
import pytest
from optuna.trial import TrialState

from tuner.storage import driver_url, open_storage, redact, scrub, set_user_attrs
from tuner.study import RunOptions, run_study

pytestmark = pytest.mark.slow  # PostgreSQL servers and worker processes

RUN = ["run", "--model", "resnet50", "--device", "sim:orin", "--max-latency", "50ms", "--sampler", "random"]
STUDY = "resnet50|sim-orin|offline|50ms"


@pytest.fixture(scope="session")
def pg():
    with pgserver.server_for_tests() as server:
        yield server


STARTED: list[subprocess.Popen] = []
OPENED: list[optuna.storages.RDBStorage] = []


@pytest.fixture(autouse=True)
def no_stray_workers():
    """A failed assertion must not leave a parked worker sleeping for an hour, nor pipes or connections open."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    while OPENED:
        OPENED.pop().engine.dispose()


def start_worker(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    proc = fleetproc.start_worker(list(args), env, cwd)
    STARTED.append(proc)
    return proc


def wait_for(path: Path, procs: list[subprocess.Popen], timeout: float = 120) -> None:
    """Until a worker has parked itself inside a trial (failing fast if every worker already exited)."""
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end or all(p.poll() is not None for p in procs):
            outputs = [p.communicate(timeout=5) for p in procs if p.poll() is not None]
            raise AssertionError(f"no worker reached the marker: {outputs}")
        time.sleep(0.05)


def load_named(url: str, name: str) -> optuna.Study:
    storage = open_storage(url, None)
    OPENED.append(storage)
    return optuna.load_study(study_name=name, storage=storage)


def load(url: str) -> optuna.Study:
    return load_named(url, STUDY)


def check_retried(study: optuna.Study, killed: optuna.trial.FrozenTrial) -> None:
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert killed.state == TrialState.FAIL
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == killed.params


def test_redact_and_scrub_hide_every_password(monkeypatch):
    assert redact("postgresql://tune:pw@db:5432/s") == "postgresql://tune:***@db:5432/s"
    assert redact("postgresql://tune:p@ss/w0rd@db/s") == "postgresql://tune:***@db/s"
    assert redact("postgresql://db/s?user=u&password=pw&sslmode=require") == (
        "postgresql://db/s?user=u&password=***&sslmode=require"
    )
    assert redact("postgresql://tune@db/s") == "postgresql://tune@db/s"
    assert redact("postgresql://") == "postgresql://"
    assert redact("sqlite:///studies/tune.db") == "sqlite:///studies/tune.db"
    monkeypatch.setenv("PGPASSWORD", "envsecret")
    message = 'FATAL: auth failed for "tune" pw=envsecret url postgresql+psycopg://tune:s%40cret@db/s s@cret'
    clean = scrub(message, "postgresql://tune:s%40cret@db/s")
    assert "envsecret" not in clean and "s@cret" not in clean and "s%40cret" not in clean


def test_plain_postgres_urls_use_psycopg():
    assert driver_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert driver_url("postgres://") == "postgresql+psycopg://"
    assert driver_url("postgresql+psycopg2://h/db") == "postgresql+psycopg2://h/db"
    assert driver_url("sqlite:///x.db") == "sqlite:///x.db"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_batched_user_attrs_read_back_as_single_writes(backend, tmp_path, request):
    """A trial's attributes written in one statement read back as one write each would: overwrites, JSON, refusal."""
    if backend == "postgres":
        server = request.getfixturevalue("pg")
        server.create_database("attrs")
        url = server.url("attrs")
    else:
        url = f"sqlite:///{tmp_path / 'tune.db'}"
    storage = open_storage(url, 10)
    OPENED.append(storage)
    study = optuna.create_study(study_name="attrs", storage=storage)
    trial = study.ask()
    set_user_attrs(trial, {"worker": "w1", "config": {"gpu": 1300}, "note": None})
    set_user_attrs(trial, {"worker": "w2", "raw": [1.5, 2]})
    assert trial.user_attrs == {"worker": "w2", "config": {"gpu": 1300}, "note": None, "raw": [1.5, 2]}
    study.tell(trial, 1.0)
    assert load_named(url, "attrs").trials[0].user_attrs == trial.user_attrs
    with pytest.raises(RuntimeError, match="can not be updated"):
        set_user_attrs(trial, {"late": 1})


def test_study_quota_is_exact_and_resumable_in_process(tmp_path):
    from tuner.devices.virtual.twin import TwinDevice

    base = dict(model="resnet50", max_latency_ms=50.0, sampler="random", out=tmp_path, heartbeat_s=1)
    study, _ = run_study(TwinDevice("sim:orin"), RunOptions(**base, seed=1, trials=4, study_trials=7))
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 4
    study, summary = run_study(TwinDevice("sim:orin"), RunOptions(**base, seed=2, trials=100, study_trials=7))
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 7
    assert study.user_attrs["study_trials"] == 7
    study, summary = run_study(TwinDevice("sim:orin"), RunOptions(**base, seed=3, trials=100, study_trials=7))
    assert summary.measured == 0 and summary.total_trials == 7
    assert {t.user_attrs["worker"].split(":")[0] for t in study.trials} == {study.trials[0].user_attrs["host"]}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_sqlite_run_killed_mid_trial_keeps_its_trials_and_resumes(tmp_path, sig):
    """Ctrl-C or a crash loses no completed trial, and the same command finishes the study."""
    command = [*RUN, "--study-trials", "10", "--heartbeat", "1", "--out", "studies", "--seed", "3"]
    marker = tmp_path / "parked"
    worker = start_worker(*command, env={"FLEET_HANG_AFTER": "4", "FLEET_MARKER": str(marker)}, cwd=tmp_path)
    wait_for(marker, [worker])
    os.kill(worker.pid, sig)
    _, err = worker.communicate(timeout=60)
    url = f"sqlite:///{tmp_path / 'studies' / 'tune.db'}"
    study = load(url)
    before = {t.number: t.params for t in study.trials if t.state == TrialState.COMPLETE}
    assert len(before) >= 4
    (stopped,) = [t for t in study.trials if t.state != TrialState.COMPLETE]
    if sig == signal.SIGINT:
        assert worker.returncode == 130 and "interrupted" in err
        assert stopped.state == TrialState.FAIL
    else:
        assert worker.returncode == -signal.SIGKILL
        assert stopped.state == TrialState.RUNNING
    again = start_worker(*command, "--json", env={}, cwd=tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert json.loads(out)["total_trials"] >= 10
    study = load(url)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 10
    assert all(study.trials[n].params == params for n, params in before.items())
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    if sig == signal.SIGKILL:
        check_retried(study, study.trials[stopped.number])


def test_four_postgres_workers_one_killed_finish_exactly(pg, tmp_path):
    """Four twin workers (default sampler) share a 24-trial study; one dies mid-trial; exactly 24 complete.

    The killed trial is retried, nothing is left WAITING or RUNNING, and tune status names the trial Optuna
    names best, a confirmed one.
    """
    pg.create_database("fleet")
    total = 24
    marker = tmp_path / "parked"
    env = pg.env("fleet")
    # Heartbeat 2 s (grace 6 s): a loaded CI machine must not starve a live worker's heartbeat into staleness.
    default_sampler = RUN[: RUN.index("--sampler")]
    common = [*default_sampler, "--study-trials", str(total), "--heartbeat", "2", "--out", "studies"]
    victim = start_worker(
        *common,
        "--seed",
        "0",
        "--worker-id",
        "victim",
        "--storage",
        pg.url("fleet"),
        env={**env, "FLEET_DELAY_S": "0.2", "FLEET_HANG_AFTER": "2", "FLEET_MARKER": str(marker)},
        cwd=tmp_path,
    )
    others = [
        start_worker(
            *common,
            "--seed",
            str(i),
            "--worker-id",
            f"board-{i}",
            "--storage",
            "postgresql://",
            "--json",
            env={**env, "FLEET_DELAY_S": "0.2"},
            cwd=tmp_path,
        )
        for i in (1, 2, 3)
    ]
    # Generous: on a loaded CI machine four workers starting and proposing one at a time are slow.
    wait_for(marker, [victim], timeout=600)
    victim.kill()
    outputs = [victim.communicate(timeout=30)]
    for p in others:
        outputs.append(p.communicate(timeout=1200))
        assert p.returncode == 0, outputs[-1][1]

    study = load(pg.url("fleet"))
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == total
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    (killed,) = [t for t in study.trials if t.user_attrs.get("worker") == "victim" and t.state != TrialState.COMPLETE]
    check_retried(study, killed)
    # the answer carries a noise margin: confirmed, or a clear win's one window (the default confirms close calls)
    assert study.best_trial.user_attrs["latency_margin"] > 0

    query = ["status", "--storage", "postgresql://", "-m", "resnet50", "-d", "orin-agx", "--json"]
    status = subprocess.run(
        [sys.executable, "-m", "tuner", *query],
        env=fleetproc.child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    (report,) = json.loads(status.stdout)["studies"]
    assert (report["complete"], report["target"], report["running"], report["retried"]) == (total, total, 0, 1)
    assert report["best"]["trial"] == study.best_trial.number
    per_worker = {w["worker"]: w for w in report["workers"]}
    assert per_worker["victim"]["failed"] == 1 and per_worker["victim"]["complete"] >= 2
    assert sum(w["complete"] for w in per_worker.values()) == total
    outputs.append((status.stdout, status.stderr))

    written = [p.read_text() for p in (tmp_path / "studies").rglob("*") if p.suffix in (".json", ".csv", ".yaml")]
    assert written
    for text in [*written, *(s for pair in outputs for s in pair)]:
        assert pgserver.PASSWORD not in text


def test_postgres_credentials_never_leak(pg, tmp_path):
    """Exports, results and errors name the storage without its password, wherever the password came from."""
    pg.create_database("secrets")
    env = fleetproc.child_env(pg.env("secrets"))
    del env["PGPASSWORD"]

    def tune(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    url = pg.url("secrets")
    loose = [("10s" if a == "50ms" else a) for a in RUN]  # a bound three random trials surely meet
    run = tune(*loose, "--trials", "3", "--storage", url, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["storage"] == redact(url)
    export = tune("export", "-m", "resnet50", "-d", "sim:orin", "-l", "10s", "-o", "best.yaml", "--storage", url)
    assert export.returncode == 0, export.stderr
    wrong = tune("status", "--storage", url.replace(pgserver.PASSWORD, "wrong-pw-123"))
    assert wrong.returncode == 2 and "cannot open study storage" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    env["PGPASSWORD"] = pgserver.PASSWORD
    from_env = tune("status", "--storage", "postgresql://", "--json")
    assert from_env.returncode == 0 and json.loads(from_env.stdout)["studies"][0]["complete"] == 3
    del env["PGPASSWORD"]
    env["TUNE_TEST_DB_SECRET"] = pgserver.PASSWORD
    named = url.replace(f":{pgserver.PASSWORD}@", "@") + "?password_env=TUNE_TEST_DB_SECRET"
    assert pgserver.PASSWORD not in named
    from_var = tune("status", "--storage", named, "--json")
    assert from_var.returncode == 0 and json.loads(from_var.stdout)["studies"][0]["complete"] == 3, from_var.stderr
    written = [p.read_text() for p in tmp_path.rglob("*") if p.suffix in (".json", ".csv", ".yaml")]
    for text in [
        *written,
        run.stdout,
        run.stderr,
        export.stdout,
        export.stderr,
        wrong.stderr,
        from_env.stdout,
        from_var.stdout,
    ]:
        assert pgserver.PASSWORD not in text


def test_killed_workers_board_is_restored_from_its_journal_by_the_next_run(tmp_path):
    """SIGKILL mid-trial leaves the board changed and journaled; the next run puts it back, then finishes the study."""
    from fakeboard import make_fake_board
    from journals import pending_journals

    from tuner.devices.jetson import JetsonDevice
    from tuner.devices.virtual.twin import TwinDevice

    board = make_fake_board(tmp_path / "board", "orin-agx", "l4t35", seed=1)
    before = board.snapshot()
    out = tmp_path / "studies"
    options = dict(model="resnet50", max_latency_ms=50.0, sampler="random", seed=0, study_trials=1, heartbeat_s=1)
    script = tmp_path / "worker.py"
    script.write_text(
        "import time\n"
        "from pathlib import Path\n"
        "from tuner.devices.jetson import JetsonDevice\n"
        "from tuner.study import RunOptions, run_study\n"
        "def hang(*args):\n"
        "    print('measuring', flush=True)\n"
        "    time.sleep(600)\n"
        f"dev = JetsonDevice('orin-agx', sysfs_root={str(board.root)!r}, nvpmodel={str(board.nvpmodel)!r},\n"
        "                   runner_factory=lambda model, config: config, measure_fn=hang)\n"
        f"run_study(dev, RunOptions(**{options!r}, out=Path({str(out)!r})))\n"
    )
    worker = subprocess.Popen(
        [sys.executable, str(script)], env=fleetproc.child_env({}), stdout=subprocess.PIPE, text=True
    )
    STARTED.append(worker)
    assert worker.stdout is not None and worker.stdout.readline().strip() == "measuring"
    worker.kill()
    worker.wait(timeout=30)
    assert board.snapshot() != before
    assert [j.device for j in pending_journals()] == ["orin-agx"]

    twin = TwinDevice("sim:orin")
    device = JetsonDevice(
        "orin-agx",
        sysfs_root=board.root,
        nvpmodel=str(board.nvpmodel),
        runner_factory=lambda model, config: config,
        measure_fn=lambda config, meter, batch, settings, percentile: twin.measure("resnet50", config, settings),
    )
    study, _ = run_study(device, RunOptions(**options, out=out))
    assert board.snapshot() == before
    assert pending_journals() == []
    (killed,) = [t for t in study.trials if t.state != TrialState.COMPLETE]
    check_retried(study, killed)
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 1


def test_trial_failed_by_a_peer_while_still_running_does_not_stop_the_worker(tmp_path):
    """A stalled worker whose running trial a peer declared stale goes on; the quota still ends exact."""
    from tuner.devices.virtual.twin import TwinDevice

    url = f"sqlite:///{tmp_path / 'tune.db'}"

    class Stalled(TwinDevice):
        calls = 0

        def measure(self, model, config, settings):
            Stalled.calls += 1
            if Stalled.calls == 2:
                peer = optuna.load_study(study_name=STUDY, storage=url)
                (running,) = [t for t in peer.trials if t.state == TrialState.RUNNING]
                peer._storage.set_trial_state_values(running._trial_id, TrialState.FAIL)
            return super().measure(model, config, settings)

    options = RunOptions(model="resnet50", max_latency_ms=50.0, sampler="random", seed=0, out=tmp_path, study_trials=5)
    study, _ = run_study(Stalled("sim:orin"), options.model_copy(update={"storage": url}))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 5 and states.count(TrialState.FAIL) == 1


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_worker_killed_before_its_first_heartbeat_does_not_block_the_quota(tmp_path):
    """A RUNNING trial with no heartbeat (issue 10: a SIGKILL before the first beat) is failed and retried."""
    from datetime import datetime, timedelta

    from optuna.storages._rdb import models

    from tuner.devices.virtual.twin import TwinDevice
    from tuner.storage import FleetStorage
    from tuner.study import narrowed_space, open_study

    url = f"sqlite:///{tmp_path / 'tune.db'}"
    other = open_study("other", url, heartbeat_s=1)
    started = other.ask()
    session = other._storage._backend.scoped_session()
    assert session.query(models.TrialHeartbeatModel).filter_by(trial_id=started._trial_id).count() == 1
    session.close()

    space = narrowed_space(TwinDevice("sim:orin"), None, None)
    study = open_study(STUDY, url, heartbeat_s=1)
    orphan = optuna.trial.FrozenTrial(
        number=0,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.now() - timedelta(hours=1),
        datetime_complete=None,
        params=space.params_for(space.default_config()),
        distributions=space.distributions(),
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=0,
    )
    # What a worker killed between creating its trial and its first beat leaves: no heartbeat row at all.
    optuna.storages.RDBStorage._create_new_trial(study._storage._backend, study._study_id, orphan)
    assert isinstance(study._storage._backend, FleetStorage)

    options = RunOptions(model="resnet50", max_latency_ms=50.0, sampler="random", seed=0, out=tmp_path, timeout_s=120)
    study, _ = run_study(TwinDevice("sim:orin"), options.model_copy(update={"storage": url, "study_trials": 3}))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 3 and TrialState.RUNNING not in states
    assert TrialState.WAITING not in states
    check_retried(study, study.trials[0])
