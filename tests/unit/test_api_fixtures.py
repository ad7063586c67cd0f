"""The API-conformance fixtures' loaders refuse what they would otherwise ignore: unknown case or `expect`
keys in fixtures/api/requests.yaml, a deviation id used twice in fixtures/api/deviations.yaml. The
requests.yaml header lists exactly the keys the loader accepts, and checks.py reads exactly those."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from tests.api_conformance import corpus
from tests.api_conformance.deviations import check_deviations, deviations

CHECKS_PY = Path(corpus.__file__).with_name("checks.py")


def _header_keys() -> tuple[list[str], list[str]]:
    """(case keys, expect keys) listed in the header comment of requests.yaml."""
    case_keys, expect_keys, in_expect = [], [], False
    for line in corpus.REQUESTS_FILE.read_text().splitlines():
        if not line.startswith("#"):
            break
        if m := re.match(r"#   (\w+):", line):
            case_keys.append(m[1])
            in_expect = m[1] == "expect"
        elif in_expect and (m := re.match(r"#     (\w+):", line)):
            expect_keys.append(m[1])
        else:
            in_expect = False
    return case_keys, expect_keys


def _with_case(name: str, spec: dict) -> dict:
    raw = copy.deepcopy(corpus._raw())
    raw["cases"][name] = spec
    return raw


def test_the_corpus_loads_and_its_header_lists_every_accepted_key():
    assert corpus.request_cases()
    case_keys, expect_keys = _header_keys()
    assert sorted(case_keys) == sorted(corpus.case_keys())
    assert sorted(expect_keys) == sorted(corpus.EXPECT_KEYS)


def test_the_declared_expect_keys_are_the_ones_checks_py_reads():
    source = CHECKS_PY.read_text()
    read = set(re.findall(r"""exp(?:ect)?(?:\.get\(|\[)["'](\w+)["']""", source))
    read |= set(re.findall(r"""["'](\w+)["'] in (?:case\.)?exp(?:ect)?\b""", source))
    assert read == set(corpus.EXPECT_KEYS)


def test_an_unknown_expect_key_names_the_case_the_key_and_the_known_keys():
    raw = _with_case("chat_typo", {"family": "chat", "body": {"messages": []}, "expect": {"status": 200, "chioces": 1}})
    with pytest.raises(ValueError, match=r"case 'chat_typo' has unknown expect key\(s\) \['chioces'\]") as err:
        corpus.build_cases(raw)
    assert all(k in str(err.value) for k in corpus.EXPECT_KEYS)


def test_an_unknown_case_key_or_matrix_expect_key_is_refused():
    with pytest.raises(ValueError, match=r"case 'chat_typo' has unknown key\(s\) \['expects'\]"):
        corpus.build_cases(_with_case("chat_typo", {"family": "chat", "body": {}, "expects": {"status": 200}}))
    raw = copy.deepcopy(corpus._raw())
    raw["tool_choice_matrix"]["choices"]["none"]["expect"]["tool_call"] = "forbidden"
    with pytest.raises(ValueError, match=r"matrix choice 'none' has unknown expect key\(s\) \['tool_call'\]"):
        corpus.build_cases(raw)


def test_deviation_ids_are_unique_and_a_repeated_id_is_refused():
    entries = list(deviations())
    assert len({d["id"] for d in entries}) == len(entries)
    twice = [*entries, {**entries[0], "cases": ["other_case"]}]
    with pytest.raises(ValueError, match=re.escape(f"deviation ids ['{entries[0]['id']}'] are used by more than one")):
        check_deviations(twice)
