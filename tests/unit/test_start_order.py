"""tests/conftest.py's start order: what the parallel run does while the servers start, and what it ends on."""
from types import SimpleNamespace

from tests.conftest import start_order

NO_SERVER = SimpleNamespace(fixturenames=("tmp_path",))
SESSION = SimpleNamespace(fixturenames=("openai_server", "tmp_path"))
COMPARED = SimpleNamespace(fixturenames=("compared_servers", "openai_server"))
REFERENCE = SimpleNamespace(fixturenames=("reference_server", "openai_server"))


def test_under_xdist_the_compared_servers_tests_come_before_the_session_servers():
    items = [SESSION, COMPARED, NO_SERVER, REFERENCE]
    assert sorted(items, key=lambda i: start_order(i, distributed=True)) == [NO_SERVER, COMPARED, REFERENCE, SESSION]


def test_without_xdist_the_server_tests_keep_their_order_after_the_others():
    items = [SESSION, COMPARED, NO_SERVER]
    assert sorted(items, key=lambda i: start_order(i, distributed=False)) == [NO_SERVER, SESSION, COMPARED]
