"""
One robot the node serves: its inputs, its action chunks and its texts, on its own topics.

The node serves one robot, or several with one engine (the ``robots`` parameter,
``docs/running.md#several-robots``): a ``RobotIO`` each. A named robot's topics and its
``~/ask`` action are under its namespace (``endpoints.robot_topic``: ``/<name>/camera/...``,
``/<name>/joint_states``, ``/<name>/oxygen/action_chunk``, ``/<name>/oxygen/ask``); the one
unnamed robot ``''`` has the node's own. Each robot has its own config
(``NodeConfig.robot``: joint names, limits, instruction, control rate, ``action_dt``).

A robot holds, for the life of the node, its text requests (``TextRequests``: its questions
read its own frames only), its ``~/ask`` action server and its text outputs and publishers
(``OutputPublishers``); from configure to cleanup its observation cache and subscriptions
(which only store the newest message, in the input group); and, in the control thread, its
chunk smoothing, its chunk messages and the logs of its refused inputs and clipped chunks.
Its refusals and clips are counted in its own ``/diagnostics`` figures, so a robot whose
input is stale or invalid is reported alone and stops getting chunks, while the others keep
theirs (``control_cycle``).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from oxygen_ros.control.action_space import ClipCount
from oxygen_ros.control.rtc import RtcRequest
from oxygen_ros.engine import (
    ActionChunk, Engine, ObservationError, PreparedObservation, RefusalReason)
from oxygen_ros.ros.action_output import ChunkOutput
from oxygen_ros.ros.ask_action import AskAction
from oxygen_ros.ros.chunk_smoother import ChunkSmoother
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.endpoints import (
    ASK_ACTION, ASK_TOPIC, camera_endpoint, INSTRUCTION, JOINT_STATES, robot_topic)
from oxygen_ros.ros.images.transport import camera_input, ImageTransport
from oxygen_ros.ros.node_config import NodeConfig
from oxygen_ros.ros.observation_cache import ObservationCache
from oxygen_ros.ros.outcomes import REJECTION_NAMES
from oxygen_ros.ros.output_publishers import OutputPublishers
from oxygen_ros.ros.text_outputs import TextOutputs
from oxygen_ros.ros.text_requests import TextRequests
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros.ros.topics import qos_profile, QosRole
from rclpy.callback_groups import CallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

LOG_EVERY_S = 5.0
"""A rejection cause is logged when it starts and then at most this often."""
_JOINT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
"""Best effort matches reliable and best-effort publishers alike."""


class RobotIO:
    """
    One robot of the node: its subscriptions, publishers, ``~/ask``, texts and chunk state.

    :param node: the lifecycle node that owns its endpoints.
    :param name: the robot (a ``robots`` entry; '' = the one robot, on the node's topics).
    :param diag: its ``/diagnostics`` figures (the engine's own for the one robot).
    :param notify: wakes the text group (its guard condition), any thread.
    :param input_group: the subscriptions' callback group.
    """

    def __init__(self, node: LifecycleNode, name: str, diag: EngineDiagnostics,
                 notify: Callable[[], None], input_group: CallbackGroup) -> None:
        self.name, self.diag = name, diag
        self._node, self._log, self._input_group = node, node.get_logger(), input_group
        self.texts = TextRequests(self._log, diag, notify, robot=name)
        self.pubs = OutputPublishers(node, robot=name)
        self.text_out = TextOutputs(self.pubs.publish_text, AskAction(
            node, self.texts, ReentrantCallbackGroup(),
            name=robot_topic(ASK_ACTION.name, name)), on_error=self.texts.record_error)
        self.cache: ObservationCache | None = None
        self._subs: list[object] = []
        self._cfg_of: NodeConfig | None = None
        self._output: ChunkOutput | None = None
        self._smoother: ChunkSmoother | None = None
        self._logged: dict[RefusalReason | str, float] = {}
        self._last_issue: RefusalReason | None = None

    def _now_ns(self) -> int:
        return self._node.get_clock().now().nanoseconds

    def topic(self, name: str) -> str:
        """Return this robot's name of the node's endpoint ``name`` (``robot_topic``)."""
        return robot_topic(name, self.name)

    # -- configure / cleanup (engine lock held) --------------------------------------------
    def configure(self, cfg: NodeConfig, engine: Engine) -> None:
        """
        Build its cache, publishers and subscriptions for the node's ``cfg`` and ``engine``.

        :raises ParameterError: joints that cannot carry the action space.
        """
        own = self._own(cfg)
        self._smoother = ChunkSmoother(cfg.chunk_smoothing, cfg.ensemble_decay,
                                       cfg.rtc_max_guidance_weight)
        self.cache = ObservationCache(own.cameras, own.joint_names, own.instruction,
                                      prepare_image=engine.prepare_image)
        self.pubs.create(self._output.publisher_keys)
        self.text_out.frame_id = cfg.frame_id
        self.texts.connect(engine)
        node, group = self._node, self._input_group
        sensor = qos_profile(QosRole.SENSOR_DATA, depth=1)  # the newest image: all it uses
        self._subs = []
        for slot in own.cameras:
            kind = own.transport(slot)
            image_topic = self.topic(camera_endpoint(slot, kind is ImageTransport.COMPRESSED)
                                     .name)
            self._subs.append(node.create_subscription(
                *camera_input(node, image_topic, kind), functools.partial(self._on_image, slot),
                sensor, callback_group=group))
        self._subs += [
            node.create_subscription(JointState, self.topic(JOINT_STATES.name),
                                     self._on_joint_state, _JOINT_QOS, callback_group=group),
            node.create_subscription(String, self.topic(INSTRUCTION.name), self._on_instruction,
                                     qos_profile(QosRole.LATCHED), callback_group=group),
            node.create_subscription(String, self.topic(ASK_TOPIC.name), self._on_ask,
                                     TEXT_QOS, callback_group=group)]

    def release(self) -> None:
        """Destroy its subscriptions and cache; refuse its questions until configured again."""
        for sub in self._subs:
            self._node.destroy_subscription(sub)
        self._subs, self.cache = [], None
        self.texts.connect(None)

    def _own(self, cfg: NodeConfig) -> NodeConfig:
        """Return this robot's config of the node's ``cfg`` (once per change of ``cfg``)."""
        if self._cfg_of is not cfg:
            self._output = ChunkOutput(cfg.robot(self.name))  # action_dt, frame_id, limits
            self._cfg_of = cfg
        return self._output.cfg

    # -- subscriptions: store only, never raise ---------------------------------------------
    def _on_image(self, slot: str, msg: Image | CompressedImage) -> None:
        cache = self.cache
        if cache is not None:
            cache.put_image(slot, msg, self._now_ns())

    def _on_joint_state(self, msg: JointState) -> None:
        cache = self.cache
        if cache is not None:
            cache.put_joint_state(msg, self._now_ns())

    def _on_instruction(self, msg: String) -> None:
        reason = self.set_instruction(msg.data)
        if reason is None:
            self._log.info(f'{self._who}instruction: {msg.data!r}')
            return
        now = time.monotonic()
        if now - self._logged.get('instruction', -1e9) > LOG_EVERY_S:
            self._log.warning(f'{self._who}instruction refused: {reason}; not acting until a '
                              'valid one arrives')
            self._logged['instruction'] = now

    def _on_ask(self, msg: String) -> None:
        self.texts.ask_topic(msg.data, time.monotonic())

    def set_instruction(self, text: str) -> str | None:
        """Replace its prompt (``ObservationCache.set_instruction``); return why refused."""
        cache = self.cache
        return cache.set_instruction(text) if cache is not None else None

    @property
    def _who(self) -> str:
        return f'robot {self.name}: ' if self.name else ''

    # -- the control cycle (control thread, engine lock held) --------------------------------
    def reset(self, engine: Engine) -> None:
        """Start smoothing over (at activation): no previous chunk, no delay sample."""
        self._smoother.reset()
        engine.reset_chunk_history(self.name)

    def prepare(self, engine: Engine, cfg: NodeConfig) -> PreparedObservation | None:
        """
        Return its observation for this cycle, or None (its inputs refused: logged, counted).

        A refusal is logged when its reason starts, then at most every ``LOG_EVERY_S``.
        """
        own = self._own(cfg)
        try:
            prepared = engine.prepare(self.cache.assemble(self._now_ns(),
                                                          own.max_observation_age))
            if self._last_issue is not None:
                self._log.info(f'{self._who}inputs valid again: acting')
                self._last_issue = None
            return prepared
        except ObservationError as exc:  # the node's checks or the engine's: one refusal
            issue, reason = exc.reason, str(exc)
        self.diag.record_rejection(issue, reason)
        now = time.monotonic()
        if issue is not self._last_issue or now - self._logged.get(issue, -1e9) > LOG_EVERY_S:
            self._log.warning(f'{self._who}not acting ({REJECTION_NAMES[issue]}): {reason}')
            self._logged[issue] = now
        self._last_issue = issue
        return None

    def rtc_request(self, cfg: NodeConfig) -> RtcRequest | None:
        """Return its RTC request for this cycle (None: not RTC; ``ChunkSmoother``)."""
        return self._smoother.rtc_request(self._own(cfg).action_dt)

    def delay_steps(self, cfg: NodeConfig) -> int | None:
        """Return its measured inference delay in its action steps (None before a sample)."""
        return self._smoother.delay_steps(self._own(cfg).action_dt)

    def publish(self, chunk: ActionChunk, cfg: NodeConfig) -> bool:
        """
        Smooth ``chunk``, clip it to its limits and publish its messages; return if any went.

        :raises ValueError: a chunk of the wrong shape or with NaN/Inf (the engine failed).
        """
        own = self._own(cfg)
        chunk = self._smoother.before_publish(chunk, self._now_ns(), own.action_dt)
        msgs = self._output.messages(chunk)
        self._report_clips(msgs.clips, own)
        published = [self.pubs.publish_chunk(key, msg) for key, msg in msgs.messages]
        return any(published)

    def _report_clips(self, clips: ClipCount, own: NodeConfig) -> None:
        if not clips.total:
            return
        self.diag.record_clips(clips)
        now = time.monotonic()
        if now - self._logged.get('clips', -1e9) > LOG_EVERY_S:
            names = [own.action_joint_names[d] for d in clips.dims]
            self._log.warning(
                f'{self._who}limits clipped an action chunk: {clips.position} position and '
                f'{clips.velocity} velocity values, joints {names} (logged every '
                f'{LOG_EVERY_S:g} s; counted in /diagnostics)')
            self._logged['clips'] = now


__all__ = ['LOG_EVERY_S', 'RobotIO']
