"""The conformance checkers can fail: hand-made answers with one defect each are reported, and a
well-formed answer is not. No server needed."""
from __future__ import annotations

import copy

import pytest

from tests.api_conformance import checks
from tests.api_conformance.corpus import RequestCase
from tests.api_conformance.normalise import normalise_exchange
from tests.api_conformance.transport import Exchange

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CASE = RequestCase(name="t", family="f", body={"messages": [], "tools": TOOLS, "max_tokens": 8},
                   expect={"status": 200, "tool_calls": "required", "choices": 1})


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    if usage is not None:
        return {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return {"id": "x", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
GOOD_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "get_weather"}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}, finish="tool_calls"),
    chunk(usage=USAGE),
    "[DONE]",
]


def stream(events: list) -> Exchange:
    return Exchange(status=200, elapsed_s=0.1, events=events, raw_events=[str(e) for e in events])


def nonstream(message: dict, finish: str = "tool_calls", usage: dict = USAGE) -> Exchange:
    body = {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
    return Exchange(status=200, elapsed_s=0.1, body=body)


def test_well_formed_stream_passes_every_check() -> None:
    ex = stream(GOOD_STREAM)
    assert checks.stream_framing(ex) == []
    assert checks.semantics(CASE, ex) == []
    assert checks.tool_arguments(CASE, ex) == []
    assert checks.usage_arithmetic(CASE, ex) == []


@pytest.mark.parametrize("defect, events", [
    ("no [DONE]", GOOD_STREAM[:-1]),
    ("[DONE] not last", GOOD_STREAM[:3] + ["[DONE]"] + GOOD_STREAM[3:]),
    ("two finish_reasons", GOOD_STREAM[:3] + [chunk({}, finish="stop")] + GOOD_STREAM[3:]),
    ("delta after finish", GOOD_STREAM[:3] + [chunk({"content": "x"})] + GOOD_STREAM[3:]),
    ("usage before finish", GOOD_STREAM[:2] + [GOOD_STREAM[3], GOOD_STREAM[2], "[DONE]"]),
    ("no usage", GOOD_STREAM[:3] + ["[DONE]"]),
])
def test_stream_framing_reports_the_defect(defect: str, events: list) -> None:
    assert checks.stream_framing(stream(events)), defect


def test_schema_violating_arguments_are_reported_even_when_truncated() -> None:
    ex = nonstream({"role": "assistant", "content": "",
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": "{}"}}]}, finish="length")
    assert any("violate the schema" in p for p in checks.tool_arguments(CASE, ex))


def test_non_json_arguments_are_reported_only_with_finish_reason_tool_calls() -> None:
    msg = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"ci'}}]}
    assert checks.tool_arguments(CASE, nonstream(msg, finish="length")) == []
    assert checks.tool_arguments(CASE, nonstream(msg, finish="tool_calls"))


def test_unknown_tool_name_is_reported() -> None:
    ex = nonstream({"role": "assistant", "tool_calls": [{"function": {"name": "rm_rf", "arguments": "{}"}}]})
    assert any("not a tool of the request" in p for p in checks.tool_arguments(CASE, ex))


def test_missing_required_tool_call_is_reported() -> None:
    ex = nonstream({"role": "assistant", "content": "hi"}, finish="stop")
    assert any("tool_calls required" in p for p in checks.semantics(CASE, ex))


def test_usage_that_does_not_add_up_is_reported() -> None:
    bad = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 9}
    assert checks.usage_arithmetic(CASE, nonstream({"role": "assistant", "content": "x"}, usage=bad))
    over = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    assert checks.usage_arithmetic(CASE, nonstream({"role": "assistant", "content": "x"}, usage=over))


@pytest.mark.parametrize("error", [
    {"message": "bad"},  # no type
    {"type": "BadRequestError", "message": ""},  # empty message
    {"type": "BadRequestError", "message": "bad"},  # no param key
])
def test_error_body_missing_openai_fields_is_reported(error: dict) -> None:
    assert checks.error_shape(Exchange(status=400, elapsed_s=0.0, body={"error": error}))


def test_error_param_must_name_the_field() -> None:
    case = RequestCase(name="e", family="f", body={}, expect={"status": 400, "error_param": "max_tokens"})
    wrong = Exchange(status=400, elapsed_s=0.0, body={"error": {"type": "t", "message": "m", "param": "messages"}})
    right = Exchange(status=400, elapsed_s=0.0, body={"error": {"type": "t", "message": "m", "param": "max_tokens"}})
    assert checks.semantics(case, wrong) and checks.semantics(case, right) == []


def test_error_code_must_be_openai_string_or_null_and_the_case_code() -> None:
    case = RequestCase(name="e", family="f", body={}, expect={"status": 400, "error_code": "context_length_exceeded"})
    plain = RequestCase(name="p", family="f", body={}, expect={"status": 400})

    def ex(code):
        return Exchange(status=400, elapsed_s=0.0, body={"error": {"type": "t", "message": "m", "param": None,
                                                                   "code": code}})

    assert checks.openai_error_code(plain, ex(400)) and checks.openai_error_code(plain, ex(None)) == []
    assert checks.openai_error_code(case, ex(None)) and checks.openai_error_code(case, ex("model_not_found"))
    assert checks.openai_error_code(case, ex("context_length_exceeded")) == []
    no_code = Exchange(status=400, elapsed_s=0.0, body={"error": {"type": "t", "message": "m", "param": None}})
    assert checks.openai_error_code(plain, no_code)


def test_a_prompt_beyond_the_context_is_sized_from_the_served_context() -> None:
    from tests.api_conformance.corpus import case as corpus_case

    c = corpus_case("chat_prompt_beyond_context")
    assert c.needs_context_length
    words = c.request_body("m", 100)["messages"][0]["content"].split()
    assert len(words) > 100 and set(words) == {"hello"}
    with pytest.raises(ValueError, match="give context_tokens"):
        c.request_body("m")


def test_normalisation_hides_text_and_ids_but_keeps_names_and_counts() -> None:
    a = nonstream({"role": "assistant", "content": "hello",
                   "tool_calls": [{"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "A"}'}}]})
    b = copy.deepcopy(a)
    b.body["choices"][0]["message"]["content"] = "other words"
    b.body["choices"][0]["message"]["tool_calls"][0].update(id="call_2", function={"name": "get_weather",
                                                                                   "arguments": '{"city": "B"}'})
    assert normalise_exchange(a) == normalise_exchange(b)
    c = copy.deepcopy(a)
    c.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "get_time"
    d = copy.deepcopy(a)
    d.body["usage"]["completion_tokens"] = 4
    e = copy.deepcopy(a)
    e.body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": '
    assert all(normalise_exchange(x) != normalise_exchange(a) for x in (c, d, e))


REFUSAL = RequestCase(name="r", family="f", body={"messages": "hello"},
                      expect={"status": 400, "error_param": "messages"})


def refusal(err: dict, status: int = 400) -> Exchange:
    return Exchange(status=status, elapsed_s=0.1, body={"error": err}, text=str(err))


def test_openai_error_check_passes_openai_shape_and_catches_vllms():
    ok = {"message": "messages: Input should be a valid list", "type": "invalid_request_error",
          "param": "messages", "code": 400}
    assert checks.openai_error(REFUSAL, refusal(ok)) == []
    stock = {**ok, "type": "Bad Request", "param": "body.messages"}
    problems = checks.openai_error(REFUSAL, refusal(stock))
    assert any("'Bad Request'" in p for p in problems) and any("body.messages" in p for p in problems)
    untyped = RequestCase(name="j", family="f", raw="{", expect={"status": 400})
    assert checks.openai_error(untyped, refusal({**ok, "param": "body.60"})) == [
        "error.param 'body.60' is the server's location, not a request field"]
    assert checks.openai_error(untyped, refusal({**ok, "param": None})) == []
    assert checks.openai_error(REFUSAL, refusal(ok, status=500))  # not a refusal at all


def test_every_mended_deviation_names_a_patch_of_the_set_and_only_stock_targets():
    from tests.api_conformance.deviations import deviations

    pytest.importorskip("torch", reason="the patch catalog imports the MoE patch, which needs torch")
    from patches.catalog import PATCHES

    names = {p.name for p in PATCHES}
    mended = [d for d in deviations() if d.get("mended_by")]
    assert mended, "deviations.yaml lists no mended deviation"
    for d in mended:
        assert d["mended_by"] in names, f"{d['id']}: mended_by {d['mended_by']!r} is not in {sorted(names)}"
        assert all(t.endswith("-stock") for t in d["targets"]), d
