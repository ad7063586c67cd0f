"""Timing one call: eager and CUDA-graph replay, L2 flushed before every sample, CUDA events, median and spread.

Every sample starts from an idle device with a cold L2: a >= 256 MB buffer is written (evicting the 60 MB
L2 of an H200 several times over), the device is synchronised, then the call is timed between two events.
Eager times therefore include the host's launch overhead, as serving without graphs pays it. On a CPU the
host clock times the call and there is nothing to flush.

Two more figures keep the GPU's time apart from the host's:
- `time_hidden`: the GPU's own time. After the flush the stream is kept busy (a spin kernel longer than the host
  needs to enqueue the call), the start event is recorded behind it and the call is enqueued meanwhile, so the
  call's kernels start back to back when the spin ends: no launch latency, no host time between kernels. For a
  graph replay this is the replay's GPU time; an eager call whose host time outruns the spin is capped by it.
- `host_us_per_call`: what the host spends per call, over back-to-back calls without synchronising (the GPU,
  faster than the host at decode sizes, never makes the host wait).
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Timing", "L2Flusher", "time_eager", "capture_graph", "time_graph", "graphs_supported", "warm_device",
           "device_identity", "triton_version", "time_hidden", "host_us_per_call", "busy_wait"]

FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Timing:
    median_us: float
    p25_us: float
    p75_us: float
    samples: int

    @property
    def spread(self) -> float:
        """Interquartile range over the median."""
        return (self.p75_us - self.p25_us) / self.median_us if self.median_us > 0 else 0.0

    def as_dict(self) -> dict:
        return {"median_us": self.median_us, "p25_us": self.p25_us, "p75_us": self.p75_us,
                "spread": self.spread, "samples": self.samples}


def _summarise(samples_us: list[float]) -> Timing:
    q = statistics.quantiles(samples_us, n=4, method="inclusive") if len(samples_us) > 1 else samples_us * 3
    return Timing(statistics.median(samples_us), q[0], q[2], len(samples_us))


class L2Flusher:
    def __init__(self, device: torch.device, nbytes: int = FLUSH_BYTES):
        self.device = device
        self.buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=device) if device.type == "cuda" else None

    def flush(self) -> None:
        if self.buffer is not None:
            self.buffer.fill_(1.0)  # a write: dirty lines of earlier data are evicted, not kept


def warm_device(device: torch.device, seconds: float = 1.0) -> None:
    """Keep the GPU busy with matrix work for `seconds` before anything is timed, so the first points are not
    timed while its clocks and the host's launch path come up to speed (a CPU needs nothing)."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            a = (a @ a).mul_(1e-2)
        torch.cuda.synchronize(device)
    del a


def device_identity(device: torch.device) -> dict:
    """Which physical device measured: the GPU's UUID tells two machines of one model apart, where host names
    (often "vm") do not."""
    if device.type != "cuda":
        import platform

        return {"device": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(device)
    return {"device": props.name, "gpu_uuid": str(getattr(props, "uuid", "")) or None}


def triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def graphs_supported(device: torch.device) -> bool:
    return device.type == "cuda"


def _sample(run: Callable[[], object], device: torch.device, flusher: L2Flusher, reps: int) -> Timing:
    samples = []
    for _ in range(reps):
        flusher.flush()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            run()
            samples.append((time.perf_counter() - t0) * 1e6)
    return _summarise(samples)


def time_eager(fn: Callable[[], object], device: torch.device, flusher: L2Flusher, reps: int, warmup: int) -> Timing:
    for _ in range(warmup):  # compilation, autotuning, handle creation stay out of the samples
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _sample(fn, device, flusher, reps)


def capture_graph(fn: Callable[[], object], device: torch.device) -> tuple[torch.cuda.CUDAGraph | None, str | None]:
    """(graph, None), or (None, why not) when the call cannot be captured (a host copy, a sync, ...).

    `fn` must have run eagerly first (Triton compiles and autotunes outside the capture)."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # the capture is abandoned; the stream leaves capture mode with it
        torch.cuda.synchronize(device)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"not capturable: {type(exc).__name__}: {first[:160]}"
    torch.cuda.synchronize(device)
    return graph, None


def busy_wait(device: torch.device, us: float) -> None:
    """Keep `device`'s current stream busy for about `us` microseconds (a spin kernel); nothing off CUDA."""
    if device.type == "cuda" and us > 0:
        torch.cuda._sleep(int(us * cycles_per_us(device.index if device.index is not None else
                                                 torch.cuda.current_device())))


@functools.lru_cache(maxsize=None)
def cycles_per_us(index: int) -> float:
    """The spin kernel's clock cycles per microsecond on CUDA device `index`, measured once with events."""
    device = torch.device("cuda", index)
    torch.cuda._sleep(1000)  # load the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    torch.cuda.synchronize(device)
    return cycles / (start.elapsed_time(end) * 1e3)


def host_us_per_call(run: Callable[[], object], device: torch.device, calls: int) -> float:
    """Host microseconds per call over `calls` back-to-back calls, nothing synchronised between them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    took = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return took / calls * 1e6


def time_hidden(run: Callable[[], object], device: torch.device, flusher: L2Flusher, reps: int,
                cover_us: float) -> Timing | None:
    """The GPU's time for `run` with its launch hidden: after the flush the stream spins `cover_us` (longer than
    the host takes to enqueue `run`), the start event is recorded behind the spin, `run` is enqueued meanwhile.
    None off CUDA (a CPU's call has no GPU time apart from the host's)."""
    if device.type != "cuda":
        return None
    samples = []
    for _ in range(reps):
        flusher.flush()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        busy_wait(device, cover_us)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return _summarise(samples)


def time_graph(graph: torch.cuda.CUDAGraph, device: torch.device, flusher: L2Flusher, reps: int) -> Timing:
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize(device)
    return _sample(graph.replay, device, flusher, reps)
