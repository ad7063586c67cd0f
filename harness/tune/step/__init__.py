"""`qwen36 tune step`: the whole decode step of one tensor-parallel rank.

`run` (the command: eager, by block kind), `graph` (the same step over a static cache, replayed from a CUDA
graph), `report` (console, step.json, step.md),
`point` (the whole step as a point of the device table, recorded by `qwen36 tune`, gated by `--check` and `--ab`).
"""
