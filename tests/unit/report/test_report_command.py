"""report.command.report: the one place that decides a preview, a publish or a render of the published
results alone, where it goes and what it compares with (cli parses and calls it)."""

from __future__ import annotations

import pytest

from servematrix.errors import InputError
from servematrix.report.command import TABLE_NAME, report


def test_a_missing_store_is_the_callers_message_unless_the_published_results_are_rendered(tmp_path):
    store = tmp_path / "none.sqlite"
    with pytest.raises(InputError, match="no store at"):
        report(store, tmp_path / "out" / TABLE_NAME, None, no_store=lambda path: f"no store at {path}")
    # Rendering the published results alone reads no store: what it lacks is the record.
    with pytest.raises(InputError, match="no published results to render"):
        report(
            store,
            tmp_path / "site" / TABLE_NAME,
            None,
            publish=True,
            from_published=True,
            no_store=lambda path: pytest.fail("the store was asked for"),
        )
    assert not (tmp_path / "out").exists()


def test_a_named_baseline_that_is_not_there_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(InputError, match=r"--baseline .*: no such file"):
        report(tmp_path / "s.sqlite", tmp_path / "out" / TABLE_NAME, tmp_path / "gone.json")
    assert not (tmp_path / "out").exists()
