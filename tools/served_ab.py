"""`qwen36 ab` on the embedded CPU server: the served substitutions forced on (B) against off (A), both eager.

Starts two embedded tiny servers, eager as the platform runs (`--enforce-eager`; prefix caching on, vLLM's default and
the platform's), B with harness.gates.servers' substitution switches (`SUBSTITUTIONS_ON`: the routed experts, the
router and the served blocks, forced), then runs `qwen36 ab --a A --b B` with the paired preset and writes its
report under --out.

    PYTHONPATH=. .venv/bin/python tools/served_ab.py --client-cpus 1 --out runs/served-ab
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.cli import main as qwen36
from harness.gates.servers import SUBSTITUTIONS_ON
from harness.serving.launcher import embedded_server
from harness.serving.tiny_model import build_tiny_model

EAGER = ("--enforce-eager",)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client-cpus", default=None, help="passed to qwen36 ab")
    p.add_argument("--out", type=Path, default=Path("runs/served-ab"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qwen36-served-ab-") as d:
        model = build_tiny_model(Path(d) / "tiny-model")
        with embedded_server(Path(d) / "a", model, extra_args=EAGER) as off, \
                embedded_server(Path(d) / "b", model, extra_args=EAGER, env=dict(SUBSTITUTIONS_ON)) as on:
            args = ["ab", "--a", off.base_url, "--b", on.base_url, "--tokenizer", str(model), "--out", str(a.out)]
            if a.client_cpus:
                args += ["--client-cpus", a.client_cpus]
            return qwen36(args)


if __name__ == "__main__":
    sys.exit(main())
