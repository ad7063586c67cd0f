"""The benchmark pipeline, one stage per module: `datasets` (deterministic workloads) -> `client` (one
streaming request, timed) -> `runner` (workloads at a concurrency, repeats, sweeps; `loop_lag` attributes
stalls) -> `metrics` (the platform's metrics, declared once) -> `report` and `artifacts` (the run directory).
`run` is `qwen36 bench`: a typed config in, a run directory out.

May import: `serving` (the embedded server it measures by default), `machine`, `errors`, `paths`, `model`.
"""
