"""Every patch of the set, in table order. A new patch is one module with a `PATCH` and one line here."""
from __future__ import annotations

from . import moe_experts
from .registry import Patch

PATCHES: tuple[Patch, ...] = (moe_experts.PATCH,)
