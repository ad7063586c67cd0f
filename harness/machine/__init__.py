"""What the machine is and does while it is measured: `speed` (its kind and a small speed probe, for recorded
profiles by hand and the live gate; CI's paired verdicts use neither), `hardware` (accelerator utilisation,
memory, power, sampled during a run), `prometheus` (the server's own /metrics, before and after a run).

May import: `errors`, `paths`. Nothing else of ours.
"""
