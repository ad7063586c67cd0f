"""The performance history: every gated figure over commits, per machine kind (docs/history.md).

`record` (one run's figures) and `store` (a folder of the repository, one file per run), `sources` (a harness run
directory to records), `backfill` (what reports/ and git already hold), `site` (the page, by asv's publisher),
`serve` and `cli` (`qwen36 history`).
"""
