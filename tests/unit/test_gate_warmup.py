"""harness.gates.measure's warm-ups without a server: one warm-up per server and workload, recorded beside the
server's log, so the timing run's tests skip what `make test`'s parallel run already did."""

import pytest

from harness.gates import measure as measure_module
from harness.gates import servers as compared
from harness.gates.measure import Warmup, warm
from harness.serving.shared_server import SESSION, ServerInfo


@pytest.fixture
def bench_calls(monkeypatch, tmp_path):
    calls = []

    def fake_measure(server, out_root, label, repeats=1, preset="gate", datasets=None, **_):
        calls.append((server.base_url, label, repeats, preset, datasets))
        return tmp_path / label

    monkeypatch.setattr(measure_module, "measure", fake_measure)
    return calls


def test_a_warm_up_runs_once_per_server_and_workload(bench_calls, tmp_path):
    server = ServerInfo("http://127.0.0.1:1", "m", log_path=str(tmp_path / "twin.log"))
    other = ServerInfo("http://127.0.0.1:2", "m", log_path=str(tmp_path / "server.log"))
    prefill = Warmup(2, ("official-like",))
    assert warm(server, prefill, tmp_path) is True
    assert warm(server, prefill, tmp_path) is False  # marked beside the log
    assert warm(server, Warmup(1, ("decode-micro",)), tmp_path) is True  # another workload
    assert warm(other, prefill, tmp_path) is True  # another server
    assert [(url, reps, ds) for url, _, reps, _, ds in bench_calls] == [
        ("http://127.0.0.1:1", 2, ("official-like",)), ("http://127.0.0.1:1", 1, ("decode-micro",)),
        ("http://127.0.0.1:2", 2, ("official-like",))]


def test_a_server_known_only_by_url_is_warmed_every_time_and_zero_repeats_is_nothing(bench_calls, tmp_path):
    by_url = ServerInfo("http://h:1", "m")
    assert warm(by_url, Warmup(1), tmp_path) and warm(by_url, Warmup(1), tmp_path)
    assert warm(by_url, Warmup(0), tmp_path) is False
    assert len(bench_calls) == 2


def test_a_failed_warm_up_leaves_no_marker(monkeypatch, tmp_path):
    def broken(*_, **__):
        raise ConnectionError("server gone")

    monkeypatch.setattr(measure_module, "measure", broken)
    server = ServerInfo("http://127.0.0.1:1", "m", log_path=str(tmp_path / "server.log"))
    with pytest.raises(ConnectionError):
        warm(server, Warmup(2), tmp_path)
    assert not list(tmp_path.glob("*.warm-*.json"))


def test_make_test_warms_every_server_the_timing_run_compares(bench_calls, tmp_path):
    names = (SESSION, compared.TWIN, compared.REFERENCE, compared.NO_CACHE)
    servers = {name: ServerInfo(f"http://127.0.0.1:{i}", "m", log_path=str(tmp_path / f"{name}.log"))
               for i, name in enumerate(names, start=1)}
    done = compared.warm_for_gates(servers, tmp_path / "warmups")
    assert done == [f"{name}: {measure_module.STEADY_PREFIX_CACHE.name}" for name in names[:3]]
    assert compared.warm_for_gates(servers, tmp_path / "warmups") == []  # the timing run finds them done
    assert "http://127.0.0.1:4" not in {url for url, *_ in bench_calls}  # a hit rate of 0 needs no warm cache
