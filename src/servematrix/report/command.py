"""What `servematrix report` and `run --report` write, decided in one place: `report` takes the parsed options
and decides a preview, a publish or a render of the published results alone, where it goes, and the baseline
it compares with; cli parses and calls it.

- preview (no --publish): the store alone, rendered into the preview folder; no record written; compared with
  the published record (or --baseline); refused in the published site's folder.
- publish: the store merged into the record beside the table, under the folder's lock (the record merged into
  is the one there at the write), `prune` dropping the published cells the store lacks; compared with that
  record as it was (or --baseline).
- from-published (with publish): the published record rendered again alone, no store.

Everything is read and checked before anything is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from servematrix.errors import InputError
from servematrix.records.published import PUBLISHED_SITE, RECORD
from servematrix.report import publish as publishing
from servematrix.report.regressions import Regression, published_rows
from servematrix.store.store import DEFAULT_STORE
from servematrix.util import PREVIEW_DIR

TABLE_NAME = "compatibility.md"


def report(
    store_path: Path | None,
    table: Path | None,
    baseline: Path | None,
    *,
    publish: bool = False,
    prune: bool = False,
    from_published: bool = False,
    no_store: Callable[[Path], str] | None = None,
) -> list[Regression]:
    """Write the whole report beside `table` (default: TABLE_NAME in the published site when publishing, else
    in the preview folder) and return its regressions. With `no_store` (a message for a store path), a store
    that does not exist is that InputError, unless the published results are rendered alone."""
    table = table or (PUBLISHED_SITE if publish else PREVIEW_DIR) / TABLE_NAME
    store = store_path or DEFAULT_STORE
    if no_store is not None and not from_published and not store.exists():
        raise InputError(no_store(store))
    if not publish:
        return _write(store, table, baseline, publish=False, prune=prune, from_published=from_published)
    with publishing.publish_lock(table.parent):
        return _write(store, table, baseline, publish=True, prune=prune, from_published=from_published)


def _write(
    store: Path, table: Path, baseline: Path | None, *, publish: bool, prune: bool, from_published: bool
) -> list[Regression]:
    out_dir = table.parent
    record = out_dir / RECORD
    if baseline is not None and not baseline.is_file():  # named, so a gate that compares with nothing is wrong
        raise InputError(f"--baseline {baseline}: no such file")
    if not publish:
        rows = publishing.store_rows(store)  # first: a lost store is the cause worth naming
        publishing.refuse_published(out_dir)
        baseline = baseline or PUBLISHED_SITE / RECORD
        publishing.read_record(baseline)
    else:
        published = publishing.read_record(record)
        baseline = baseline or record
        publishing.read_record(baseline)
        if from_published:
            if not published or not published["cells"]:
                raise InputError(f"{record}: no published results to render")
            rows = published_rows(published)
            done = f"rendered the published results {record} again ({len(rows)} cell(s)); no store"
        else:
            merged = publishing.merge_published(published, publishing.store_rows(store), prune=prune)
            rows = list(merged.rows)
            done = merged.summary(record)
    # A preview shows the store's packed runs; the published record keeps cells, not one host's runs.
    packing = publishing.store_packing(store) if not publish else []
    result = publishing.write_report(
        rows, out_dir, baseline=baseline, write_record=publish, markdown_name=table.name, packing=packing
    )
    written = f"{result.markdown}, {result.html}, {len(result.plots)} plot(s)"
    if publish:
        print(f"wrote {written}, {result.results}\n{done}\n{result.history_summary}", file=sys.stderr)
    else:
        print(
            f"wrote {written} from {store} (a preview: nothing published; `servematrix report --publish` publishes)",
            file=sys.stderr,
        )
    for regression in result.regressions:
        print(f"servematrix: 🔻 {regression}", file=sys.stderr)
    return list(result.regressions)
