"""The run: a plan's environments and cells through the stages, one verdict per cell (`pipeline.py`); what a
run will do, decided before it starts (`runplan.py`); one server start of a cell (`serving.py`); packed runs
on a host of several GPUs (`packing.py`, and `packjob.py`, one job, run as `python -m
servematrix.run.packjob`); the server's ports (`ports.py`), orphans (`reaper.py`), reused published
pre-flight verdicts (`reuse.py`), what a run shows (`progress.py`), models servematrix builds (`models.py`),
host facts (`hostinfo.py`).

It calls the stages (`stages/`), backends (`backends/`) and engine hooks by name; their internals, the schedule
of packed jobs (`planning/schedule.py`) and the store's format (`store/`) are theirs.
"""
