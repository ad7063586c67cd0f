"""Drive vLLM's real chat output parser in-process, as the API server does for `--tool-call-parser qwen3_coder
--reasoning-parser qwen3`: `ParserManager.get_parser` composes the parser class, the serving layer calls
`parse` (non-stream) or `parse_delta` once per generated chunk (stream). No server, no model: the output is
given as text pieces, each encoded with the tiny model's tokenizer into the token ids that carry it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tests.api_conformance.corpus import corpus_tools

REQUIRED = "required"
NAMED = {"type": "function", "function": {"name": "get_time"}}
# The generation prompt ends as the chat template leaves it: thinking off closes an empty think block.
PROMPT_END = {False: "<|im_start|>assistant\n<think>\n\n</think>\n\n", True: "<|im_start|>assistant\n<think>\n"}


@dataclass
class Answer:
    content: str
    reasoning: str
    calls: list[tuple[str, str]]  # (name, arguments) per call


@lru_cache(maxsize=1)
def tiny_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from harness.serving.tiny_model import TinyRecipe, train_tokenizer

    recipe = TinyRecipe.load()
    return PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(recipe.seed, recipe.vocab_size))


@lru_cache(maxsize=1)
def parser_class():
    from vllm.parser import ParserManager

    return ParserManager.get_parser(tool_parser_name="qwen3_coder", reasoning_parser_name="qwen3",
                                    enable_auto_tools=True, tokenizer=tiny_tokenizer())


def request(tool_choice, thinking: bool = False):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=corpus_tools(),
                                 tool_choice=tool_choice, chat_template_kwargs={"enable_thinking": thinking},
                                 max_tokens=48)


def _parser(req, thinking: bool):
    return parser_class()(tiny_tokenizer(), req.tools, chat_template_kwargs={"enable_thinking": thinking})


def nonstream(pieces: list[str], tool_choice, thinking: bool = False) -> Answer:
    """What the non-stream answer's message holds (the serving layer calls `parse` on the whole text)."""
    req = request(tool_choice, thinking)
    reasoning, content, calls = _parser(req, thinking).parse("".join(pieces), req, enable_auto_tools=True)
    return Answer(content or "", reasoning or "", [(c.name, c.arguments) for c in calls or []])


def stream(pieces: list[str], tool_choice, thinking: bool = False) -> Answer:
    """The deltas of a stream, folded as a client folds them (content and arguments concatenated)."""
    tok, req = tiny_tokenizer(), request(tool_choice, thinking)
    parser = _parser(req, thinking)
    prompt_ids = tok.encode(PROMPT_END[thinking], add_special_tokens=False)
    content, reasoning, calls = "", "", {}
    for i, piece in enumerate(pieces):
        ids = tok.encode(piece, add_special_tokens=False)
        delta = parser.parse_delta(piece, ids, req, prompt_ids, finished=i == len(pieces) - 1)
        if delta is None:
            continue
        content += delta.content or ""
        reasoning += delta.reasoning or ""
        for tc in delta.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            fn = tc.function
            calls[tc.index] = (name + ((fn.name or "") if fn else ""), args + ((fn.arguments or "") if fn else ""))
    return Answer(content, reasoning, [calls[i] for i in sorted(calls)])


# A forced call as the tiny model writes it: the opener spelled in ordinary tokens, cut inside a parameter.
SPELLED_TRUNCATED = ["<", "tool", "_call", ">", "\n", "<", "function", "=get", "_time", ">\n", "<parameter",
                     "=zone", ">\n", "Asia/To"]
# The same call with the opener as the special token (one piece encodes to the id of <tool_call>).
SPECIAL_TRUNCATED = ["<tool_call>", "\n", *SPELLED_TRUNCATED[5:]]
# A call that closed.
COMPLETE = [*SPECIAL_TRUNCATED, "kyo", "\n</parameter>", "\n</function>", "\n", "</tool_call>"]
