"""The presubmit rows' names, the one place they are spelled: the checks declare themselves under these, the
verdict table prints them, and the tests and the broken fixtures' `expect` / `also_no_go`
(fixtures/presubmit/broken/*.yaml, checked against CHECK_NAMES by tests/unit/test_presubmit.py) use them."""
from __future__ import annotations

LINE_ENDINGS = "line_endings"
DOCKERFILE = "dockerfile"
RUN_CONFIG = "run_config"
CHAT_TEMPLATE = "chat_template"
NO_VLLM_SHADOW = "no_vllm_shadow"
PROFILING_OFF = "profiling_off"
PLUGIN_STATUS = "plugin_status"
SERVED_BLOCKS = "served_blocks"
SUITES = "suites"

# In the verdict table's order.
CHECK_NAMES = (LINE_ENDINGS, DOCKERFILE, RUN_CONFIG, CHAT_TEMPLATE, NO_VLLM_SHADOW, PROFILING_OFF, PLUGIN_STATUS,
               SERVED_BLOCKS, SUITES)
