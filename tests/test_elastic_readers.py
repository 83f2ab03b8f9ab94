"""Elastic readers: ``distribute(..., deterministic=True, job_name=J, num_readers=N, reader_index=i)`` gives
reader ``i`` the elements ``S[i], S[i+N], ...`` of the deterministic sequence, whole rounds only; states saved
at one step by N readers restore into N' readers, every element of ``S`` once across the runs.

Through an in-process cluster (tests/cluster.py); the same with trainer processes killed with SIGKILL:
tests/test_resumable_reads_processes.py.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time

import numpy as np
import pytest

from dataservice import Dataset, distribute, errors
from tests.cluster import TestCluster, wait_until

#: The longest one reader may take to read its share in these tests.
READ_TIMEOUT_S = 60


def jitter(x):
    time.sleep(random.random() * 0.0003)  # workers finish groups in another order each run
    return x


def pipeline(cluster, n, i, job_name, base):
    return base.apply(distribute("distributed_epoch", cluster.target, job_name=job_name, deterministic=True,
                                 num_readers=n, reader_index=i))


def read_all(datasets, steps=None, states=None, delay_s=0.0):
    """Iterates every dataset on a thread of its own (the readers of one job run together, as ranks do): per
    reader what it took (``steps`` at most) and its state after that, or the exception it raised."""
    results: dict = {}

    def run(k, ds):
        try:
            it = iter(ds)
            if states is not None:
                it.load_state_dict(states[k])
            taken = []
            for x in it:
                taken.append(int(np.asarray(x).ravel()[0]))
                if steps is not None and len(taken) == steps:
                    break
            state = json.loads(json.dumps(it.state_dict()))
            it.close()
            results[k] = (taken, state)
        except Exception as exc:  # handed to the test's thread
            results[k] = exc

    threads = []
    for k, ds in enumerate(datasets):
        threads.append(threading.Thread(target=run, args=(k, ds), daemon=True))
        threads[-1].start()
        if delay_s:
            time.sleep(delay_s)
    for t in threads:
        t.join(READ_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    return [results[k] for k in range(len(datasets))]


@pytest.fixture(scope="module")
def three_workers():
    with TestCluster(num_workers=3) as cluster:
        yield cluster


def test_each_reader_gets_every_nth_element_of_whole_rounds(three_workers):
    base = Dataset.range(2_000).map(jitter).filter(lambda x: x % 7 != 3)
    sequence = [int(x) for x in base]
    results = read_all([pipeline(three_workers, 3, i, "nth", base) for i in range(3)])
    for i, (taken, _) in enumerate(results):
        assert taken == sequence[i::3][:len(sequence) // 3]


def test_two_readers_save_three_restore_then_one_every_element_once(three_workers):
    base = Dataset.range(3_000).map(jitter).filter(lambda x: x % 5 != 0)  # positions count outputs, not inputs
    sequence = [int(x) for x in base]
    first = read_all([pipeline(three_workers, 2, i, "rescale", base) for i in range(2)], steps=300)
    positions = {state["position"]["position"] for _, state in first}
    assert positions == {600}
    second = read_all([pipeline(three_workers, 3, i, "rescale", base) for i in range(3)], steps=200,
                      states=[first[i % 2][1] for i in range(3)])
    assert {state["position"]["position"] for _, state in second} == {1_200}
    for i, (taken, _) in enumerate(second):
        assert taken == sequence[600 + i::3][:200]
    (third,) = read_all([base.apply(distribute("distributed_epoch", three_workers.target, deterministic=True))],
                        states=[second[2][1]])
    everything = [x for taken, _ in first + second + [third] for x in taken]
    assert sorted(everything) == sorted(sequence)  # 2 readers, then 3, then 1 plain reader: each element once


def test_variable_size_elements_resume_by_position(three_workers):
    base = Dataset.range(600).map(lambda x: np.full(int(x) % 17 + 1, x, np.int64)).map(jitter)
    sequence = [int(np.asarray(x)[0]) for x in base]
    first = read_all([pipeline(three_workers, 2, i, "sizes", base) for i in range(2)], steps=111)
    rest = read_all([pipeline(three_workers, 4, i, "sizes", base) for i in range(4)],
                    states=[first[i % 2][1] for i in range(4)])
    taken = sorted(x for taken, _ in first + rest for x in taken)
    remainder = len(sequence) - 222
    assert taken == sorted(sequence[:222] + sequence[222:][:remainder - remainder % 4])


def test_readers_that_restore_states_of_different_steps_are_told_so(three_workers):
    base = Dataset.range(1_000)
    saved = read_all([pipeline(three_workers, 2, i, "steps", base) for i in range(2)], steps=100)
    other = read_all([pipeline(three_workers, 2, i, "steps-b", base) for i in range(2)], steps=101)
    # Reader 1 restores a state of another step than reader 0's, a moment after reader 0 started.
    results = read_all([pipeline(three_workers, 2, i, "steps", base) for i in range(2)],
                       states=[saved[0][1], other[1][1]], delay_s=0.5)
    for result in results:
        assert isinstance(result, errors.InvalidRequestError), result
        assert "position 202" in str(result) and "position 200" in str(result)


def test_a_worker_lost_mid_epoch_loses_nothing_for_any_reader():
    with TestCluster(num_workers=3) as cluster:
        base = Dataset.range(4_000).map(lambda x: (time.sleep(0.0002), x)[1])
        sequence = list(range(4_000))
        datasets = [pipeline(cluster, 2, i, "loss", base) for i in range(2)]
        results: dict = {0: [], 1: []}

        def run(i):
            for x in datasets[i]:
                results[i].append(int(x))

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: len(results[0]) > 300, READ_TIMEOUT_S, "reader 0 to be mid-epoch")
        cluster.stop_worker(1)
        for t in threads:
            t.join(READ_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads)
        for i in range(2):
            assert results[i] == sequence[i::2]


def test_a_reader_index_is_read_once_and_a_second_reader_of_it_is_told_what_to_do(three_workers):
    base = Dataset.range(1_000)
    read_all([pipeline(three_workers, 2, i, "once", base) for i in range(2)], steps=50)
    (again,) = read_all([pipeline(three_workers, 2, 0, "once", base)])
    assert isinstance(again, errors.InvalidRequestError), again
    assert "reader_index 0" in str(again) and "load_state_dict" in str(again)


def test_epochs_after_a_restore_are_read_by_the_restored_readers_together(three_workers):
    # repeat() after distribute: the restored readers (3, where 2 saved) read the later epochs of their job.
    base = Dataset.range(500)

    def repeated(n, i):
        return pipeline(three_workers, n, i, "epochs", base).repeat(3)

    first = read_all([repeated(2, i) for i in range(2)], steps=300)  # epoch 1, and 100 of epoch 2
    rest = read_all([repeated(3, i) for i in range(3)], states=[first[i % 2][1] for i in range(3)])
    taken = [x for part, _ in first + rest for x in part]
    # Epoch 2's remaining 400 are 133 whole rounds of 3, epoch 3's 500 are 166: one element and two dropped.
    assert len(taken) == 500 + 100 + 399 + 498
    assert collections.Counter(collections.Counter(taken).values()) == {3: 498, 2: 1, 1: 1}
    for i, (part, _) in enumerate(rest):
        assert part[133:] == list(range(i, 498, 3))  # epoch 3: a whole epoch of the restored job


def test_readers_restoring_one_step_share_a_job_whatever_marks_their_states_hold(three_workers):
    """Each reader keeps the marks its own fetchers received, so states saved at one step may name another
    place for a group's worker to start, or none. They name one position, so they restore one job."""
    base = Dataset.range(2_000)
    first = read_all([pipeline(three_workers, 2, i, "marks", base) for i in range(2)], steps=350)  # position 700
    states = [state for _, state in first]
    with_seek = next((s for s in states if s["position"]["seeks"]), None)
    assert with_seek is not None, "no reader holds a mark of the group taken in part"
    bare = json.loads(json.dumps(with_seek))
    bare["position"]["seeks"] = []  # what a reader that received no mark of it saves
    rest = read_all([pipeline(three_workers, 2, i, "marks", base) for i in range(2)], states=[with_seek, bare])
    assert not any(isinstance(r, Exception) for r in rest), rest
    taken = [x for part, _ in first + rest for x in part]
    assert sorted(taken) == list(range(2_000))
