"""harness.serving.health on stand-in process trees with vLLM's process titles."""
from __future__ import annotations

import json
import os
import time

import psutil

from harness.serving.health import dead_server_reports, why_down
from tests.unit.stand_in_vllm import stand_in_server

ENGINE = "VLLM::EngineCore"


def _wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_server_with_its_engine_core_is_up():
    with stand_in_server((ENGINE,)) as (leader, _):
        assert why_down(leader.pid) is None


def test_a_server_whose_engine_core_died_is_down_while_its_api_server_still_runs():
    with stand_in_server((ENGINE,)) as (leader, kids):
        engine = kids[ENGINE]
        engine.kill()
        _wait_until(lambda: why_down(leader.pid) is not None)
        assert leader.poll() is None
        assert why_down(leader.pid) == "its engine core has exited"


def test_a_server_whose_api_server_exited_is_down_even_unreaped():
    with stand_in_server((ENGINE,)) as (leader, _):
        os.killpg(leader.pid, 9)
        _wait_until(lambda: psutil.Process(leader.pid).status() == psutil.STATUS_ZOMBIE)
        assert why_down(leader.pid) == "its API server has exited"  # a zombie: this test has not waited yet
    assert why_down(leader.pid) == "its API server has exited"  # reaped


def test_reports_name_the_down_server_with_its_log_tail_and_skip_the_rest(tmp_path):
    with stand_in_server((ENGINE,)) as (up, _), stand_in_server((ENGINE,)) as (down, kids):
        engine = kids[ENGINE]
        for name, leader in (("session", up), ("no-cache", down)):
            (tmp_path / f"{name}.log").write_text("".join(f"{name} line {i}\n" for i in range(100)))
            (tmp_path / f"{name}.json").write_text(json.dumps({
                "base_url": f"http://127.0.0.1:{leader.pid}", "model": "m", "pid": leader.pid,
                "log_path": str(tmp_path / f"{name}.log")}))
        (tmp_path / "server.warm-gate-official-like-x2.json").write_text(json.dumps({"repeats": 2}))  # a marker
        assert dead_server_reports(tmp_path) == []
        engine.kill()
        _wait_until(lambda: why_down(down.pid) is not None)
        reports = dead_server_reports(tmp_path, lines=3)
    assert len(reports) == 1
    head, *tail = reports[0].splitlines()
    assert head.startswith(f"the 'no-cache' server (pid {down.pid}, ") and "its engine core has exited" in head
    assert "GiB available" in head
    assert tail == ["no-cache line 97", "no-cache line 98", "no-cache line 99"]
