"""`qwen36 tune --ab REF_DIR`: this checkout's kernels against a reference's, timed in one run.

`run` coordinates (the points from check/plan.py, interleaved sweeps, the report), `worker` is one side's process
(the `model` of one root, this checkout's harness), `rule` judges the paired times on numbers alone.
"""
