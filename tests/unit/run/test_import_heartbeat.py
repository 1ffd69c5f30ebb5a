"""The import checks that run ahead of the cells say how far they are while they run (a CI log never falls
silent for the 20-30 minutes they take on a fresh host)."""

from __future__ import annotations

import os
import time

from servematrix.run import runplan


def test_the_import_checks_ahead_say_how_many_have_finished_while_they_run(tmp_path, monkeypatch):
    monkeypatch.setattr(runplan, "HEARTBEAT_S", 0.05)
    results = tmp_path / "import" / "results"
    results.mkdir(parents=True)
    (results / "old.json").write_text("{}")  # an earlier run's result is not this run's progress
    old = time.time() - 3600
    os.utime(results / "old.json", (old, old))
    said: list[str] = []
    with runplan._import_heartbeat(said.append, results, 3):
        time.sleep(0.2)
        (results / "a.json").write_text("{}")
        time.sleep(0.2)
    beats = [s for s in said if "s in" in s]
    assert beats and beats[0].startswith("import checks: 0 of 3 finished")
    assert any(s.startswith("import checks: 1 of 3 finished") for s in beats)
    assert said[-1].startswith("import checks: 1 of 3 finished in ")
    n = len(said)
    time.sleep(0.2)
    assert len(said) == n  # the heartbeat stops with the checks
