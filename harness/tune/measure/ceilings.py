"""Memory bandwidth and matrix rate per device: the two ceilings that turn bytes and FLOPs into floors.

Keyed by the dispatch-table file stem of the device name (model.dispatch.table.table_file_name). Flags
(--hbm-tbps, --peak-tflops) override an entry or stand in for a device that has none; without either the
floors are reported as unknown rather than guessed.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ceilings", "CEILINGS", "ceilings_for"]


@dataclass(frozen=True)
class Ceilings:
    hbm_bytes_per_s: float | None
    matrix_flops_per_s: float | None  # dense bf16 matrix products
    source: str


CEILINGS = {
    # Measured on the H200s this project was lent (2026-10-28 and 2026-11-04): a device-to-device copy
    # moved 4.3 TB/s counting bytes read and written; an 8192^3 bf16 product ran at 769-798 TFLOP/s.
    "nvidia-h200": Ceilings(4.3e12, 7.9e14, "measured H200 copy 4.3 TB/s, bf16 GEMM 790 TFLOP/s"),
    # Measured on a lent H100 80GB HBM3 (2026-12-06, tools/ceilings_probe.py): a 4 GiB device-to-device copy
    # moved 3.02 TB/s (20 reps, 3.02-3.03), bytes read and written; an 8192^3 bf16 product ran at 787 TFLOP/s
    # (782-789). The datasheet's 3.35 TB/s is the bus, not what a copy reaches.
    "nvidia-h100-80gb-hbm3": Ceilings(3.02e12, 7.87e14, "measured H100 copy 3.02 TB/s, bf16 GEMM 787 TFLOP/s"),
    # Vendor datasheet figures for the BI-V100 (HBM2 1.2 TB/s, fp16/bf16 147 TFLOP/s), not measured here:
    # pass --hbm-tbps / --peak-tflops with measured values when you have them.
    "iluvatar-bi-v100": Ceilings(1.2e12, 1.47e14, "BI-V100 datasheet 1.2 TB/s, 147 TFLOP/s (unmeasured)"),
}


def ceilings_for(device_stem: str, hbm_tbps: float | None = None, peak_tflops: float | None = None) -> Ceilings:
    known = CEILINGS.get(device_stem, Ceilings(None, None, f"no entry for {device_stem}"))
    if hbm_tbps is None and peak_tflops is None:
        return known
    return Ceilings(
        hbm_tbps * 1e12 if hbm_tbps is not None else known.hbm_bytes_per_s,
        peak_tflops * 1e12 if peak_tflops is not None else known.matrix_flops_per_s,
        f"flags (--hbm-tbps {hbm_tbps}, --peak-tflops {peak_tflops}); otherwise {known.source}",
    )
