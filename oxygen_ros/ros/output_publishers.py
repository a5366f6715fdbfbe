"""
The node's lifecycle publishers: action chunks go out now or never, texts wait while inactive.

An action chunk is only worth sending while the node is active: one that cannot go out is
dropped. A text message (an answer, a memory note, a subtask, a streamed piece) is a reply
someone waits for, so while its publisher is not active (deactivated, or destroyed at cleanup)
it is held, in order, and sent at the next activation before any newer text. One lock orders
publishing against activation and deactivation (``rclpy`` lifecycle publishers are activated
by ``LifecycleNode.on_activate``; publishing to an inactive one only logs a warning).
"""

from __future__ import annotations

from collections import deque
import threading
from typing import Callable, Iterable, TypeVar

from oxygen_ros.engine import TextTask
from oxygen_ros.ros.action_output import ACTION_CHUNK, EE_DELTA_CHUNK
from oxygen_ros.ros.endpoints import CHUNK_ENDPOINTS, robot_topic, text_endpoints
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros_interfaces.msg import DecodedText
from rclpy.lifecycle import LifecycleNode
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory, MultiDOFJointTrajectory

MAX_HELD = 10_000
"""Text messages kept for publishers that are not active (the oldest go first beyond it)."""
_CHUNK_TYPES = {ACTION_CHUNK: JointTrajectory, EE_DELTA_CHUNK: MultiDOFJointTrajectory}
_T = TypeVar('_T')


class OutputPublishers:
    """
    The lifecycle publishers of one configuration.

    Keyed ``action_chunk``, ``ee_delta_chunk``, ``<task>`` and ``<task>/stream`` (``TextTask``
    values).

    :param node: the lifecycle node that owns the publishers.
    :param max_held: text messages held while inactive; beyond it the oldest is dropped, with
        a warning.
    :param robot: the robot whose topics they are (``endpoints.robot_topic``; '': the node's).
    """

    def __init__(self, node: LifecycleNode, max_held: int = MAX_HELD, *, robot: str = '') -> None:
        self._node = node
        self._robot = robot
        self._lock = threading.Lock()
        self._pubs: dict[str, object] = {}
        self._held: deque[tuple[str, object]] = deque(maxlen=max_held)

    def __getitem__(self, key: str) -> object:
        """Return the publisher of ``key``; raise ``KeyError`` if there is none."""
        with self._lock:
            return self._pubs[key]

    def __len__(self) -> int:
        """Return how many publishers exist (0 before configure and after cleanup)."""
        with self._lock:
            return len(self._pubs)

    def create(self, chunk_keys: Iterable[str]) -> None:
        """Create the chunk publishers named in ``chunk_keys`` and every text publisher."""
        pubs = {}
        for key in chunk_keys:
            pubs[key] = self._node.create_lifecycle_publisher(
                _CHUNK_TYPES[key], robot_topic(CHUNK_ENDPOINTS[key].name, self._robot), 10)
        for task in TextTask:
            whole, stream = (robot_topic(e.name, self._robot) for e in text_endpoints(task))
            pubs[task.value] = self._node.create_lifecycle_publisher(String, whole, TEXT_QOS)
            pubs[f'{task.value}/stream'] = self._node.create_lifecycle_publisher(
                DecodedText, stream, TEXT_QOS)
        with self._lock:
            self._pubs = pubs

    def activate(self, transition: Callable[[], _T]) -> _T:
        """Run the activate ``transition``, then send the held texts before any newer one."""
        with self._lock:
            result = transition()
            held, self._held = self._held, deque(maxlen=self._held.maxlen)
            for key, msg in held:
                pub = self._pubs.get(key)
                if pub is not None:
                    pub.publish(msg)
        return result

    def deactivate(self, transition: Callable[[], _T]) -> _T:
        """Run the deactivate ``transition``: no text goes to a publisher meanwhile."""
        with self._lock:
            return transition()

    def publish_chunk(self, key: str, msg: object) -> bool:
        """Publish an action chunk message if its publisher exists; return whether it did."""
        with self._lock:
            pub = self._pubs.get(key)
            if pub is None:
                return False
            pub.publish(msg)
            return True

    def publish_text(self, key: str, msg: object) -> None:
        """Publish a text message, or hold it while its publisher is not active."""
        with self._lock:
            pub = self._pubs.get(key)
            if pub is not None and pub.is_activated:
                pub.publish(msg)
                return
            if len(self._held) == self._held.maxlen:
                self._node.get_logger().warning(
                    f'{self._held.maxlen} text messages held while inactive: dropping the '
                    f'oldest')
            self._held.append((key, msg))

    def destroy(self) -> None:
        """Destroy the publishers (held texts are kept for the next configuration)."""
        with self._lock:
            for pub in self._pubs.values():
                self._node.destroy_lifecycle_publisher(pub)
            self._pubs = {}
