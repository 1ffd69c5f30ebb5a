"""The formats every layer shares, read and written the same way everywhere: the one TOML reader of data
files, with a key's file:line (`tomlsource.py`); a lock file, its header and body (`lockfile.py`); one file
of a wheel on an index, read without downloading it (`remotewheel.py`); and a cell's verdict, with which
failures are the harness's (`verdict.py`, `data/harness_faults.toml`).

It imports nothing of servematrix but `errors` and `util`: engines, the store and everything above read these
formats; making a lock (`stages/`), a matrix's schema (`config/`) and the engines' data (`engines/`) are
theirs.
"""
