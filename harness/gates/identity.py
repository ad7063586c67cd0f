"""What makes two runs comparable: the same dataset, model and server arguments.

The identity is read from a run's manifest.json. What legitimately differs between two runs of the same
setup is normalised away: the loopback port, the temporary directory a tiny model was built in (its files'
hash stands for it), the served-model path.
"""
from __future__ import annotations

import shlex
from typing import Iterable

# Arguments whose value says where, not what: dropped from the comparison.
# Where it listens and what it answers to, not what it computes (an API key is a secret as well: never recorded).
_WHERE_ARGS = {"--port", "--host", "--uvicorn-log-level", "--served-model-name", "--api-key"}
_MODEL_ARGS = {"--model", "--tokenizer", "--chat-template"}


def normalise_server_args(command: str | None) -> list[str]:
    """The server command's arguments that change what is measured, in order; paths replaced by roles."""
    if not command:
        return []
    words = shlex.split(command)
    out: list[str] = []
    skip_next = False
    for i, word in enumerate(words):
        if skip_next:
            skip_next = False
            continue
        flag, _, inline = word.partition("=")
        if flag in _WHERE_ARGS:
            skip_next = not inline
            continue
        if flag in _MODEL_ARGS:
            out.append(f"{flag}=<{flag.lstrip('-')}>")
            skip_next = not inline
            continue
        if i > 0 and words[i - 1] == "serve" and not word.startswith("-"):
            out.append("<model>")  # `vllm serve MODEL`
            continue
        if word.endswith("python") or word.endswith("python3") or "/" in word and not word.startswith("-"):
            continue  # interpreter and script paths
        out.append(word)
    return out


# The fields compared; a baseline's identity may hold more (hardware, workload) as description.
IDENTITY_FIELDS = ("model", "model_files_sha256", "datasets", "server_args")


def identity_from_manifest(manifest: dict) -> dict:
    """The fields two runs must share to be compared."""
    return {
        "model": manifest.get("model"),
        "model_files_sha256": manifest.get("model_files_sha256"),
        "datasets": sorted((d.get("name"), d.get("sha256")) for d in manifest.get("datasets", [])),
        "server_args": normalise_server_args((manifest.get("server") or {}).get("command")),
    }


def identity_differences(expected: dict, actual: dict, accept: Iterable[str] = ()) -> list[str]:
    """Human-readable differences, except in the fields named in `accept`. A field the expected identity
    leaves as None (unknown, e.g. an imported baseline's model hash) is not compared."""
    accepted = set(accept)
    unknown = accepted - set(IDENTITY_FIELDS)
    if unknown:
        raise ValueError(f"--accept-difference {sorted(unknown)}: not an identity field; use one of {list(IDENTITY_FIELDS)}")
    diffs = []
    for key in IDENTITY_FIELDS:
        want, got = expected.get(key), actual.get(key)
        same = _datasets_covered if key == "datasets" else _same
        if key in accepted or want is None or want == [] or same(want, got):
            continue
        diffs.append(f"{key}: baseline {want!r} vs candidate {got!r}")
    return diffs


def _datasets_covered(want, got) -> bool:
    """Every dataset the candidate measured is one of the baseline's: a candidate may measure fewer of the
    baseline's workloads (its other points are then not gated, and the report says so), never another one."""
    if not got:
        return False
    return all(any(_same(list(w), list(g)) for w in want) for g in got)


def _same(a, b) -> bool:
    # YAML turns tuples into lists: compare structurally. None on the expected side means "not recorded"
    # (an imported baseline's dataset hash) and matches anything.
    if a is None:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
