"""harness.suite_session: one server for several pytest runs, started before them and ended after them."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import suite_session
from harness.serving import shared_server
from harness.serving.launcher import ManagedServer, ServerConfig

FAKE = str(Path(__file__).with_name("fake_openai_server.py"))
REPO = str(Path(__file__).parents[2])

# A command that finds the session's server as a test would (acquire, never starting one) and appends
# its pid to a file, then exits with the code it is given.
_CLIENT = """
import json, os, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from harness.serving import shared_server
def must_not_start(state_dir):
    raise SystemExit("the command had to start the server itself")
info = shared_server.acquire(Path(os.environ[shared_server.STATE_ENV]), must_not_start)
with open({out!r}, "a") as f:
    f.write(json.dumps({{"pid": info.pid, "url": info.base_url}}) + "\\n")
sys.exit(int(sys.argv[1]))
"""


def _fake_start(state_dir: Path):
    cfg = ServerConfig(model="unused", command=(sys.executable, FAKE, "{port}", "ok"))
    return shared_server.info_of(ManagedServer(cfg, state_dir / "server.log").start(), None)


def _client(tmp_path: Path, code: int) -> list[str]:
    script = tmp_path / "client.py"
    script.write_text(_CLIENT.format(repo=REPO, out=str(tmp_path / "seen.jsonl")))
    return [sys.executable, str(script), str(code)]


def _seen(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_commands_share_one_server_that_is_ended_after_the_last(tmp_path):
    assert suite_session.run([_client(tmp_path, 0), _client(tmp_path, 0)], start_server=_fake_start, then=None) == 0
    first, second = _seen(tmp_path)
    assert first == second  # the same process served both commands
    assert _gone(first["pid"])


def test_a_failing_command_stops_the_rest_and_the_server_is_still_ended(tmp_path):
    assert suite_session.run([_client(tmp_path, 3), _client(tmp_path, 0)], start_server=_fake_start, then=None) == 3
    (only,) = _seen(tmp_path)  # the second command never ran
    assert _gone(only["pid"])


def test_nothing_is_started_for_a_live_server(tmp_path):
    def must_not_start(state_dir):
        pytest.fail("a command with --server-url measures that server: nothing to start")

    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()", "--server-url=http://10.0.0.5:8000"]
    assert suite_session.run([cmd], start_server=must_not_start, then=None) == 0
    assert marker.exists()


@pytest.mark.parametrize("argv, message", [
    ([], "commands start after `--`"),
    (["pytest"], "commands start after `--`"),
    (["--", "a", "--"], "empty command"),
])
def test_bad_command_lines_say_how_to_write_them(argv, message):
    with pytest.raises(SystemExit, match=message):
        suite_session.split_commands(argv)


def test_commands_are_split_at_each_separator():
    assert suite_session.split_commands(["--", "a", "b", "--", "c"]) == [["a", "b"], ["c"]]


def test_the_callers_environment_is_restored(tmp_path, monkeypatch):
    monkeypatch.setenv(suite_session.STATE_ENV, "/the/callers/state")
    suite_session.run([_client(tmp_path, 0)], start_server=_fake_start, then=None)
    import os

    assert os.environ[suite_session.STATE_ENV] == "/the/callers/state"


def test_servers_started_after_the_sessions_are_ended_too(tmp_path):
    from harness.serving import shared_server

    seen = {}

    def then(state_dir, session):
        seen["session"] = session.pid
        seen["other"] = shared_server.acquire(state_dir, _fake_start, name="other").pid

    # The command waits for the second server as a test would wait for a compared one.
    script = tmp_path / "wait.py"
    script.write_text(f"import os, sys, time\nsys.path.insert(0, {REPO!r})\nfrom pathlib import Path\n"
                      "from harness.serving import shared_server\n"
                      "state = Path(os.environ[shared_server.STATE_ENV])\n"
                      "deadline = time.monotonic() + 60\n"
                      "while not (state / 'other.json').exists() and time.monotonic() < deadline:\n"
                      "    time.sleep(0.05)\n"
                      "shared_server.acquire(state, None, name='other')\n")
    assert suite_session.run([[sys.executable, str(script)]], start_server=_fake_start, then=then) == 0
    assert seen["session"] != seen["other"]
    assert _gone(seen["session"]) and _gone(seen["other"])


def test_later_commands_wait_until_every_start_is_over(tmp_path):
    from harness.serving import shared_server

    def slow_then(state_dir, session):
        time.sleep(1.5)  # a compared server still starting when the first command ends
        shared_server.acquire(state_dir, _fake_start, name="late")

    check = [sys.executable, "-c", "import os, sys; from pathlib import Path; "
             f"sys.exit(0 if (Path(os.environ[{suite_session.STATE_ENV!r}]) / 'late.json').exists() else 9)"]
    quick = [sys.executable, "-c", "pass"]
    assert suite_session.run([quick, check], start_server=_fake_start, then=slow_then) == 0


def test_compared_names_the_servers_to_start_and_refuses_an_unknown_one():
    assert suite_session.compared_names(["--", "a"]) == (None, ["--", "a"])
    assert suite_session.compared_names(["--compared", "no-cache,moe-on", "--", "a"]) == (("no-cache", "moe-on"),
                                                                                         ["--", "a"])
    with pytest.raises(SystemExit, match="no compared server"):
        suite_session.compared_names(["--compared", "no-cache,nonesuch", "--", "a"])
