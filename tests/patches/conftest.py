"""Shared fixtures of the patch tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def served_blocks_reset(monkeypatch):
    """For the served-block tests: no table on this CPU and fresh counts; at the end every served patch uninstalled
    (vLLM's classes back in its registry), forcing off and the table cache cleared."""
    from model.dispatch.table import TABLE_ENV, clear_table_cache
    from patches.model_paths import served_choice, served_gdn, served_moe, served_norms

    monkeypatch.delenv(TABLE_ENV, raising=False)
    clear_table_cache()
    served_choice.SERVED.clear()
    yield
    for patch in (served_norms, served_gdn, served_moe):
        patch.uninstall()
    served_choice.configure(False)
    clear_table_cache()
