"""Fixtures of the API-conformance suite: the target name, its snapshot set, and each corpus case's
answer, sent once per worker process and shared by every check of that case."""
from __future__ import annotations

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.location import PyTestLocation

from tests.api_conformance.corpus import RequestCase
from tests.api_conformance.targets import TEMPLATE_SNAPSHOTS, snapshot_extension, target_name
from tests.api_conformance.transport import Exchange, send, served_context_tokens

_answers: dict[tuple[str, str], Exchange] = {}


@pytest.fixture(scope="session")
def conformance_target(pytestconfig: pytest.Config) -> str:
    return target_name(pytestconfig.getoption("--server-url"), pytestconfig.getoption("--target-name"))


def _snapshot_in(request: pytest.FixtureRequest, subdir: str) -> SnapshotAssertion:
    # Built directly rather than from syrupy's `snapshot` fixture: that one registers a default extension
    # whose discovery covers a whole directory and, on --snapshot-update, deletes other targets' files.
    return SnapshotAssertion(
        update_snapshots=request.config.option.update_snapshots,
        update_new_snapshots_only=request.config.option.update_new_snapshots_only,
        extension_class=snapshot_extension(subdir),
        test_location=PyTestLocation(request.node),
        session=request.session.config._syrupy,
    )


@pytest.fixture
def target_snapshot(request: pytest.FixtureRequest, conformance_target: str) -> SnapshotAssertion:
    """Snapshots of the server under test, in snapshots/<target>/."""
    return _snapshot_in(request, conformance_target)


@pytest.fixture
def template_snapshot(request: pytest.FixtureRequest) -> SnapshotAssertion:
    """Target-independent snapshots (the rendered chat template), in snapshots/_template/."""
    return _snapshot_in(request, TEMPLATE_SNAPSHOTS)


@pytest.fixture
def answer(openai_server):
    """answer(case) -> the server's Exchange for that case (cached: every check sees the same answer)."""

    def get(case: RequestCase) -> Exchange:
        key = (openai_server.base_url, case.name)
        if key not in _answers:
            context = None
            if case.needs_context_length:
                context = served_context_tokens(openai_server)
                if context is None:
                    pytest.skip(f"{case.name}: the server's /v1/models gives no max_model_len, so no prompt can be "
                                "sized beyond its context")
            _answers[key] = send(openai_server, case.endpoint,
                                 case.request_body(openai_server.model, context), raw=case.raw,
                                 timeout_s=case.timeout_s)
        return _answers[key]

    return get
