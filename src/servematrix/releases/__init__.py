"""`servematrix releases`: the release watcher. For each version axis of a matrix, the index's releases the
matrix lacks, with their upload dates (index.py: the index's files of a project; watch.py: which releases are
missing and why some are left out; edit.py: writing them into the matrix file, comments and layout kept;
command.py: the command line).

What a new release then decides is the pipeline's (`servematrix run --stages resolve,probe` on the new cells)
and the report's; `.github/workflows/releases.yml` runs the two and opens a pull request. The matrix schema and
its checks are `config/spec.py`'s: a matrix written here is loaded again with them before it replaces the file.
"""
