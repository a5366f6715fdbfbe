"""
The executor the ``oxygen`` node spins: rclpy's ``MultiThreadedExecutor`` minus a busy loop.

rclpy 7.1 (Jazzy) yields a callback task again while it still waits in the thread pool, and
``spin`` submits it again without waiting (ros2/rclpy#1452, fixed upstream by
ros2/rclpy#1547, not in the Jazzy wheels): the spin thread then loops at 100 % CPU holding the
GIL and starves the callbacks (what it did to the node: ``docs/limits.md``). Here a task is
submitted once; while it waits for a worker, the spin thread sleeps 1 ms.

A callback group can be pinned to a thread of its own (``pinned``): its callbacks then always
run there, never on the pool. The node pins its control group: glibc malloc keeps what a
thread frees in that thread's arena, so a control cycle that ran on any of the pool's workers
left its largest working set (a full decode batch: ``docs/robustness.md#soak``) resident in
every worker's arena, RSS stepping up once per worker; pinned, in one.

A callback's exception is logged (ERROR, logger ``oxygen.executor``, with its traceback).
rclpy stores it in the callback's task and ``MultiThreadedExecutor`` re-raises it in the spin
thread, ending the spin; raised from a pool worker, as before, it vanished into the pool's
discarded future: neither the node nor its user saw it. The node's callbacks catch what they
can answer for (``ask_action``, ``text_outputs``); this is the backstop for the rest.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import threading
import time
import traceback
from typing import Callable, Mapping, TypeVar

from rclpy.callback_groups import CallbackGroup
from rclpy.context import Context
from rclpy.executors import (
    ConditionReachedException, Executor, ExternalShutdownException, MultiThreadedExecutor,
    ShutdownException, TimeoutException)
from rclpy.logging import get_logger

_QUEUED_SLEEP_S = 0.001
T = TypeVar('T')


class NodeExecutor(MultiThreadedExecutor):
    """
    A ``MultiThreadedExecutor`` that submits each ready callback to its pool exactly once.

    :param num_threads: worker threads (one per callback group that may run at once).
    :param context: the rclpy context (default: the global one).
    :param pinned: thread name -> a callback group whose callbacks always run on that one
        thread of their own (use it for a MutuallyExclusive group: one callback at a time).
    """

    def __init__(self, num_threads: int, *, context: Context | None = None,
                 pinned: Mapping[str, CallbackGroup] | None = None) -> None:
        super().__init__(num_threads=num_threads, context=context)
        self._queued: set[object] = set()
        self._queued_lock = threading.Lock()
        self._pinned = {group: ThreadPoolExecutor(1, thread_name_prefix=name)
                        for name, group in (pinned or {}).items()}

    def _spin_once_impl(self, timeout_sec: float | None = None,
                        wait_condition: Callable[[], bool] = lambda: False) -> None:
        try:
            task, entity, _ = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except (ExternalShutdownException, ShutdownException, TimeoutException,
                ConditionReachedException):
            return
        with self._queued_lock:
            queued = task in self._queued
            self._queued.add(task)
        if queued:
            time.sleep(_QUEUED_SLEEP_S)  # a worker needs the GIL to start it
            return
        pool = self._pinned.get(getattr(entity, 'callback_group', None), self._executor)
        pool.submit(self._run, task)

    def pinned_pool(self, group: CallbackGroup) -> ThreadPoolExecutor | None:
        """Return the one-thread pool ``group`` is pinned to (None: not pinned)."""
        return self._pinned.get(group)

    def shutdown(self, timeout_sec: float | None = None) -> bool:
        """Stop executing callbacks (``Executor.shutdown``), then let the pinned threads end."""
        done = super().shutdown(timeout_sec)
        for pool in self._pinned.values():
            pool.shutdown(wait=False)
        return done

    def _run(self, task: object) -> None:
        try:
            task()
        finally:
            with self._queued_lock:
                self._queued.discard(task)
        exc = task.exception() if task.done() else None
        if exc is not None:
            trace = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            get_logger('oxygen.executor').error(
                f'a callback raised {type(exc).__name__}: {exc}; the node goes on:\n{trace}')


def call_on(executor: Executor | None, group: CallbackGroup, fn: Callable[[], T]) -> T:
    """
    Return ``fn()`` run on the thread ``group`` is pinned to (the caller waits), else here.

    The node builds and warms its engine where its control cycle runs: what they leave behind
    (a thread's malloc arena, MKL's GEMM buffers) is then the cycle's own.

    :param executor: the node's executor (``Node.executor``): a ``NodeExecutor`` or another.
    """
    pinned = executor.pinned_pool(group) if isinstance(executor, NodeExecutor) else None
    return fn() if pinned is None else pinned.submit(fn).result()


def spin(executor: MultiThreadedExecutor) -> None:
    """Spin until the context shuts down (for a thread; no exception at shutdown)."""
    try:
        executor.spin()
    except (ExternalShutdownException, ShutdownException):
        pass


__all__ = ['NodeExecutor', 'call_on', 'spin']
