"""From measurements to the device's dispatch table and to the report people read.

`build` (the fastest correct path per range -> the table), `record` (the table's recorded timings, run by run),
`sweeps` (several sweeps of one point merged into one row), `block_rows` (which table choice a timed row stands
for), `targets` (the issues' targets judged), `report` (console, JSON, Markdown).
"""
