"""The `qwen36` command: errors are one line naming the input and the fix, with a non-zero exit."""
from __future__ import annotations

import subprocess
import sys

from harness.cli import main
from harness.serving.launcher import free_port


def _qwen36(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, timeout=120)


def test_unreachable_server_is_one_line_naming_the_url_and_exit_2(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    r = _qwen36("bench", "--base-url", url, "--dataset", "decode-micro", "--out", str(tmp_path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qwen36 bench: error:") and url in lines[0]
    assert "--base-url" in lines[0]  # says what to fix


def test_replay_without_file_names_the_missing_flag(tmp_path, capsys):
    code = main(["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--dataset", "replay",
                 "--out", str(tmp_path)])
    assert code == 2 and "--replay-file" in capsys.readouterr().err


def test_tiny_model_command_prints_a_digest_per_file(tmp_path):
    r = _qwen36("tiny-model", str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 6 and "model.safetensors" in r.stdout


def test_failed_run_leaves_no_empty_run_directory(tmp_path):
    _qwen36("bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_serve_with_a_custom_command_becomes_ready_and_stops_on_sigterm(tmp_path):
    import signal
    from pathlib import Path

    fake = Path(__file__).with_name("fake_openai_server.py")
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--run-dir", str(tmp_path),
                          "--model", str(tmp_path), "--served-model-name", "fake",
                          "--command", f"{sys.executable} {fake} {{port}} ok"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("ready: http://127.0.0.1:"), p.stderr.read() if p.poll() is not None else line
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 0, p.stderr.read()
    assert "fake server on" in (tmp_path / "server.log").read_text()
