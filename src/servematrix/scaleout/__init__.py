"""Scale-out beyond one host: `submit --slurm`, a job array per GPU kind whose tasks run `servematrix run`
(`slurm.py`), and the Nix form of the locks, `nix/envs.json` (`nixexport.py`, `servematrix nix-export` or
`python -m servematrix.scaleout.nixexport`).

Both take their options from `options.py`, where every option is declared; running a cell is `run/`'s,
building an image from the Nix form is `backends/nix.py`'s.
"""
