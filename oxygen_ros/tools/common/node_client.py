"""
Clients of a running ``oxygen`` node for tools and tests: lifecycle services, process figures.

``LifecycleClient`` calls ``<node>/get_state`` and ``<node>/change_state`` and resends a request
whose reply was lost (a request sent right after discovery can be). ``ProcessFigures`` samples
a node process from outside (psutil): what ``oxygen_stress soak`` and the lifecycle tests watch for
leaks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import time
from typing import Callable

from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.node import Node

SpinUntil = Callable[[Callable[[], bool], float], bool]
"""``spin_until(predicate, timeout_s) -> bool``: spin the client's executor until true."""
_REPLY_WAIT_S = 3.0


class ServiceTimeout(RuntimeError):
    """A lifecycle service did not answer in time."""


class LifecycleClient:
    """
    The lifecycle services of one node.

    :param node: the rclpy node that owns the clients.
    :param spin_until: spins ``node``'s executor (see ``SpinUntil``).
    :param target: the lifecycle node's fully qualified name.
    """

    def __init__(self, node: Node, spin_until: SpinUntil, target: str = '/oxygen') -> None:
        self._spin_until = spin_until
        self._get = node.create_client(GetState, f'{target}/get_state')
        self._change = node.create_client(ChangeState, f'{target}/change_state')

    def _call(self, client: object, request: object, timeout_s: float) -> object:
        deadline = time.monotonic() + timeout_s
        if not self._spin_until(client.service_is_ready, timeout_s):
            raise ServiceTimeout(f'{client.srv_name} is not available after {timeout_s} s')
        while time.monotonic() < deadline:
            future = client.call_async(request)
            if self._spin_until(future.done, min(_REPLY_WAIT_S, deadline - time.monotonic())):
                return future.result()
            client.remove_pending_request(future)
        raise ServiceTimeout(f'{client.srv_name} did not answer in {timeout_s} s')

    @property
    def ready(self) -> bool:
        """Return whether ``get_state`` is discovered."""
        return self._get.service_is_ready()

    def state(self, timeout_s: float = 20.0) -> int:
        """Return the current state id (``lifecycle_msgs/State.PRIMARY_STATE_*``)."""
        return self._call(self._get, GetState.Request(), timeout_s).current_state.id

    def change(self, transition_id: int, timeout_s: float = 60.0) -> bool:
        """Request a transition (``lifecycle_msgs/Transition.TRANSITION_*``); return success."""
        request = ChangeState.Request(transition=Transition(id=transition_id))
        return self._call(self._change, request, timeout_s).success

    def wait_for(self, state_id: int, timeout_s: float,
                 alive: Callable[[], bool] = lambda: True) -> bool:
        """Poll until the node is in ``state_id``; False on timeout or when ``alive()`` fails."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if self.ready and self.state() == state_id:
                return True
            self._spin_until(lambda: False, 0.1)
        return False


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One sample of a process (sizes in bytes)."""

    time_s: float
    """Monotonic seconds."""
    rss: int
    uss: int
    """Unique set size: memory freed if the process exited (psutil ``memory_full_info``)."""
    num_fds: int
    num_threads: int
    cpu_percent: float
    """Since the previous sample (100 % = one core)."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class ProcessFigures:
    """
    Samples another process (psutil).

    :param pid: the process id.
    :raises psutil.NoSuchProcess: no such process.
    """

    def __init__(self, pid: int) -> None:
        import psutil
        self._proc = psutil.Process(pid)
        self._proc.cpu_percent()

    def sample(self) -> ProcessSample:
        """
        Return the process's figures now.

        :raises psutil.NoSuchProcess: the process has exited.
        """
        with self._proc.oneshot():
            mem = self._proc.memory_full_info()
            return ProcessSample(time.monotonic(), mem.rss, mem.uss, self._proc.num_fds(),
                                 self._proc.num_threads(), self._proc.cpu_percent())


__all__ = ['LifecycleClient', 'ProcessFigures', 'ProcessSample', 'ServiceTimeout', 'SpinUntil']
