"""Project-wide pytest configuration: command-line options, GPU detection, hypothesis profiles.

Profiles (pick one with `--hypothesis-profile NAME`; `ci` is the default when the CI variable is set):
- `dev`: few examples, quick feedback on a laptop;
- `ci`: more examples, no deadline, derandomised so a CI run is reproducible;
- `gpu`: for runs on an accelerator at the real model's dimensions, where one example is expensive.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "gpu",
    max_examples=15,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist every worker is a process: one intra-op thread each, or torch's thread pools
    # oversubscribe the cores and small kernels slow down tenfold.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("qwen36", "Qwen3.6 serving harness")
    group.addoption(
        "--server-url",
        default=None,
        help="Base URL of a live OpenAI-compatible server (e.g. http://10.0.0.5:8000). "
        "Without it, server suites start the embedded tiny vLLM CPU server.",
    )
    group.addoption(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="With --server-url: the key the server wants (vLLM's --api-key), sent as a Bearer token by every "
        "server suite (default: $OPENAI_API_KEY).",
    )
    group.addoption(
        "--target-name",
        default=None,
        help="Name of the server under test for API-conformance snapshots "
        "(tests/api_conformance/snapshots/<name>/). Default: tiny-cpu for the embedded server, "
        "else derived from --server-url.",
    )
    group.addoption(
        "--baseline-profile",
        default=None,
        help="Name of a baseline under fixtures/baselines/ that perf gates compare against.",
    )
    group.addoption(
        "--accept-difference",
        default=[],
        type=lambda text: [x.strip() for x in text.split(",") if x.strip()],
        help="Perf gates: identity fields allowed to differ from the baseline (datasets, model, "
        "model_files_sha256, server_args), comma-separated; the gate report lists them.",
    )
    group.addoption(
        "--gate-repeats",
        default=3,
        type=int,
        help="Live perf gates: how many times the baseline's workload preset is run against the server (default 3).",
    )
    group.addoption(
        "--tokenizer",
        default=None,
        help="Live perf gates: the served model's tokenizer.json or its directory, to size official-like prompts "
        "as the server counts them; give the one the baseline was recorded with (default: about 4 characters "
        "a token).",
    )
    group.addoption(
        "--no-machine-speed",
        action="store_true",
        help="Live perf gates against a server on this machine: do not measure the machine's speed probe, so the "
        "baseline is compared as recorded (for a machine busy with other work, which the probe would measure "
        "instead of the machine; docs/perf-gates.md).",
    )
    group.addoption(
        "--baselines-dir",
        default=None,
        help="Perf gates: where the baseline profiles are (default: fixtures/baselines).",
    )


def cuda_unavailable_reason() -> str | None:
    """Why `gpu` tests cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (CPU build)"
        return f"no CUDA device: torch {torch.__version__} built with {built} sees none"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--server-url"):
        skip_live = pytest.mark.skip(reason="`live` tests measure a live server: give --server-url http://HOST:PORT")
        for item in items:
            if item.get_closest_marker("live"):
                item.add_marker(skip_live)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)
