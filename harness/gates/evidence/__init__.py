"""What the paired gates can see, measured: `calibrate` (A/A controls and slowed twins, the tolerances sized from
them) and `slower_commits` (real slower commits kept as fixtures, replayed through `qwen36 ab` against their
parent)."""
