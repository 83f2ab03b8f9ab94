"""The scaling signal: how many workers the cluster should have, from client stall and worker load.

A pure function of what the dispatcher measured (``recommend``), modelled on Cachew's autoscaling
policy (Graur et al., "Cachew: Machine Learning Input Data Processing as a Service", USENIX ATC'22):
add workers while the consumers wait for data *and* the workers are the reason (they are busy, not
blocked on a full buffer); remove workers when the consumers do not wait and the workers idle. The
inputs are two fractions over the last ``client_stats.SIGNAL_WINDOW_S`` seconds:

* ``stall`` — the largest share of time any reading client's consumer spent waiting inside ``next()``
  (the most starved job decides: averaging would hide it behind a well-fed one);
* ``busy`` — the workers' producer threads, busy producing against blocked on a full buffer or the
  memory budget, averaged over the live workers (a worker without a running task counts 0).

The policy, in order (``ScalingPolicy`` holds the thresholds):

======================================================  ==========================================
condition                                               recommendation
======================================================  ==========================================
no live worker                                          ``max(min_workers, 1)``
a change was recommended less than ``cooldown_s`` ago   that recommendation again (new workers need
                                                        time to register and fill their buffers)
``stall > stall_up`` and ``busy >= busy_up``            up: ``ceil(current / (1 - stall))``, at
                                                        least +1, at most ``+max(1, current *
                                                        max_step_up)`` (bounded steps)
``stall > stall_up``, ``busy < busy_up``                hold: the workers are not the bottleneck
                                                        (the network, or the client itself)
``stall <= stall_down`` and ``busy < busy_down``,       down: ``ceil(current * busy / busy_up)``, at
held for ``down_after_s``                               most ``max(1, current * max_step_down)``
                                                        fewer
anything else                                           hold (hysteresis: between the thresholds)
======================================================  ==========================================

and the result is clipped to ``[min_workers, max_workers]``. ``ceil(current / (1 - stall))`` is the
count at which saturated workers (throughput in proportion to their number) would deliver what the
consumers ask: a consumer waiting 50% of the time gets half of what it could take, so twice the
workers. The up and down thresholds differ, scaling down waits for the condition to last, and a
change is followed by a cooldown: so the count does not flap when the load sits near a threshold.

Example::

    >>> recommend(2, stall=0.5, busy=0.95, now=100.0)[0]
    WorkerRecommendation(count=4, current=2, reason='clients stall 50% of the time and the workers are busy 95%: ...')
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from dataservice.dispatcher.client_stats import WorkerRecommendation

__all__ = ["ScalingPolicy", "ScalingState", "recommend"]


@dataclasses.dataclass(frozen=True)
class ScalingPolicy:
    """The thresholds of ``recommend`` (fractions are of wall time, 0..1).

    Example::

        >>> ScalingPolicy(max_workers=16, down_after_s=120).stall_up
        0.1
    """

    #: Scale up when the most-stalled client waits more than this share of its time...
    stall_up: float = 0.10
    #: ...and the workers are busy at least this share of theirs.
    busy_up: float = 0.80
    #: Scale down only when no client waits more than this share...
    stall_down: float = 0.05
    #: ...and the workers are busy less than this share.
    busy_down: float = 0.50
    #: How long the scale-down condition must hold before a smaller count is recommended.
    down_after_s: float = 60.0
    #: After recommending a new count, keep it this long (workers take time to start and fill buffers).
    cooldown_s: float = 30.0
    #: One step adds at most this share of the current workers (at least one worker).
    max_step_up: float = 1.0
    #: One step removes at most this share of the current workers (at least one worker).
    max_step_down: float = 0.25
    min_workers: int = 1
    max_workers: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("stall_up", "busy_up", "stall_down", "busy_down"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ScalingPolicy.{name} must be a fraction in [0, 1], got {value!r}")
        if self.stall_down > self.stall_up or self.busy_down > self.busy_up:
            raise ValueError(f"ScalingPolicy: the down thresholds must not exceed the up thresholds (stall_down "
                             f"{self.stall_down} <= stall_up {self.stall_up}, busy_down {self.busy_down} <= busy_up "
                             f"{self.busy_up}), or the count would flap")
        for name in ("down_after_s", "cooldown_s", "max_step_up", "max_step_down"):
            if getattr(self, name) < 0:
                raise ValueError(f"ScalingPolicy.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.min_workers < 0 or (self.max_workers is not None and self.max_workers < max(1, self.min_workers)):
            raise ValueError(f"ScalingPolicy: need 0 <= min_workers <= max_workers and max_workers >= 1, got "
                             f"min_workers={self.min_workers}, max_workers={self.max_workers}")


@dataclasses.dataclass(frozen=True)
class ScalingState:
    """What ``recommend`` remembers between calls: since when the scale-down condition has held, and the
    last change it recommended (when, and the count). Start with ``ScalingState()``."""

    down_since: Optional[float] = None
    changed_at: Optional[float] = None
    changed_to: Optional[int] = None


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def recommend(current: int, stall: Optional[float], busy: Optional[float], now: float,
              state: ScalingState = ScalingState(), policy: ScalingPolicy = ScalingPolicy()
              ) -> tuple[WorkerRecommendation, ScalingState]:
    """The recommended worker count and the state for the next call (see the module docstring).

    ``current`` is the number of live workers; ``stall`` the largest recent stall fraction of the
    reading clients (None: no client reads); ``busy`` the workers' mean busy fraction (None: none
    reported); ``now`` a monotonic time in seconds.

    Example::

        >>> rec, state = recommend(4, stall=0.0, busy=0.1, now=0.0)            # idle: the clock starts
        >>> rec.count, rec.reason
        (4, 'idle (clients stall 0% of the time, workers busy 10%) for 0 s: scaling down after 60 s')
        >>> recommend(4, stall=0.0, busy=0.1, now=61.0, state=state)[0].count  # idle for 61 s
        3
    """
    def clip(n: int) -> int:
        n = max(n, policy.min_workers, 1 if current == 0 else 0)
        return min(n, policy.max_workers) if policy.max_workers is not None else n

    def decided(count: int, reason: str, down_since: Optional[float]) -> tuple[WorkerRecommendation, ScalingState]:
        count = clip(count)
        if count != current:
            return WorkerRecommendation(count, current, reason), ScalingState(down_since, now, count)
        return WorkerRecommendation(count, current, reason), ScalingState(down_since, state.changed_at,
                                                                          state.changed_to)

    if current <= 0:
        return decided(max(policy.min_workers, 1), "no live worker", None)
    if state.changed_at is not None and state.changed_to is not None and state.changed_to != current \
            and now - state.changed_at < policy.cooldown_s:
        return (WorkerRecommendation(clip(state.changed_to), current,
                                     f"recommended {state.changed_to} workers {now - state.changed_at:.0f} s ago: "
                                     f"waiting {policy.cooldown_s:.0f} s for the change to take effect"), state)
    stall_v = 0.0 if stall is None else min(1.0, max(0.0, stall))
    busy_v = 0.0 if busy is None else min(1.0, max(0.0, busy))
    stalls = f"clients stall {_percent(stall_v)} of the time" if stall is not None else "no client reads"
    if stall is not None and stall_v > policy.stall_up:
        if busy_v >= policy.busy_up:
            wanted = math.ceil(current / max(0.1, 1.0 - stall_v))  # a 90% stall asks for 10x, not infinity
            most = current + max(1, math.floor(current * policy.max_step_up))
            count = min(max(wanted, current + 1), most)
            if clip(count) <= current:
                return decided(current, f"{stalls} and the workers are busy {_percent(busy_v)}, but the cluster "
                                        f"is at max_workers ({policy.max_workers})", None)
            return decided(count, f"{stalls} and the workers are busy {_percent(busy_v)}: scaling up to {count}", None)
        return decided(current, f"{stalls} but the workers are busy only {_percent(busy_v)} (not saturated): more "
                                f"workers would not help; the bottleneck is elsewhere (network, or the client)", None)
    if stall_v <= policy.stall_down and busy_v < policy.busy_down:
        since = state.down_since if state.down_since is not None else now
        idle = f"idle ({stalls}, workers busy {_percent(busy_v)})"
        if now - since < policy.down_after_s:
            return decided(current, f"{idle} for {now - since:.0f} s: scaling down after {policy.down_after_s:.0f} s",
                           since)
        wanted = math.ceil(current * busy_v / policy.busy_up) if policy.busy_up > 0 else current
        least = current - max(1, math.floor(current * policy.max_step_down))
        count = max(wanted, least)
        if clip(count) >= current:
            return decided(current, f"{idle}, already at min_workers ({policy.min_workers})", since)
        # The clock restarts: the next step down waits down_after_s again (after the cooldown).
        return decided(count, f"{idle} for {now - since:.0f} s: scaling down to {clip(count)}", None)
    return decided(current, f"steady ({stalls}, workers busy {_percent(busy_v)}): within the thresholds", None)
