"""The vLLM general plugin (entry point `vllm.general_plugins` -> `patches.plugin:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), so it is idempotent
and applies the patches in each (the engine process is where the model runs). The status table is logged
once per process tree: the first process whose vLLM logging is configured when it loads the plugin (the
engine core; the API server loads plugins before its logging is set up) logs it and marks the environment,
which the processes it spawns (workers) inherit. A process whose logging is not live yet (the API server,
a server's first process) clears a marker it inherited: that one was set outside this server (a test process
that loaded the plugin and then started a server), and the server must still log its own table. A problem
never stops the server from the plugin: vLLM would only log "Failed to load plugin"; instead each patch's row
says what happened, and the image build checks the rows (`python -m patches.verify`).
"""
from __future__ import annotations

import logging

from .core.registry import PatchStatus, apply_patches, format_table
from .model_paths import step_slowdown
from .settings import PatchSettings, PatchSettingsError, clear_table_logged, mark_table_logged, table_already_logged

__all__ = ["register"]

_log = logging.getLogger("vllm.qwen36.patches")


def register() -> list[PatchStatus]:
    try:
        settings = PatchSettings.from_env()
    except (PatchSettingsError, ValueError) as exc:  # MoEConfigError is a ValueError
        _log.error("qwen36 patches: not applied: %s", exc)
        return []
    statuses = apply_patches(settings)
    step_slowdown.install(settings.step_slowdown)  # test-only, and only where its variables are set
    # The API server loads plugins before vLLM configures logging; a record logged then is dropped, so the
    # first process whose log is live (the engine core) logs the table and marks the environment.
    if not (_log.isEnabledFor(logging.INFO) and _log.hasHandlers()):
        clear_table_logged()
    elif not table_already_logged():
        mark_table_logged()
        for line in format_table(statuses).splitlines():
            _log.info("%s", line)
    return statuses
