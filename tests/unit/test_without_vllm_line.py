"""The line `make test` ends with where vLLM's CPU build did not install (tests/without_vllm.py): computed from what
the run deselected and skipped, a folder named when none of its tests ran."""
from __future__ import annotations

from tests.without_vllm import places, summary


def test_a_folder_is_named_when_none_of_its_tests_ran_else_its_files():
    left_out = {"tests/api/a.py": 3, "tests/api/b.py": 2, "tests/unit/c.py": 1, "tests/unit/d.py": 4}
    totals = {"tests/api/a.py": 3, "tests/api/b.py": 2, "tests/unit/c.py": 5, "tests/unit/d.py": 4,
              "tests/unit/e.py": 7, "tests/numerics/f.py": 9}
    assert places(left_out, totals, {"tests/patches/g.py"}) == [
        "tests/api", "tests/patches", "tests/unit/c.py (1 of 5)", "tests/unit/d.py"]


def test_the_line_counts_the_deselected_and_the_skips_that_name_vllm_and_says_where_they_run():
    line = summary({"tests/perf/a.py": 4, "tests/unit/b.py": 1}, {"tests/unit/b.py": 9, "tests/unit/c.py": 3},
                   {"tests/patches/p.py": "Skipped: could not import 'vllm'"}, {"tests/unit/c.py": 1})
    assert line.startswith("skipped without vLLM's CPU build: tests/patches, tests/perf, tests/unit/b.py (1 of 10), "
                           "tests/unit/c.py (1 of 3) (5 tests marked server or timing; 1 module and 1 test that "
                           "skip without vLLM); run them on Linux x86_64 with `make test`, or in a container: "
                           "docker run")
    assert "\n" not in line
    assert summary({}, {"tests/unit/b.py": 2}, {}, {}).endswith("nothing (no test here needs vLLM)")
