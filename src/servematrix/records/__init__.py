"""Records: the typed shapes of what servematrix stores and publishes, each field named once.

- `cell.py`: a cell and its environment as the plan makes them (`Cell`, `Environment`), and the GPU kind they
  name (`GpuKind`): what the engines' hooks, the store and the runner talk about.
- `row.py`: a cell run as the store holds it (`Row`, one field per column, plus what the report's evidence
  layer shows beside a row).
- `published.py`: the published record, `docs/results/latest.json` (`PublishedCell`, `PublishedRecord`), and
  its JSON schema, generated from the model.
- `history.py`: the history feed, `results/history.json` (`HistoryEntry`, `HistoryCell`, `History`).

Pure data: it imports nothing of servematrix (only pydantic), and sits below every layer that reads it. Reading and writing them (the
database, the files, their checks against crafted input) belong to `store/` and `report/`.
"""
