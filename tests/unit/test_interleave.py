"""harness.gates.interleave against synthetic servers: blocks alternate in order and in reverse, each arm's
repeats are its rounds, the quiet gap is kept between servers only, and a server that answers nothing stops the
run with every record kept."""
from __future__ import annotations

import json

import pytest

from harness.bench.run import Workload
from harness.gates.interleave import Arm, interleave
from harness.serving.shared_server import ServerInfo
from tests.unit.synthetic_server import Scenario, SyntheticServer, normal_stream

WORKLOAD = (Workload("decode-micro", (1,), requests=2, output_tokens=4),)


def info(server: SyntheticServer, model: str) -> ServerInfo:
    return ServerInfo(server.url, model)


def test_rounds_alternate_the_arms_and_each_arm_keeps_a_repeat_per_round(tmp_path):
    with SyntheticServer({"m": normal_stream(0.01, 0.002, 4)}) as a, SyntheticServer({"m": normal_stream(0.02, 0.004, 4)}) as b:
        run = interleave([Arm("A", info(a, "m")), Arm("B", info(b, "m"))], WORKLOAD, 3, tmp_path, "t", quiet_s=0.05)
    assert run.rounds == 3 and run.end_reason == "completed"
    blocks = json.loads((run.path / "rounds.json").read_text())["blocks"]
    assert [b["arm"] for b in blocks] == ["A", "B", "B", "A", "A", "B"]
    for arm in ("A", "B"):
        summary = json.loads((run.path / arm / "summary.json").read_text())
        assert [r["repeat"] for r in summary["points"]["decode-micro@c1"]["repeats"]] == [0, 1, 2]
        records = (run.path / arm / "requests.jsonl").read_text().splitlines()
        assert len(records) == 3 * (2 + 2)  # each block: its 2 measured requests and its 2 warm-ups


def test_one_server_as_two_arms_waits_no_quiet_gap_between_them(tmp_path):
    with SyntheticServer({"m": normal_stream(0.01, 0.002, 4)}) as a:
        run = interleave([Arm("A", info(a, "m")), Arm("A-again", info(a, "m"))], WORKLOAD, 2, tmp_path, "t",
                         quiet_s=10.0)
    blocks = json.loads((run.path / "rounds.json").read_text())["blocks"]
    # No 10 s gap anywhere; the blocks themselves take well under a second, even beside the parallel run's load.
    assert blocks[-1]["started"] - blocks[0]["started"] < 10.0


def test_a_server_that_answers_nothing_stops_the_run_and_keeps_what_was_measured(tmp_path):
    broken = Scenario(status=500, error_body={"error": {"message": "engine dead", "type": "InternalServerError"}})
    with SyntheticServer({"m": normal_stream(0.01, 0.002, 4)}) as a, SyntheticServer({"m": broken}) as b:
        run = interleave([Arm("A", info(a, "m")), Arm("B", info(b, "m"))], WORKLOAD, 3, tmp_path, "t", quiet_s=0.05)
    assert run.rounds == 0 and "arm B answered no request in round 0" in run.end_reason
    assert len((run.path / "A" / "requests.jsonl").read_text().splitlines()) == 4
    failed = [json.loads(line) for line in (run.path / "B" / "requests.jsonl").read_text().splitlines()]
    assert failed and all(r["failure"] == "http_status" for r in failed)
    assert json.loads((run.path / "rounds.json").read_text())["end_reason"] == run.end_reason


def test_fewer_than_two_rounds_or_one_arm_is_refused(tmp_path):
    server = ServerInfo("http://127.0.0.1:1", "m")
    with pytest.raises(ValueError, match="at least 2 pairs"):
        interleave([Arm("A", server), Arm("B", server)], WORKLOAD, 1, tmp_path, "t")
    with pytest.raises(ValueError, match="two or more"):
        interleave([Arm("A", server)], WORKLOAD, 2, tmp_path, "t")
