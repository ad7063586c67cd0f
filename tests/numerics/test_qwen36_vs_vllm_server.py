"""The whole tiny model: the project's own `model/` against vLLM serving the same checkpoint, by teacher-forced
logprobs. vLLM is the second implementation nobody here wrote, beside transformers (test_qwen36_transformers.py),
and the one the platform serves with.

Server: harness.gates.servers' `no-cache`, a stock vLLM (no compute patch on; checked from its status table) with
prefix caching off, so every prompt token's logprob is computed, never read from a cache. Requests: random token ids
(fixed seed), `prompt_logprobs` for the prompt and greedy decoding with `logprobs` for the continuation; the server
is held while they run.

Ours: the checkpoint loaded by `Qwen36Weights` in float32, one forward over prompt + vLLM's continuation, so every
position is teacher-forced on vLLM's own sequence: logprob of each next token.

Bound: vLLM computes in bf16 (activations rounded at every op, float32 accumulations), ours in float32, so the two
differ by bf16 rounding carried through the layers. Its size on this model and these tokens is measured in the same
run, as the numerics suite's bounds are set over what a path reaches: our own model in bf16 against our own in
float32 (`rounding`). The bound is 4 x that, with a floor of 0.02 nats. A model bug (a norm weight read as w rather
than 1 + w, a transposed projection, a wrong state hand-over) moves logprobs by whole nats.
Greedy tokens must be vLLM's argmax of ours wherever vLLM's own top-2 margin exceeds the bound (a nearer tie may go
either way under bf16 rounding).
"""
from __future__ import annotations

import httpx
import pytest
import torch

from harness.gates.servers import NO_CACHE, exclusive
from model.qwen36 import Qwen36Model, Qwen36Weights

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROMPT_TOKENS = 40
NEW_TOKENS = 16
PROMPTS = 3
MARGIN = 4.0
FLOOR_NATS = 0.02


def served(server, prompt: list[int]) -> dict:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=300, headers=headers, json={
        "model": server.model, "prompt": prompt, "max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS,
        "temperature": 0, "logprobs": 2, "prompt_logprobs": 1, "return_tokens_as_token_ids": True,
        "ignore_eos": True})
    assert r.status_code == 200, f"{server.base_url} answered with {r.status_code}: {r.text[:500]}"
    choice = r.json()["choices"][0]
    tokens = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    prompt_lp = [None if entry is None else entry[str(tok)]["logprob"]
                 for tok, entry in zip(prompt, choice["prompt_logprobs"])]
    tops = [sorted(top.values(), reverse=True) for top in choice["logprobs"]["top_logprobs"]]
    return {"tokens": tokens, "logprobs": prompt_lp[1:] + choice["logprobs"]["token_logprobs"],
            "margins": [t[0] - t[1] if len(t) > 1 else float("inf") for t in tops]}


def teacher_forced(model: Qwen36Model, sequence: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob of each next token of `sequence`, argmax at each position), float64."""
    ids = torch.tensor([sequence])
    with torch.no_grad():
        logits, _ = model(ids)
    logprobs = torch.log_softmax(logits[0].double(), dim=-1)
    return logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0], logprobs.argmax(-1)


@pytest.fixture(scope="module")
def models(openai_server):
    return {dtype: Qwen36Model(Qwen36Weights.from_pretrained_dir(openai_server.model_dir, dtype=dtype))
            for dtype in (torch.float32, torch.bfloat16)}


def test_the_models_logprobs_equal_vllms_serving_the_same_checkpoint(compared_servers, models):
    server = compared_servers[NO_CACHE]
    log = open(server.log_path, errors="replace").read()
    assert "qwen36 served" not in log and "first call on path" not in log, "the off server runs a substitution"
    generator = torch.Generator().manual_seed(11)
    vocab = models[torch.float32].config.vocab_size
    prompts = [torch.randint(10, vocab, (PROMPT_TOKENS,), generator=generator).tolist() for _ in range(PROMPTS)]
    with exclusive(server):
        answers = [served(server, p) for p in prompts]

    worst, rounding, problems = 0.0, 0.0, []
    checks = []
    for prompt, answer in zip(prompts, answers):
        sequence = prompt + answer["tokens"]
        ours, argmax = teacher_forced(models[torch.float32], sequence)
        ours_bf16, _ = teacher_forced(models[torch.bfloat16], sequence)
        theirs = torch.tensor(answer["logprobs"], dtype=torch.float64)
        assert theirs.shape == ours.shape
        rounding = max(rounding, (ours_bf16 - ours).abs().max().item())
        worst = max(worst, (theirs - ours).abs().max().item())
        checks.append((prompt, answer, ours, theirs, argmax))
    bound = max(MARGIN * rounding, FLOOR_NATS)
    for prompt, answer, ours, theirs, argmax in checks:
        diff = (theirs - ours).abs()
        if diff.max() > bound:
            i = int(diff.argmax())
            problems.append(f"prompt {prompt[:4]}...: position {i + 1} logprob {theirs[i]:.4f} (vLLM) vs "
                            f"{ours[i]:.4f} (ours)")
        for step, (token, margin) in enumerate(zip(answer["tokens"], answer["margins"])):
            position = PROMPT_TOKENS - 1 + step
            if margin > bound and int(argmax[position]) != token:
                problems.append(f"prompt {prompt[:4]}...: greedy step {step} vLLM {token}, ours {int(argmax[position])} "
                                f"(vLLM's top-2 margin {margin:.3f} > {bound:.3f})")
    print(f"\nmodel/ float32 vs vLLM bf16: max |dlogprob| {worst:.4f} nats over {PROMPTS} x "
          f"{PROMPT_TOKENS - 1 + NEW_TOKENS} positions; our own bf16 rounding {rounding:.4f}; bound {bound:.4f}")
    assert not problems, f"bound {bound:.4f} nats (4 x our bf16 rounding {rounding:.4f}): " + "; ".join(problems)
