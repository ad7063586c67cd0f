"""Measuring one path at one point, and what every sweep needs for it.

`point` (run into NaN-poisoned outputs, check against float64, time eager, graph and the GPU's own time, host time
per call, launches), `timing` (CUDA events, L2 flush, graph capture, the launch hidden behind a spin), `launch_count`
(launches of a call: torch.profiler on a GPU, ATen ops and Triton launches anywhere), `call_costs` (one ATen op's host
time and the timer's own cost, the units host figures are read in), `dims` (the shapes timed), `inputs` (seeded random tensors), `floors` (bytes and FLOPs
per call), `ceilings` (bandwidth and matrix rate per device), `prune` (dropping paths that cannot win),
`progress` (the progress bar).
"""
