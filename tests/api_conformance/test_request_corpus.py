"""Every request-corpus case against the server under test: its normalised answer is the target's
snapshot, and the OpenAI semantics the platform relies on are asserted beside it."""
from __future__ import annotations

import pytest

from tests.api_conformance import assemble, checks
from tests.api_conformance.corpus import RequestCase, case, request_cases
from tests.api_conformance.deviations import deviation_for, expect_deviation
from tests.api_conformance.normalise import normalise_exchange
from tests.api_conformance.transport import send

pytestmark = pytest.mark.server

CASES = request_cases()
STREAMS = [c for c in CASES if c.stream]
WITH_TOOLS = [c for c in CASES if c.body and c.body.get("tools")]
SUCCESSFUL = [c for c in CASES if c.expect.get("status") == 200]
REFUSED = [c for c in CASES if c.expect.get("status", 200) >= 400]
GREEDY_PAIRS = [c for c in CASES if c.greedy_pair]
SAME_PROMPT = [c for c in CASES if c.same_prompt_as]


def ids(c: RequestCase) -> str:
    return c.name


def ok_answer(c: RequestCase, answer, target: str):
    """The case's 200 answer; a case whose refusal is a known deviation is skipped, naming it (the
    semantics test already holds it as a strict xfail)."""
    ex = answer(c)
    if ex.status != 200:
        d = deviation_for(c.name, "semantics", target)
        if d is not None:
            pytest.skip(f"no answer to check: known deviation [{d['id']}]")
    assert ex.status == 200, ex.text[:300]
    return ex


@pytest.mark.parametrize("c", CASES, ids=ids)
def test_normalised_answer_matches_target_snapshot(c: RequestCase, answer, target_snapshot) -> None:
    assert normalise_exchange(answer(c)) == target_snapshot


@pytest.mark.parametrize("c", CASES, ids=ids)
def test_answer_has_the_openai_semantics_the_platform_relies_on(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "semantics", conformance_target)
    assert checks.semantics(c, answer(c)) == []


@pytest.mark.parametrize("c", WITH_TOOLS, ids=ids)
def test_tool_call_arguments_are_json_objects_valid_for_the_tool_schema(c, answer, conformance_target,
                                                                         request) -> None:
    expect_deviation(request, c.name, "tool_arguments", conformance_target)
    assert checks.tool_arguments(c, answer(c)) == []


@pytest.mark.parametrize("c", STREAMS, ids=ids)
def test_stream_has_one_finish_reason_per_choice_then_usage_then_done_last(c, answer, conformance_target) -> None:
    ex = ok_answer(c, answer, conformance_target)
    assert checks.stream_framing(ex) == []


@pytest.mark.parametrize("c", [c for c in SUCCESSFUL if not c.stream], ids=ids)
def test_nonstream_answer_has_one_finish_reason_per_choice(c, answer, conformance_target) -> None:
    ex = ok_answer(c, answer, conformance_target)
    assert checks.nonstream_choices(ex) == []


@pytest.mark.parametrize("c", SUCCESSFUL, ids=ids)
def test_usage_adds_up(c, answer, conformance_target) -> None:
    ex = ok_answer(c, answer, conformance_target)
    assert checks.usage_arithmetic(c, ex) == []


@pytest.mark.parametrize("c", GREEDY_PAIRS, ids=lambda c: f"{c.name}-vs-{c.greedy_pair}")
def test_greedy_stream_text_equals_nonstream_text(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "stream_text", conformance_target)
    plain, streamed = answer(c), answer(case(c.greedy_pair))
    assert plain.status == streamed.status == 200
    assert assemble.choices(streamed) == assemble.choices(plain)


@pytest.mark.parametrize("c", GREEDY_PAIRS, ids=lambda c: f"{c.name}-vs-{c.greedy_pair}")
def test_greedy_stream_usage_equals_nonstream_usage(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "stream_usage", conformance_target)
    plain, streamed = assemble.usage(answer(c)), assemble.usage(answer(case(c.greedy_pair)))

    def counts(u: dict) -> dict:
        return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
                "reasoning_tokens": (u.get("completion_tokens_details") or {}).get("reasoning_tokens")}

    assert counts(streamed) == counts(plain)


@pytest.mark.parametrize("c", SAME_PROMPT, ids=lambda c: f"{c.name}-vs-{c.same_prompt_as}")
def test_equivalent_requests_give_the_same_prompt(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "same_prompt", conformance_target)
    a, b = answer(c), answer(case(c.same_prompt_as))
    assert (a.status, b.status) == (200, 200), f"{c.name}: {a.text[:200]!r}; {c.same_prompt_as}: {b.text[:200]!r}"
    assert assemble.usage(a)["prompt_tokens"] == assemble.usage(b)["prompt_tokens"]


@pytest.mark.parametrize("c", REFUSED, ids=ids)
def test_refusal_has_openai_error_type_and_param(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "error_shape", conformance_target)
    assert checks.openai_error(c, answer(c)) == []


@pytest.mark.parametrize("c", REFUSED, ids=ids)
def test_refusal_error_code_is_openai_string_or_null(c, answer, conformance_target, request) -> None:
    expect_deviation(request, c.name, "error_code", conformance_target)
    assert checks.openai_error_code(c, answer(c)) == []


@pytest.mark.parametrize("c", REFUSED, ids=ids)
def test_server_still_answers_after_a_refused_request(c, answer, openai_server) -> None:
    refused = answer(c)
    assert 400 <= refused.status < 500, refused.text[:300]
    after = send(openai_server, "chat", {
        "model": openai_server.model, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2,
    }, timeout_s=60)
    assert after.status == 200, after.text[:300]
