"""One side of `qwen36 tune --ab`: a process that times points with the `model` package of one root and the
harness of this checkout, asked point by point over JSON lines; and `WorkerProcess`, the coordinator's handle
on one (harness/tune/ab/run.py starts two and interleaves them). Both ends of the protocol live here.

    python -m harness.tune.ab.worker --model-root DIR --harness-root THIS_CHECKOUT --table TABLE.json \
        --device cuda --dtype bfloat16 --dims NAME [--hf-config DIR --tp N] --reps 20 --warmup 3 --flush-mb 256

Only `model` may come from DIR: DIR (a reference checkout, a worktree or a copy) may hold a `harness/` of its
own, so `harness` comes from this checkout (the coordinator starts the worker there, with it on PYTHONPATH),
while `model` and every submodule of it are found in DIR alone, by a finder put first on sys.meta_path; the
worker checks that every module of either package it loaded lies under its root and reports `model`'s file.

Protocol: the worker writes one JSON line when ready, {"ready": true, "model_file", "harness_file", "pid", ...},
or {"fatal": "model" | "incompatible", "message"} and exits 2. Then, per request line:
    {"op": "warm"}                          -> {"ok": true}       (warm_device)
    {"op": "measure", "point": {"block", "key", "path"}, "count_launches": bool}
                                            -> {"rows": [...]}    (one sweep of that point: Measurement rows,
                                                                   with one call's and one replay's launches
                                                                   where asked)
    {"op": "quit"} or end of input          -> exits 0
Point blocks: moe_experts, gdn_prefill, gdn_decode, gdn_conv, gdn_gated_norm, attention_layer_decode,
add_rms_norm (the table's path there), moe_block (path: a fused block path, or a routed-expert path for the
composed block with those experts), gdn_layer_decode / gdn_layer_prefill (path: `layer`, the staged layer with
its stages as served here, or a fused decode-layer path), decode_step (path `served`: the whole decode step of one
rank, harness/tune/step/point.py; a reference whose `model` cannot build it answers it as missing). A reference whose `model` predates the attention decode layer or the
add + RMSNorm answers those points as missing.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import importlib.machinery
import json
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Callable

__all__ = ["main", "load_model", "ModelRootError", "WorkerProcess", "WorkerDied", "WorkerRefused"]

LAYER_BLOCKS = ("gdn_layer_decode", "gdn_layer_prefill")
# What this harness imports from `model` to time a point (missing in a reference: it is too old or too new).
TIMING_MODULES = ("harness.tune.blocks.moe", "harness.tune.blocks.gdn", "harness.tune.blocks.gdn_layer",
                  "harness.tune.blocks.gdn_stages", "harness.tune.measure.inputs", "harness.tune.measure.dims",
                  "harness.tune.measure.point", "harness.tune.measure.timing")


class ModelRootError(RuntimeError):
    """`model` cannot be imported from the root asked for (or came from somewhere else)."""


def _under(path: str | os.PathLike, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


class _ModelOnlyFrom:
    """A meta-path finder, first in line: `model` and its submodules come from one directory or not at all.
    Without it, a submodule the reference lacks would be filled in by a later finder (an editable install's
    maps `model.*` to the installed checkout) and the A/B would time the wrong code in silence."""

    def __init__(self, model_root: Path):
        self.model_root = model_root

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "model" and not fullname.startswith("model."):
            return None
        search = [str(self.model_root)] if fullname == "model" else path
        spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} in {self.model_root}/model", name=fullname)
        return spec


def load_model(model_root: Path):
    """Import the `model` package of `model_root` (and later its submodules) from there only; return it."""
    loaded = sys.modules.get("model")
    if loaded is not None:  # a fresh worker never has one; refuse rather than time the wrong package
        raise ModelRootError(f"`model` was already imported from {loaded.__file__} before {model_root} was asked for")
    sys.meta_path.insert(0, _ModelOnlyFrom(model_root))
    try:
        model = importlib.import_module("model")
    except Exception as exc:
        raise ModelRootError(f"importing {model_root}/model failed: {type(exc).__name__}: {exc}") from exc
    if not _under(model.__file__, model_root):
        raise ModelRootError(f"`import model` found {model.__file__}, not the package under {model_root}")
    return model


def _strays(package: str, root: Path) -> list[str]:
    """Modules of `package` loaded from outside `root` (none, unless something bypassed the import system)."""
    return [f"{name} from {m.__file__}" for name, m in list(sys.modules.items())
            if (name == package or name.startswith(package + ".")) and getattr(m, "__file__", None)
            and not _under(m.__file__, root)]


def _point_timer(a) -> Callable[[dict], list[dict]]:
    """The function that times one sweep of a point. The harness's timing code is imported only here, after
    `model` was loaded from the root asked for, so that it binds to that package."""
    import torch

    for name in TIMING_MODULES:
        importlib.import_module(name)  # ImportError: this reference's model lacks what the harness needs
    from model.gdn import CONV_PATHS, GDN_RULE_PATHS, select_rule_path
    from model.moe import EXPERT_PATHS
    from model.norm.rms_norm import GATED_NORM_PATHS

    from ..measure import dims as D
    from ..measure.ceilings import ceilings_for
    from ..blocks.gdn import sweep_gdn
    from ..blocks.gdn_layer import time_gdn_layer
    from ..blocks.gdn_stages import sweep_gated_norm, sweep_gdn_conv
    from ..measure.inputs import moe_weights
    from ..measure.point import Settings
    from ..blocks.moe import sweep_moe_block, sweep_moe_experts
    from ..measure.prune import Pruner
    from ..measure.timing import L2Flusher, graphs_supported

    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    dims = D.recorded_dims(a.dims, a.hf_config, a.tp)  # the coordinator refused a name it does not know
    base = Settings(device, dtype, a.reps, a.warmup, graphs_supported(device) and not a.no_graph,
                    L2Flusher(device, a.flush_mb * 2**20))
    ceilings = ceilings_for(a.device_stem, None, None)
    weights = []  # the MoE weights, made once (as a recording makes them once per run)
    whole_step = []  # the whole model for decode_step points, built once

    def moe_w():
        if not weights:
            weights.append(moe_weights(dims.moe, dtype, device))
        return weights[0]

    def quiet(label: str) -> None:  # the coordinator shows the progress
        pass

    def why_not(registry, path: str, n: int) -> str | None:
        if path not in registry:
            return f"no path {path!r} is registered in {a.model_root}/model"
        if not registry.can_run(path, n, dtype, device):
            return f"{path} cannot run {n} on {device} in {dtype}: {registry[path].unavailable_reason(device, dtype)}"
        return None

    def time_point(point: dict, count_launches: bool = False) -> list[dict]:
        block, key, path = point["block"], int(point["key"]), point.get("path")
        s = replace(base, count_launches=count_launches)  # one sweep counts each point's launches
        rows = []
        never = Pruner(float("inf"), True)  # each point is asked for on purpose: none is dropped after another
        if block in ("moe_experts", "moe_block"):
            block_paths = getattr(importlib.import_module("model.moe"), "MOE_BLOCK_PATHS", {})  # none: an old model
            registry = block_paths if block == "moe_block" and path in block_paths else EXPERT_PATHS
            why = why_not(registry, path, key)
            if why:
                return [_missing(block, key, path, why)]
            sweep = sweep_moe_experts if block == "moe_experts" else sweep_moe_block
            sweep(dims.moe, [key], s, ceilings, never, quiet, moe_w(), rows, paths_at=lambda t: {path})
        elif block in ("gdn_prefill", "gdn_decode"):
            why = why_not(GDN_RULE_PATHS, path, key if block == "gdn_prefill" else 1)
            if why:
                return [_missing(block, key, path, why)]
            prefill, decode = ([key], []) if block == "gdn_prefill" else ([], [key])
            sweep_gdn(dims.gdn, prefill, decode, s, ceilings, never, quiet, rows, paths_at=lambda b, k: {path})
        elif block in ("gdn_conv", "gdn_gated_norm"):
            registry, sweep = (CONV_PATHS, sweep_gdn_conv) if block == "gdn_conv" else \
                (GATED_NORM_PATHS, sweep_gated_norm)
            why = why_not(registry, path, key)
            if why:
                return [_missing(block, key, path, why)]
            sweep(dims.gdn, [key], s, ceilings, quiet, rows, paths_at=lambda b, k: {path})
        elif block in ("attention_layer_decode", "add_rms_norm"):
            try:  # attention_and_norm imports model.attention.decode_layer and model.norm.rms_norm's add + RMSNorm
                from ..blocks import attention_and_norm as step_blocks
            except ImportError as exc:
                return [_missing(block, key, path, f"this side's model has no {block} paths: {exc}")]
            attention = block == "attention_layer_decode"
            registry = step_blocks.ATTENTION_DECODE_LAYER_PATHS if attention else step_blocks.ADD_RMS_NORM_PATHS
            why = why_not(registry, path, 1 if attention else key)
            if why:
                return [_missing(block, key, path, why)]
            if attention:
                step_blocks.sweep_attention_layer(dims.attention, [key], D.attention_context(dims), s, ceilings,
                                                  quiet, rows, paths_at=lambda b, k: {path})
            else:
                step_blocks.sweep_add_rms_norm(dims.attention.hidden_size, dims.attention.eps, [key], s, ceilings,
                                               quiet, rows, paths_at=lambda b, k: {path})
        elif block == "decode_step":
            if not whole_step:
                try:  # the harness's step code on this side's model: an old one may lack what it needs
                    from ..step.point import StepPoints, step_model_config

                    whole_step.append(StepPoints(step_model_config(a.dims, a.hf_config, a.tp), s))
                except (ImportError, AttributeError, TypeError, ValueError) as exc:
                    return [_missing(block, key, path, f"this side's model cannot build the whole step: {exc}")]
            whole_step[0].sweep([key], quiet, rows, s)
        elif block in LAYER_BLOCKS:
            batch, tokens = (key, 1) if block == "gdn_layer_decode" else (1, key)
            if path != "layer":  # a fused decode-layer path, which a reference may not have
                fused = getattr(importlib.import_module("model.gdn"), "GDN_DECODE_LAYER_PATHS", {})
                why = why_not(fused, path, 1) if tokens == 1 else f"{path} is a decode path, asked at T={tokens}"
                if why:
                    return [_missing(block, key, path, why)]
            time_gdn_layer(dims.gdn, s, lambda b, t: select_rule_path(t, b, device, dtype), quiet, [(batch, tokens)],
                           rows, stages=(path,))
        else:
            raise ValueError(f"unknown block {block!r}")
        return [_row(m) for m in rows] or [_missing(block, key, path or "", "nothing ran at this point")]

    return time_point


def _row(m) -> dict:
    """What the coordinator needs of a Measurement: status, medians, errors against the float64 reference."""
    return {"block": m.block, "key": m.key, "path": m.path, "status": m.status, "detail": m.detail,
            "eager_us": m.eager.median_us if m.eager else None, "graph_us": m.graph.median_us if m.graph else None,
            "gpu_us": m.gpu.median_us if m.gpu else None, "host_us": m.host_us, "launches": m.launches,
            "graph_launches": m.graph_launches,
            "graph_note": m.graph_note, "err_eager": m.err_eager, "err_graph": m.err_graph, "bound": m.bound,
            "rule": m.extra.get("rule")}


def _missing(block: str, key: int, path: str, why: str) -> dict:
    return {"block": block, "key": key, "path": path, "status": "missing", "detail": why, "eager_us": None,
            "graph_us": None, "gpu_us": None, "host_us": None, "launches": None, "graph_launches": None, "graph_note": "", "err_eager": None, "err_graph": None, "bound": None, "rule": None}


def _set_table(table: str) -> bool:
    """Both sides dispatch by the table under test, whatever the environment; False if `model` has no tables."""
    try:
        dispatch_table = importlib.import_module("model.dispatch.table")
    except ImportError:
        return False
    os.environ[dispatch_table.TABLE_ENV] = table
    dispatch_table.clear_table_cache()
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.tune.ab.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-root", type=Path, required=True, help="the directory holding the `model` package")
    p.add_argument("--harness-root", type=Path, required=True, help="this checkout: where `harness` must come from")
    p.add_argument("--table", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--device-stem", default="")
    p.add_argument("--dtype", required=True)
    p.add_argument("--dims", default="tiny")
    p.add_argument("--hf-config", type=Path, default=None)
    p.add_argument("--tp", type=int, default=4)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--flush-mb", type=int, required=True)
    p.add_argument("--no-graph", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's: it stops and ends both sides
    # The protocol owns the real stdout; anything else that prints (libraries, C code) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    harness_file = sys.modules["harness"].__file__  # loaded by `python -m` to run this module
    if not _under(harness_file, a.harness_root):
        send({"fatal": "model", "message": f"`harness` came from {harness_file}, not {a.harness_root}"})
        return 2
    try:
        model = load_model(a.model_root)
    except ModelRootError as exc:
        send({"fatal": "model", "message": str(exc)})
        return 2
    table_followed = _set_table(a.table)
    try:
        time_point = _point_timer(a)
    except (ImportError, AttributeError) as exc:
        send({"fatal": "incompatible", "message": f"{type(exc).__name__}: {exc}"})
        return 2
    strays = _strays("model", a.model_root) + _strays("harness", a.harness_root)
    if strays:
        send({"fatal": "model", "message": f"loaded from outside the roots asked for: {'; '.join(strays)}"})
        return 2
    from ..measure.timing import warm_device

    import torch

    send({"ready": True, "pid": os.getpid(), "model_file": str(Path(model.__file__).resolve()),
          "harness_file": str(Path(harness_file).resolve()), "table_followed": table_followed,
          "torch": torch.__version__})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        if op == "quit":
            break
        if op == "warm":
            warm_device(torch.device(a.device))
            send({"ok": True})
        elif op == "measure":
            point = request["point"]
            try:
                rows = time_point(point, bool(request.get("count_launches")))
            except Exception as exc:  # a failure outside measure()'s own (a reference, the inputs): this point's
                traceback.print_exc()
                rows = [dict(_missing(point["block"], point["key"], point.get("path") or "", ""), status="error",
                             detail=f"{type(exc).__name__}: {str(exc).strip()[:300]}")]
            send({"rows": rows})
        else:
            send({"error": f"unknown op {op!r}"})
    return 0


# --- the coordinator's end ----------------------------------------------------------------------------------

class WorkerDied(RuntimeError):
    """A worker exited (or closed its output) when an answer was due; the message ends with its stderr's tail."""


class WorkerRefused(RuntimeError):
    """A worker could not start timing: its `model` cannot be imported from the root, or lacks what the
    harness needs (`kind` is "model" or "incompatible")."""

    def __init__(self, side: str, kind: str, message: str):
        super().__init__(message)
        self.side, self.kind = side, kind


class WorkerProcess:
    """One worker, started in `harness_root` (so `harness` comes from there) with its stderr in `log`."""

    def __init__(self, side: str, model_root: Path, harness_root: Path, args: list[str], log: Path,
                 env: dict[str, str] | None = None):
        self.side, self.log = side, log
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join([str(harness_root), *filter(None, [env.get("PYTHONPATH")])])
        with open(log, "w") as err:  # a file, not a pipe: a chatty worker can never block on a full pipe
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness.tune.ab.worker", "--model-root", str(model_root),
                 "--harness-root", str(harness_root), *args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=harness_root, env=env, text=True,
                bufsize=1)
        self.info: dict = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> dict:
        """Wait for the worker's first line: its model file and pid (WorkerRefused when it cannot time)."""
        message = self._read("starting")
        if "fatal" in message:
            self.proc.wait()
            raise WorkerRefused(self.side, message["fatal"], message["message"])
        self.info = message
        return message

    def ask(self, request: dict, doing: str) -> dict:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died: reading says how
        return self._read(doing)

    def _read(self, doing: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
            raise WorkerDied(f"the {self.side} worker (pid {self.proc.pid}) {how} while {doing}; its stderr "
                             f"({self.log}) ends:\n{self.stderr_tail() or '(nothing)'}")
        return json.loads(line)

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(collections.deque(f, maxlen=lines)).rstrip()
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask it to quit; kill it (by its pid) if it does not."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._close_pipes()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
