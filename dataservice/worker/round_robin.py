"""Coordinated reads on a worker: a task serves its consumers in rounds.

A task of a coordinated job (``TaskDef.num_consumers`` = n > 0) does not hand elements out first
come first served. A request names a consumer and a round (``GetElementsRequest.consumer_index``,
``round_index``); the first request for a new round takes the next n elements of the task's stream,
and consumer ``c`` gets the ``c``-th of them, once. So the n consumers of a round get n consecutive
elements of one stream: a pipeline yielding runs of n similar batches gives every replica a similar
batch in the same step (tf.data service's ``RoundRobinTaskRunner``).

Which rounds a task serves is the dispatcher's rotation (``dispatcher/coordinated_rounds.py``): a
task sees only the rounds mapped to it, in increasing order. A round is freed once each consumer took
its element (or moved past it: a consumer asking for a later round gives up its earlier ones, so it
is never served out of order). At most ``MAX_ROUNDS`` rounds are kept per task: a request for a new
round beyond them waits (up to its ``wait_ms``), then answers empty and the reader asks again — so a
consumer that lags makes the others wait instead of the worker buffering without bound. A request
for a round that is over (freed, or one this consumer already took) raises ``RoundOver`` with the
first round worth asking for instead.

A stream that ends (a pipeline of unknown cardinality that did end) ends the task's rounds: the whole
rounds filled before are still served, each consumer its element; the first round the stream cannot
fill (fewer than n elements left) is dropped for every consumer, and from it on every request answers
end of input (or the pipeline's error). The task counts as finished (``TaskRunner.finished``, which the
worker reports to the dispatcher) only once every consumer took its element of every whole round
(``drained``): a consumer that starts late still finds them here.

The worker makes a task's ``Rounds`` with the task (``runner.rounds``); ``responses.take`` reads
through it. Example::

    >>> runner.rounds = Rounds(runner, runner.task_def.num_consumers, worker.memory_budget)
    >>> elements, runs, ended, error = runner.rounds.take(
    ...     GetElementsRequest(task_id=7, consumer_index=1, round_index=40, max_elements=1), 0.5)
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from dataservice.proto import worker_pb2
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.task_runner import TaskRunner, approximate_size

__all__ = ["Rounds", "RoundOver", "MAX_ROUNDS"]

#: Rounds a task keeps at most (prepared, not yet taken by every consumer): how far the fastest
#: consumer may run ahead of the slowest on one worker.
MAX_ROUNDS = 16
#: Bytes one round's take from the task may carry (a round holds n elements whatever their size).
_ROUND_BYTES = 1 << 62


class RoundOver(LookupError):
    """The round asked for is over for this consumer on this task: ask for ``skip_to`` (a later
    round) or after. The answer's header carries it as ``skip_to_round``."""

    def __init__(self, round_index: int, skip_to: int):
        super().__init__(f"round {round_index} is over on this task; next: {skip_to}")
        self.skip_to = skip_to


class _Round:
    __slots__ = ("elements", "sizes", "taken")

    def __init__(self, n: int):
        self.elements: list = []
        self.sizes: list = []     # each element's bytes, charged to the budget while it is here
        self.taken = [False] * n


class Rounds:
    """The rounds of one coordinated task (see the module docstring), kept on its runner as
    ``runner.rounds`` (made by the worker with the task; ``TaskRunner.stop`` closes it). The elements
    of its rounds count against the worker's ``MemoryBudget`` (``budget``) until their consumers take
    them. Thread-safe."""

    def __init__(self, runner: TaskRunner, num_consumers: int, budget: Optional[MemoryBudget] = None):
        self._runner = runner
        self._n = num_consumers
        self._account = (budget if budget is not None else MemoryBudget(1 << 62)).account()
        self._cond = threading.Condition()
        self._rounds: dict[int, _Round] = {}
        self._newest = -1         # the highest round ever made here
        self._filling = False     # a request takes elements from the task (outside the lock)
        self._ended = False       # the task's stream ended (or failed) before filling a round
        self._error: Optional[BaseException] = None
        self._closed = False

    @property
    def drained(self) -> bool:
        """No consumer is owed anything here: no whole round holds an element its consumer has not taken
        (a round that ended short holds nothing: see ``_fill``), and no element is on its way from the task
        into a round. With the task's stream ended, the task is then finished (``TaskRunner.finished``): until
        then the dispatcher must not finish the iteration, which would end the read of a consumer that has
        not fetched its elements yet (and, once nobody reads it, delete the task with them)."""
        with self._cond:
            return not self._filling and not any(
                len(rnd.elements) == self._n and not all(rnd.taken) for rnd in self._rounds.values())

    @property
    def held_bytes(self) -> int:
        """Bytes of elements in rounds not yet taken by their consumers (charged to the budget)."""
        return self._account.used_bytes

    def take(self, request: worker_pb2.GetElementsRequest, wait_s: float
             ) -> tuple[list, list, bool, Optional[BaseException]]:
        """The request's consumer's element of its round, as ``TaskRunner.take`` returns elements (no
        runs: coordinated jobs keep no exactly-once bookkeeping, they are infinite): ``[element]``;
        nothing, not ready within ``wait_s`` (or closed); nothing and ended (with the task's error if it
        failed). RoundOver; ValueError for a consumer index out of range."""
        consumer, round_index = request.consumer_index, request.round_index
        if not 0 <= consumer < self._n:
            raise ValueError(f"GetElements: consumer_index {consumer} is not in [0, num_consumers={self._n})")
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._pass_before(consumer, round_index)
            while True:
                if self._closed or self._runner.stopped:
                    return [], [], False, None
                current = self._rounds.get(round_index)
                if current is None:
                    if round_index <= self._newest:
                        raise RoundOver(round_index, self._skip_to(consumer, round_index))
                    if self._ended:
                        return [], [], True, self._error
                    if len(self._rounds) < MAX_ROUNDS:
                        self._rounds[round_index] = _Round(self._n)
                        self._newest = round_index
                        continue
                elif current.taken[consumer]:
                    raise RoundOver(round_index, self._skip_to(consumer, round_index))
                elif len(current.elements) == self._n:
                    element = current.elements[consumer]
                    self._drop(current, consumer)
                    self._mark_taken(round_index, current, consumer)
                    return [element], [], False, None
                elif self._ended:
                    return [], [], True, self._error
                elif not self._filling:
                    self._fill(deadline)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], [], False, None
                self._cond.wait(remaining)

    def _fill(self, deadline: float) -> None:
        """Takes elements from the task into the oldest round not full yet (rounds are filled in the
        order they were made, so round r's elements precede round r+1's in the stream), charging their
        bytes to the budget (the task returned them to it). Called and returns under the lock; takes
        from the task without it."""
        label = min(r for r, rnd in self._rounds.items() if len(rnd.elements) < self._n)
        need = self._n - len(self._rounds[label].elements)
        self._filling = True
        self._cond.release()
        try:
            elements, _runs, ended, error = self._runner.take(need, _ROUND_BYTES, max(0.0, deadline - time.monotonic()))
        finally:
            self._cond.acquire()
            self._filling = False
            self._cond.notify_all()
        if self._closed:
            return
        target = self._rounds.get(label)
        if target is not None:
            sizes = [approximate_size(e) for e in elements]
            target.elements.extend(elements)
            target.sizes.extend(sizes)
            self._account.charge(sum(sizes))  # in memory already: no waiting for the budget
        if ended and (target is None or len(target.elements) < self._n):
            # Too few for a whole round: the rest would go to some consumers and not others. Dropped for
            # every consumer (their bytes go back), who all get the end (or the error) at this round.
            self._ended, self._error = True, error
            if target is not None:
                self._account.release(min(sum(target.sizes), self._account.used_bytes))
                target.elements, target.sizes = [], []

    def _drop(self, rnd: _Round, consumer: int) -> None:
        """The consumer's element of ``rnd`` leaves the round (taken, or given up): its bytes go back."""
        if len(rnd.sizes) > consumer and rnd.sizes[consumer]:
            rnd.elements[consumer] = None
            self._account.release(min(rnd.sizes[consumer], self._account.used_bytes))
            rnd.sizes[consumer] = 0

    def _pass_before(self, consumer: int, round_index: int) -> None:
        """The consumer asks for ``round_index``: it gives up its elements of earlier rounds here."""
        for label in [r for r in self._rounds if r < round_index]:
            rnd = self._rounds[label]
            if not rnd.taken[consumer]:
                self._drop(rnd, consumer)
                self._mark_taken(label, rnd, consumer)

    def _mark_taken(self, label: int, rnd: _Round, consumer: int) -> None:
        rnd.taken[consumer] = True
        if all(rnd.taken):
            del self._rounds[label]
            self._cond.notify_all()  # room for a new round

    def _skip_to(self, consumer: int, round_index: int) -> int:
        """The first round after ``round_index`` this consumer may still get something of here."""
        waiting = [r for r, rnd in self._rounds.items() if r > round_index and not rnd.taken[consumer]]
        return min(waiting) if waiting else max(self._newest, round_index) + 1

    def give_back(self, consumer: int, round_index: int, element: Any) -> None:
        """The answer carrying the consumer's element of the round did not reach it: the next request
        for that round gets it again."""
        with self._cond:
            if self._closed:
                return
            rnd = self._rounds.get(round_index)
            if rnd is None:
                # Freed when this consumer took the last element: keep it for this consumer alone.
                rnd = self._rounds[round_index] = _Round(self._n)
                rnd.elements = [None] * self._n
                rnd.sizes = [0] * self._n
                rnd.taken = [True] * self._n
            size = approximate_size(element)
            rnd.elements[consumer] = element
            rnd.sizes[consumer] = size
            rnd.taken[consumer] = False
            self._account.charge(size)
            self._cond.notify_all()

    def returns_to(self, request: worker_pb2.GetElementsRequest) -> "_GiveBack":
        """What an undelivered answer to ``request`` is given back to: the consumer's slot in its round."""
        return _GiveBack(self, request)

    def close(self) -> None:
        """The task stopped: drops the rounds and returns their bytes to the budget; waiting requests
        answer empty. Idempotent."""
        with self._cond:
            self._closed = True
            self._rounds.clear()
            self._account.close()
            self._cond.notify_all()


class _GiveBack:
    """What ``Prepared.give_back`` calls for an answer of a coordinated task."""

    def __init__(self, rounds: Rounds, request: worker_pb2.GetElementsRequest):
        self._rounds = rounds
        self._consumer = request.consumer_index
        self._round = request.round_index

    def untake(self, elements: list, runs: list) -> None:
        if elements:
            self._rounds.give_back(self._consumer, self._round, elements[0])
