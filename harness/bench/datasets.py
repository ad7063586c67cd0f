"""Workload datasets, each deterministic from a seed: a list of request bodies with tags.

- `official-like`: sessions of cumulative multi-turn agentic conversations (shared system prefix, 29
  JSON-schema tools, assistant tool calls and tool results); each turn resends the whole history so later
  turns can reuse earlier prefixes. Prompts are sized with the server's tokenizer up to a cap.
- `decode-micro`: short prompt, exact output length (`min_tokens` = `max_tokens`, `ignore_eos`).
- `matrix`: one point per (input length, output length); prompts are token ids on `/v1/completions` so
  the input length is exact whatever the tokenizer (as vLLM's random dataset does).
- `replay`: a JSONL file of request bodies (or `{"body": ..., "tags": ...}` lines).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.errors import HarnessError


@dataclass(frozen=True)
class Item:
    body: dict
    tags: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Dataset:
    name: str
    params: dict
    items: list[Item]
    warmup: list[Item]  # sent before measuring; chosen not to pre-fill the measured prefixes

    @property
    def digest(self) -> str:
        blob = json.dumps([[i.body, i.tags] for i in self.items], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


TokenCounter = Callable[[str], int]


def approx_token_count(text: str) -> int:
    """Fallback when no tokenizer is known: about 4 characters per token."""
    return max(1, len(text) // 4)


def tokenizer_counter(tokenizer_json: Path) -> TokenCounter:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer_json))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise HarnessError(f"tokenizer {tokenizer_json}: cannot load ({exc}); give the model directory "
                           "that holds tokenizer.json, or drop --tokenizer to use the 4-chars-per-token estimate") from exc
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


_WORDS = (
    "agent repository function module test build deploy config request response latency cache prefix "
    "decode token server client stream error retry timeout queue worker thread memory kernel expert router "
    "layer attention state value key query batch shard rank tensor gradient file path line column branch "
    "commit merge patch review issue ticket release version schema field record table index search result"
).split()

_TOOL_NAMES = (
    "read_file write_file edit_file list_dir search_code grep_text run_shell run_tests git_status git_diff "
    "git_commit open_url web_search get_weather get_time create_ticket update_ticket close_ticket query_db "
    "send_email schedule_meeting translate_text summarize_doc calc_expression convert_units fetch_metrics "
    "restart_service read_logs deploy_build"
).split()
assert len(_TOOL_NAMES) == 29


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def official_tools(seed: int) -> list[dict]:
    """29 function tools with JSON-schema parameters (required and optional, typed)."""
    rng = random.Random(f"tools:{seed}")
    tools = []
    for name in _TOOL_NAMES:
        props, required = {}, []
        for j in range(rng.randint(1, 3)):
            pname = f"{rng.choice(_WORDS)}_{j}"
            ptype = rng.choice(["string", "integer", "boolean", "number"])
            props[pname] = {"type": ptype, "description": _words(rng, 3)}
            if j == 0 or rng.random() < 0.4:
                required.append(pname)
        tools.append({"type": "function", "function": {
            "name": name, "description": _words(rng, 6),
            "parameters": {"type": "object", "properties": props, "required": required}}})
    return tools


def official_like(seed: int = 0, sessions: int = 4, turns: int = 4, system_tokens: int = 700,
                  user_tokens: int = 60, tool_result_tokens: int = 200, max_tokens: int = 64,
                  prompt_cap_tokens: int = 6000, count: TokenCounter = approx_token_count) -> Dataset:
    rng = random.Random(f"official-like:{seed}")
    tools = official_tools(seed)
    tools_tokens = count(json.dumps(tools))
    system = _sized_text(rng, system_tokens, count)  # the prefix every session shares
    items = []
    for s in range(sessions):
        messages = [{"role": "system", "content": system}]
        for t in range(turns):
            messages.append({"role": "user", "content": f"[session {s} turn {t}] " + _sized_text(rng, user_tokens, count)})
            prompt_tokens = tools_tokens + sum(count(json.dumps(m)) for m in messages)
            if prompt_tokens > prompt_cap_tokens:
                break  # later turns would exceed the cap: end the session here
            items.append(Item(
                {"messages": [dict(m) for m in messages], "tools": tools, "tool_choice": "auto",
                 "max_tokens": max_tokens, "temperature": 0},
                {"session": s, "turn": t, "est_prompt_tokens": prompt_tokens}))
            # History for the next turn: the assistant called a tool, the tool answered.
            tool = rng.choice(tools)["function"]
            args = {k: rng.choice(_WORDS) for k in tool["parameters"]["required"]}
            call_id = f"call_{s}_{t}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": tool["name"], "arguments": json.dumps(args)}}]})
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _sized_text(rng, tool_result_tokens, count)})
    if not items:
        raise HarnessError(f"official-like: the first turn already exceeds prompt_cap_tokens={prompt_cap_tokens}; "
                           "raise the cap or lower system_tokens")
    warm = [Item({"messages": [{"role": "user", "content": "warm up " + _words(rng, 8)}], "max_tokens": 8},
                 {"warmup": True})]
    params = dict(seed=seed, sessions=sessions, turns=turns, system_tokens=system_tokens, user_tokens=user_tokens,
                  tool_result_tokens=tool_result_tokens, max_tokens=max_tokens, prompt_cap_tokens=prompt_cap_tokens)
    return Dataset("official-like", params, items, warm)


def decode_micro(seed: int = 0, requests: int = 8, output_tokens: int = 128, warmup: int = 2) -> Dataset:
    rng = random.Random(f"decode-micro:{seed}")

    def body() -> dict:
        return {"messages": [{"role": "user", "content": "Tell me about " + _words(rng, 6)}],
                "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0}

    items = [Item(body(), {"i": i}) for i in range(requests)]
    warm = [Item(body(), {"warmup": True}) for _ in range(warmup)]
    return Dataset("decode-micro", dict(seed=seed, requests=requests, output_tokens=output_tokens), items, warm)


def matrix_point(seed: int, input_tokens: int, output_tokens: int, requests: int,
                 vocab_low: int = 16, vocab_high: int = 1000) -> Dataset:
    rng = random.Random(f"matrix:{seed}:{input_tokens}:{output_tokens}")

    def body() -> dict:
        return {"prompt": [rng.randrange(vocab_low, vocab_high) for _ in range(input_tokens)],
                "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0}

    items = [Item(body(), {"input_tokens": input_tokens, "output_tokens": output_tokens}) for _ in range(requests)]
    warm = [Item({**body(), "max_tokens": 4, "min_tokens": 4}, {"warmup": True})]
    params = dict(seed=seed, input_tokens=input_tokens, output_tokens=output_tokens, requests=requests,
                  vocab_low=vocab_low, vocab_high=vocab_high)
    return Dataset(f"matrix-i{input_tokens}-o{output_tokens}", params, items, warm)


def replay(path: Path) -> Dataset:
    items = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise HarnessError(f"replay file {path}: cannot read ({exc}); give a JSONL file of request bodies") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HarnessError(f"replay file {path} line {n}: not JSON ({exc.msg}); one request body per line") from exc
        body, tags = (obj["body"], obj.get("tags", {})) if "body" in obj else (obj, {})
        if "messages" not in body and "prompt" not in body:
            raise HarnessError(f"replay file {path} line {n}: neither 'messages' nor 'prompt'; "
                               "each line must be a chat or completions request body")
        items.append(Item(body, {**tags, "line": n}))
    if not items:
        raise HarnessError(f"replay file {path}: no requests")
    return Dataset("replay", {"path": str(path)}, items, [])


def _sized_text(rng: random.Random, tokens: int, count: TokenCounter) -> str:
    """Words until `count` says the text has at least `tokens` tokens (grows geometrically, then trims)."""
    words: list[str] = []
    while count(" ".join(words)) < tokens:
        words += [rng.choice(_WORDS) for _ in range(max(8, tokens // 4))]
    while len(words) > 1 and count(" ".join(words[:-1])) >= tokens:
        words.pop()
    return " ".join(words)
