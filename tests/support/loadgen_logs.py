"""What a study's LoadGen logs must say about its trials, whatever the machine's load.

A trial's first window leaves a LoadGen log. A trial that completed in full
has a VALID one. A trial whose window was cut once its verdict was known (its
tail proven past the bound, or dearer than the best so far: by design, see
tuner.measure.stopping) ends before LoadGen's minimum duration, so its log
may read INVALID; the trial then records the cut and says so in its verdict.
A failed trial says why, and may have no log at all (it can fail before
LoadGen starts, or LoadGen may refuse a window a loaded machine ran short).
"""

from pathlib import Path

from optuna.trial import FrozenTrial, TrialState


def check_trial_logs(trials: list[FrozenTrial]) -> None:
    for t in trials:
        summary = Path(t.user_attrs["loadgen_logs"]) / "mlperf_log_summary.txt"
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get("fail_reason"), t.number
            continue
        text = summary.read_text()
        if t.user_attrs.get("cut"):
            assert "Result is :" in text and "cut" in t.user_attrs["verdict"], (t.number, t.user_attrs)
        else:
            assert t.state == TrialState.COMPLETE and "Result is : VALID" in text, (t.number, text)
