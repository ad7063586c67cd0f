"""OpenAI-semantics checks over one answer. Each returns a list of problems (empty: conforms), so a test
reports every problem of a case at once."""
from __future__ import annotations

import json

import jsonschema

from tests.api_conformance import assemble
from tests.api_conformance.corpus import RequestCase
from tests.api_conformance.transport import Exchange

FINISH_REASONS = {"stop", "length", "tool_calls"}


def error_shape(ex: Exchange) -> list[str]:
    """An OpenAI error body: {"error": {"message": str, "type": str, "param": ..., ...}}."""
    err = ex.body.get("error") if isinstance(ex.body, dict) else None
    if not isinstance(err, dict):
        return [f"HTTP {ex.status} body is not an OpenAI error object: {ex.text[:200]!r}"]
    problems = []
    for key in ("message", "type"):
        if not isinstance(err.get(key), str) or not err[key]:
            problems.append(f"error.{key} missing or empty: {err!r}")
    if "param" not in err:
        problems.append(f"error.param key missing: {err!r}")
    return problems


def openai_error(case: RequestCase, ex: Exchange) -> list[str]:
    """OpenAI's spelling of a 4xx: error.type "invalid_request_error" and error.param the request field as
    the client sent it (exactly the case's `error_param`), never a server-side location like "body.x"."""
    if not 400 <= ex.status < 500:
        return [f"status {ex.status}, not a 4xx refusal: {ex.text[:200]!r}"]
    err = ex.body.get("error") if isinstance(ex.body, dict) else None
    if not isinstance(err, dict):
        return [f"HTTP {ex.status} body is not an OpenAI error object: {ex.text[:200]!r}"]
    problems = []
    if err.get("type") != "invalid_request_error":
        problems.append(f"error.type {err.get('type')!r}, OpenAI says 'invalid_request_error'")
    param = err.get("param")
    if "error_param" in case.expect and param != case.expect["error_param"]:
        problems.append(f"error.param {param!r}, expected the field {case.expect['error_param']!r}")
    elif isinstance(param, str) and param.split(".")[0] == "body":
        problems.append(f"error.param {param!r} is the server's location, not a request field")
    return problems


def openai_error_code(case: RequestCase, ex: Exchange) -> list[str]:
    """OpenAI's error.code: a string or null, never the HTTP status (clients branch on it, e.g. compact the
    conversation on "context_length_exceeded"); exactly the case's `error_code` when it gives one."""
    err = ex.body.get("error") if isinstance(ex.body, dict) else None
    if not isinstance(err, dict) or "code" not in err:
        return [f"HTTP {ex.status} body has no error.code: {ex.text[:200]!r}"]
    code, problems = err["code"], []
    if code is not None and not isinstance(code, str):
        problems.append(f"error.code {code!r} is a {type(code).__name__}: OpenAI's is a string or null")
    if "error_code" in case.expect and code != case.expect["error_code"]:
        problems.append(f"error.code {code!r}, expected {case.expect['error_code']!r}")
    return problems


def names_param(param: object, field: str) -> bool:
    # vLLM reports request-validation errors at their FastAPI location ("body.max_tokens").
    return param == field or param == f"body.{field}"


def semantics(case: RequestCase, ex: Exchange) -> list[str]:
    exp = case.expect
    problems: list[str] = []
    if "status" in exp and ex.status != exp["status"]:
        problems.append(f"status {ex.status}, expected {exp['status']}: {ex.text[:300]!r}")
    if ex.status >= 400:
        problems += error_shape(ex)
        if "error_param" in exp:
            param = (ex.body.get("error") or {}).get("param") if isinstance(ex.body, dict) else None
            if not names_param(param, exp["error_param"]):
                problems.append(f"error.param {param!r} does not name {exp['error_param']!r}")
    views = assemble.choices(ex) if ex.status == 200 else {}
    if "choices" in exp and ex.status == 200 and len(views) != exp["choices"]:
        problems.append(f"{len(views)} choices, expected {exp['choices']}")
    if "choices_or_4xx" in exp:
        if ex.status == 200 and len(views) != exp["choices_or_4xx"]:
            problems.append(f"200 with {len(views)} choices, expected {exp['choices_or_4xx']}")
        elif ex.status != 200 and not 400 <= ex.status < 500:
            problems.append(f"status {ex.status}: neither an answer nor a clear 4xx refusal")
    if "max_seconds" in exp and ex.elapsed_s > exp["max_seconds"]:
        problems.append(f"took {ex.elapsed_s:.1f} s, bound {exp['max_seconds']} s")
    calls = [tc for v in views.values() for tc in v.tool_calls]
    if exp.get("tool_calls") == "required" and not calls:
        problems.append("tool_calls required but the answer has none "
                        f"(finish_reason {[v.finish_reasons for v in views.values()]})")
    if exp.get("tool_calls") == "forbidden" and calls:
        problems.append(f"tool_choice none but the answer calls {[c.name for c in calls]}")
    if "tool_name" in exp and any(c.name != exp["tool_name"] for c in calls):
        problems.append(f"named tool_choice {exp['tool_name']!r} but calls {[c.name for c in calls]}")
    if "finish_reason" in exp:
        got = [r for v in views.values() for r in v.finish_reasons]
        if got != [exp["finish_reason"]] * len(views):
            problems.append(f"finish_reason {got}, expected {exp['finish_reason']!r}")
    if "echo_prompt" in exp and not all(v.content.startswith(exp["echo_prompt"]) for v in views.values()):
        problems.append("echo=true but a choice's text does not start with the prompt")
    if "prompt_tokens" in exp:
        u = assemble.usage(ex) or {}
        if u.get("prompt_tokens") != exp["prompt_tokens"]:
            problems.append(f"prompt_tokens {u.get('prompt_tokens')}, expected {exp['prompt_tokens']}")
    return problems


def tool_arguments(case: RequestCase, ex: Exchange) -> list[str]:
    """Every tool call names a tool of the request; arguments that are JSON at all must be an object that
    validates against the tool's schema; with finish_reason tool_calls they must be JSON. Only truncated
    output (finish_reason length) may carry arguments that are not JSON."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in case.body.get("tools", [])}
    problems = []
    for index, view in assemble.choices(ex).items():
        for tc in view.tool_calls:
            where = f"choice {index} tool call {tc.name!r}"
            if tc.name not in schemas:
                problems.append(f"{where}: not a tool of the request {sorted(schemas)}")
                continue
            try:
                args = json.loads(tc.arguments)
            except ValueError:
                if "tool_calls" in view.finish_reasons:
                    problems.append(f"{where}: arguments are not JSON with finish_reason tool_calls: "
                                    f"{tc.arguments[:200]!r}")
                continue
            if not isinstance(args, dict):
                problems.append(f"{where}: arguments are JSON {type(args).__name__}, not an object")
                continue
            try:
                jsonschema.validate(args, schemas[tc.name])
            except jsonschema.ValidationError as exc:
                problems.append(f"{where}: arguments {args} violate the schema ({exc.message}); "
                                f"finish_reason {view.finish_reasons}")
    return problems


def stream_framing(ex: Exchange) -> list[str]:
    """SSE order: JSON events, one finish_reason per choice, the usage event after them, [DONE] last."""
    problems = []
    if not ex.events or ex.events[-1] != "[DONE]":
        problems.append(f"last event is {ex.raw_events[-1:]!r}, not [DONE]")
    if ex.events.count("[DONE]") != 1:
        problems.append(f"[DONE] sent {ex.events.count('[DONE]')} times")
    events = [e for e in ex.events if e != "[DONE]"]
    bad = [e for e in events if not isinstance(e, dict) or "__unparsed__" in e or "choices" not in e]
    if bad:
        problems.append(f"events that are not chunk objects: {bad[:2]!r}")
        return problems
    finished: dict[int, int] = {}
    for pos, e in enumerate(events):
        for ch in e["choices"]:
            if ch["index"] in finished and ch.get("finish_reason") is None:
                problems.append(f"choice {ch['index']} has a delta at event {pos} after its finish_reason")
            if ch.get("finish_reason") is not None:
                if ch["index"] in finished:
                    problems.append(f"choice {ch['index']} has a second finish_reason at event {pos}")
                finished[ch["index"]] = pos
            if ch.get("finish_reason") not in (None, *FINISH_REASONS):
                problems.append(f"choice {ch['index']}: unknown finish_reason {ch['finish_reason']!r}")
    usage_at = [pos for pos, e in enumerate(events) if e.get("usage")]
    if len(usage_at) != 1:
        problems.append(f"{len(usage_at)} usage events (include_usage asks for one)")
    elif finished and usage_at[0] < max(finished.values()):
        problems.append("usage event comes before a choice's finish_reason")
    elif events[usage_at[0]]["choices"]:
        problems.append("the usage event carries choices")
    return problems


def nonstream_choices(ex: Exchange) -> list[str]:
    chs = ex.body.get("choices") or []
    problems = []
    if sorted(c["index"] for c in chs) != list(range(len(chs))):
        problems.append(f"choice indices {[c['index'] for c in chs]} are not 0..n-1")
    for c in chs:
        if c.get("finish_reason") not in FINISH_REASONS:
            problems.append(f"choice {c['index']}: finish_reason {c.get('finish_reason')!r}")
    return problems


def usage_arithmetic(case: RequestCase, ex: Exchange) -> list[str]:
    u = assemble.usage(ex)
    if not u:
        return ["no usage in the answer"]
    problems = []
    p, c, t = u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")
    if not all(isinstance(x, int) for x in (p, c, t)):
        return [f"usage counts are not integers: {u}"]
    if t != p + c:
        problems.append(f"total_tokens {t} != prompt_tokens {p} + completion_tokens {c}")
    if p < 1 or c < 1:
        problems.append(f"prompt_tokens {p} and completion_tokens {c} must both be >= 1")
    n_choices = len(assemble.choices(ex))
    max_tokens = case.body.get("max_tokens")
    if max_tokens is not None and c > max_tokens * n_choices:
        problems.append(f"completion_tokens {c} > max_tokens {max_tokens} x {n_choices} choices")
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if reasoning is not None and not 0 <= reasoning <= c:
        problems.append(f"reasoning_tokens {reasoning} outside 0..completion_tokens {c}")
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None and not 0 <= cached <= p:
        problems.append(f"cached_tokens {cached} outside 0..prompt_tokens {p}")
    return problems
