"""The stages of a run, in order. Each is a module here; the runner (run/pipeline.py) calls them in this order.
`locking.py` is the resolve stage for many environments at once (`servematrix lock`).

`import` (the lock installed and imported on a CPU) and `probe` (the engine's other CPU pre-flights) are
pre-flights; `resolve` runs anywhere; the rest need the cell's GPUs.
"""

STAGES = ("resolve", "import", "build", "probe", "serve", "bench")
# Run anywhere; the others need the cell's GPUs. The import check runs only where the GPU stages cannot:
# on a GPU host, serving the environment decides the same thing.
CPU_STAGES = ("resolve", "import", "probe")
