"""`qwen36 tune`: time every registered MoE expert path and GDN rule path on the serving machine, check each
output against the float64 reference, and write the device's dispatch table plus a JSON + Markdown report.

Modules, one job each: dims (the shapes timed), ceilings (bandwidth and matrix rate per device), floors
(bytes and FLOPs per call), timing (CUDA events, L2 flush, graph capture), inputs (seeded random tensors),
measure (one path at one point: timed, checked), moe / gdn / gdn_stages / gdn_layer (the sweeps; gdn_stages:
the staged GDN layer's conv and gated norm), table (fastest correct
path per range -> the dispatch file), report (console, JSON, Markdown), progress, cli. With --sweep-configs:
config_space (the Triton kernels' candidate block configs), precompile (compiling them in parallel),
config_sweep (timing them), config_choice (fastest correct per T, the table to paste).
Imports stay light (torch and the project's own packages): it runs as `python -m harness.tune` on a machine
that has only torch and triton.

May import: `model`. Nothing else of ours (not `bench`, `serving`, `gates`): the serving machine may lack them.
"""
