"""Process placement for the embedded server (harness/serving/placement.py), on real processes."""
from __future__ import annotations

import os

import pytest

from harness.serving.placement import CpuLayout, apply_to_server, client_on, plan_layout
from tests.unit.stand_in_vllm import stand_in_server


def test_two_cores_put_engine_with_worker_and_frontend_alone():
    assert plan_layout([0, 1]) == CpuLayout(worker=(0,), engine=(0,), frontend=(1,))
    assert plan_layout([3, 2]) == CpuLayout(worker=(2,), engine=(2,), frontend=(3,))


def test_more_cores_give_the_engine_its_own_core_and_the_worker_the_middle():
    assert plan_layout(list(range(8))) == CpuLayout(worker=(1, 2, 3, 4, 5, 6), engine=(0,), frontend=(7,))


def test_one_core_has_no_layout():
    assert plan_layout([0]) is None


def test_layout_tells_vllm_where_the_worker_threads_go():
    assert plan_layout([0, 1]).server_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    assert plan_layout(list(range(5))).server_env() == {"VLLM_CPU_OMP_THREADS_BIND": "1,2,3"}


needs_two = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to place processes apart")


@needs_two
def test_server_tree_is_placed_by_process_title_and_the_worker_is_left_alone():
    cpus = sorted(os.sched_getaffinity(0))
    layout = plan_layout(cpus)
    with stand_in_server() as (leader, kids):
        os.sched_setaffinity(kids["VLLM::Worker"].pid, {cpus[-1]})  # as vLLM binds it: must stay
        apply_to_server(leader.pid, layout)
        assert os.sched_getaffinity(kids["VLLM::EngineCore"].pid) == set(layout.engine)
        assert os.sched_getaffinity(leader.pid) == set(layout.frontend)
        assert os.sched_getaffinity(kids["VLLM::Worker"].pid) == {cpus[-1]}


@needs_two
def test_client_runs_on_the_frontend_cores_and_is_restored_after():
    before = os.sched_getaffinity(0)
    target = (sorted(before)[-1],)
    with client_on(target):
        assert os.sched_getaffinity(0) == set(target)
    assert os.sched_getaffinity(0) == before
    with client_on(None):
        assert os.sched_getaffinity(0) == before


def test_mirrored_layout_swaps_the_two_cores_and_keeps_the_worker_thread_count_elsewhere():
    assert plan_layout([0, 1]).mirrored() == CpuLayout(worker=(1,), engine=(1,), frontend=(0,))
    eight = plan_layout(list(range(8)))
    assert eight.mirrored() == eight


@needs_two
def test_a_server_started_mirrored_has_its_worker_moved_to_the_layout():
    layout = plan_layout(sorted(os.sched_getaffinity(0)))
    with stand_in_server() as (leader, kids):
        os.sched_setaffinity(kids["VLLM::Worker"].pid, set(layout.mirrored().worker))  # where it started
        apply_to_server(leader.pid, layout, move_worker=True)
        assert os.sched_getaffinity(kids["VLLM::Worker"].pid) == set(layout.worker)
        assert os.sched_getaffinity(kids["VLLM::EngineCore"].pid) == set(layout.engine)
        assert os.sched_getaffinity(leader.pid) == set(layout.frontend)
