"""`qwen36 tune`: time every registered path of the model's blocks on the serving machine, check each output
against the float64 reference, and write the device's dispatch table plus a JSON + Markdown report; then gate
later code against that table.

One subpackage per concern, top layer first (import-linter contract `tune` in pyproject.toml):
- `args` (the command line, importing nothing heavy), `cli` (the recording run: sweep, time, write the table);
- `ab/`: `--ab REF_DIR`, this checkout's kernels against a reference's, interleaved in one run;
- `check/`: `--check` and `--check-stale`, the GPU perf gate against the device's table, and its rule;
  `configs/`: `moe --sweep-configs`, the Triton kernels' block configs searched;
- `step/`: `tune step`, the whole per-rank decode step, eager and graph, its launch counter, and the step as a
  gated point;
- `blocks/`: the sweeps of each block's paths (MoE, GDN rule, GDN layer and its stages, attention and norms);
- `table/`: from measurements to the dispatch table, its recorded timings and the report;
- `measure/`: one path at one point timed and checked, the shapes, inputs, floors and ceilings.

Imports stay light (torch and the project's own packages): it runs as `python -m harness.tune` on a machine
that has only torch and triton.

May import: `model`. Nothing else of ours (not `bench`, `serving`, `gates`): the serving machine may lack them.
"""
