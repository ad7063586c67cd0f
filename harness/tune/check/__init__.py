"""`qwen36 tune --check` and `--check-stale`: the GPU perf gate against the device's dispatch table.

`plan` (what is timed, read from the table), `run` (times it and judges it), `rule` (slower than its record,
still the fastest path: numbers alone), `device_table` (which table this device reads, or why none),
`add_run` (a reviewed run added to the table's timings), `inject` (a known slowdown, to prove what is caught).
"""
