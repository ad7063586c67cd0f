"""Every patch of the set, in table order. A new patch is one module with a `PATCH` (its seam, switch and
default declared there) and one line here: patches/settings.py reads the switches of this list."""
from __future__ import annotations

from .api import (
    nonstream_trailing_content, object_tool_arguments, openai_error_codes, openai_errors, stream_tool_marker,
    truncated_tool_arguments,
)
from .core.registry import Patch
from .model_paths import moe_experts, moe_router, served_gdn, served_moe, served_norms

PATCHES: tuple[Patch, ...] = (
    moe_experts.PATCH,
    moe_router.PATCH,  # the MoE router by model.moe.ROUTERS
    served_norms.PATCH,  # residual add + RMSNorm and the gated RMSNorm, by the device's table (registry)
    served_gdn.PATCH,  # the GDN layer's decode-only steps over vLLM's state, by the device's table (registry)
    served_moe.PATCH,  # the whole MoE block (router, experts, gated shared expert) at decode sizes, by the table (registry)
    object_tool_arguments.PATCH,  # deviation object-tool-call-arguments-rejected
    stream_tool_marker.PATCH,  # deviation stream-leaks-tool-call-marker-into-content
    truncated_tool_arguments.PATCH,  # deviation truncated-forced-tool-call-reports-empty-arguments
    nonstream_trailing_content.PATCH,  # deviation nonstream-drops-content-after-tool-call
    openai_errors.PATCH,  # error bodies in OpenAI's shape
    openai_error_codes.PATCH,  # deviation error-code-is-the-http-status
)
