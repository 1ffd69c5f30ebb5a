"""Planning: a spec expanded into environments and cells with content-hash ids (`cells.py`), chosen by
`--select`/`--shard` (`selection.py`), as a plan and its forms (`plan.py`), and the pure functions that
schedule a packed run's jobs on a host's GPUs (`schedule.py`).

Nothing here runs a cell: running the plan is `run/`'s, its stages are `stages/`'s.
"""
