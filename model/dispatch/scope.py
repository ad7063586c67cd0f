"""One answer per question within a forward pass: the path selectors' results, memoised for its duration.

An eager decode step asks the dispatchers the same questions once per layer (which MoE block path at T=1, which
GDN decode-layer path at batch B, ...), about 80 per step, and each answer re-reads the environment and the
table: about 7 to 14 µs of host time apiece on a 2-core AMD EPYC (tools: a `timeit` of each selector), so about
1 ms of every step's host time, all of it launch-bound. Inside `one_dispatch_scope()` a selector decorated with
`@scoped` computes its answer once per distinct arguments; outside any scope it computes every call, as before.

A scope is safe because nothing a selector reads can change half way through one forward pass: the dispatch
table's environment variables and files are read by the caller's process, not by the pass. Scopes nest (the
outermost one keeps the answers) and are per thread and per asyncio task (a ContextVar).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, TypeVar

__all__ = ["one_dispatch_scope", "scoped"]

F = TypeVar("F", bound=Callable)

_ANSWERS: ContextVar[dict | None] = ContextVar("qwen36_dispatch_answers", default=None)


@contextmanager
def one_dispatch_scope() -> Iterator[None]:
    """Memoise every `@scoped` selector's answers until the block ends (the outermost scope's, when nested)."""
    if _ANSWERS.get() is not None:
        yield
        return
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def scoped(selector: F) -> F:
    """`selector`, answering from the active scope's memo when it was asked the same arguments before in it."""

    @functools.wraps(selector)
    def answer(*args, **kwargs):
        answers = _ANSWERS.get()
        if answers is None:
            return selector(*args, **kwargs)
        key = (selector, args, tuple(kwargs.items()))
        try:
            return answers[key]
        except KeyError:
            result = answers[key] = selector(*args, **kwargs)
            return result
        except TypeError:  # an unhashable argument: no memo for this question
            return selector(*args, **kwargs)

    return answer  # type: ignore[return-value]
