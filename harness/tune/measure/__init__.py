"""Measuring one path at one point, and what every sweep needs for it.

`point` (run into NaN-poisoned outputs, check against float64, time eager and graph), `timing` (CUDA events,
L2 flush, graph capture), `dims` (the shapes timed), `inputs` (seeded random tensors), `floors` (bytes and FLOPs
per call), `ceilings` (bandwidth and matrix rate per device), `prune` (dropping paths that cannot win),
`progress` (the progress bar).
"""
