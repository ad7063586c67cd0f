"""The error bounds every tuned output must meet: the numerics suite's own (tests/numerics/tolerances.py)."""
from __future__ import annotations

__all__ = ["tolerances"]


def tolerances():
    # The bounds live with the numerics suite; the tuner runs from a checkout's root, as the tests do.
    try:
        from tests.numerics import tolerances as module
    except ImportError as exc:
        raise RuntimeError(f"the tuner checks outputs with tests/numerics/tolerances.py: run it from the "
                           f"repository root of a checkout ({exc})") from None
    return module
