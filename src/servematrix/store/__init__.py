"""The store: one SQLite row per cell run, with its provenance (`store.py`); what a row is, checked and
encoded (`rowschema.py`); secrets kept out of argv, environments and logs on their way in (`redact.py`).

It owns the database and the row's shape; what a row says is decided by the run (`run/pipeline.py`'s one row
builder), and what the report shows of it by `report/`.
"""
