"""embedded_server (harness/serving/launcher.py): the one way `qwen36 serve`, `qwen36 bench`, the test session and the
perf gates' compared servers make the embedded tiny server. Nothing is started here."""
from __future__ import annotations

from harness.serving.launcher import embedded_config, embedded_server


def test_a_given_model_is_used_as_is_with_the_overrides_and_the_log_in_the_work_dir(tmp_path):
    server = embedded_server(tmp_path, "/models/m", max_model_len=1024, port=4321, extra_args=("--enforce-eager",))
    assert server.proc is None  # not started: the caller starts it (serve prints its command line first)
    assert not (tmp_path / "tiny-model").exists()
    assert server.log_path == tmp_path / "server.log"
    assert server.cfg == embedded_config("/models/m", max_model_len=1024, port=4321, extra_args=("--enforce-eager",))
    for flag in ("--model /models/m", "--max-model-len 1024", "--port 4321", "--chat-template ", "--enforce-eager"):
        assert flag in server.command_line


def test_without_a_model_it_builds_the_tiny_model_in_the_work_dir(tmp_path):
    server = embedded_server(tmp_path, log_path=tmp_path / "logs" / "bench.log")
    assert server.cfg.model == str(tmp_path / "tiny-model")
    assert (tmp_path / "tiny-model" / "config.json").exists() and (tmp_path / "tiny-model" / "tokenizer.json").exists()
    assert server.log_path == tmp_path / "logs" / "bench.log"
    assert "--max-model-len 8192" in server.command_line  # the embedded default, not ServerConfig's 4096
