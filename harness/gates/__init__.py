"""Perf verdicts: `paired` and `interleave` (two servers measured block by block in one run, the verdict on
per-pair ratios: what CI gates on), `calibrate` (sizes the paired tolerances from A/A controls), `gate`,
`baseline`, `record`, `compare` (a run against a recorded profile: the live gate), `decision` (the statistics),
`servers` and `reference` (the servers CI compares: the session's twin, no-cache, moe-on, the reference
commit's), `measure` (a bench run for a gate), `identity`, `commands` (the `qwen36` subcommands).

May import: `bench`, `serving`, `machine`, `errors`, `paths`, `patches`. Not `presubmit` or `tune`.
"""
