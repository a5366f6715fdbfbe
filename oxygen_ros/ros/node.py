"""
The ROS 2 lifecycle node ``oxygen`` (``docs/topics.md``): observations in, action chunks out.

One node serves one robot, or several with one engine (``robots``: each robot's topics
under its namespace, its own joints, limits, instruction and rate; ``robot_io``).

Threads (``executor.NodeExecutor``): subscriptions only store the newest message in a robot's
``ObservationCache`` or a question inbox (input group); a timer at ``control_rate_hz`` in its
own MutuallyExclusive group, on a thread of its own (``oxygen_control``), runs the control
cycle (``control_cycle``: a robot at a rate of its own is due every n-th cycle), the only code
touching the engine; finished texts go through a queue to a guard condition in the text group,
which publishes them and ``/diagnostics`` and gives malloc's free pages back after a burst
(``heap``), so none of it delays the action timer. Lifecycle services, parameter changes and
the autostart timer use the default group.

Every ``~/ask`` message gets exactly one ``~/answer`` (``text_requests``); the ``~/ask`` action
(``ask_action``) shares the engine's one waiting queue and its goals always get a result; a
question is queued or refused in its own callback (``Engine.submit_text`` is thread-safe),
never after a control cycle. Texts are also streamed as they decode (``~/<task>/stream``,
``oxygen_ros_interfaces/DecodedText``): the engine detokenizes each cycle's tokens once, the
text group publishes the pieces (``text_stream``). Text messages for a publisher that is not
active (deactivated, or destroyed at cleanup) are held and go out at the next activation
(``output_publishers``): questions still open at cleanup are refused (``no answer: engine
shut down``) and that reply is sent then; at shutdown they are logged only.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable, Sequence, TypeVar

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.engine import Engine, ObservationError
from oxygen_ros.ros.control_cycle import ControlCycle, cycle_deadline
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.endpoints import DIAGNOSTICS, NODE_NAME
from oxygen_ros.ros.executor import call_on, NodeExecutor, spin
from oxygen_ros.ros.heap import HeapTrimmer, POLL_PERIOD_S, release_freed_memory
from oxygen_ros.ros.observation_cache import synthetic_observation
from oxygen_ros.ros.param_handler import ParameterHandler
from oxygen_ros.ros.param_spec import OnChange, ParameterError
from oxygen_ros.ros.robot_io import RobotIO
from oxygen_ros.ros.security import SecuritySettings
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.units import NS_PER_S
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.signals import SignalHandlerOptions

_SUCCESS, _FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
_T = TypeVar('_T')


class OxygenNode(LifecycleNode):
    """
    π0.5 with OxyGen on ROS 2: action chunks on a timer, text from the same KV cache.

    :param security: the DDS security settings the process started with (``main`` reads them
        from the environment and its ROS arguments; default: the environment and
        ``sys.argv``). Configure fails while they would not hold (``SecuritySettings.problem``).
    :param kwargs: passed to ``LifecycleNode`` (``context``, ``parameter_overrides``, ...).
    :raises rclpy.exceptions.InvalidParameterTypeException: a parameter override of the
        wrong type; ``InvalidParameterValueException``: one out of range.
    """

    def __init__(self, *, security: SecuritySettings | None = None, **kwargs: object) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._security = security if security is not None else \
            SecuritySettings.from_environment(sys.argv, os.environ)
        self._params = ParameterHandler(self, {
            OnChange.FRAME_ID: self._apply_frame_id,
            OnChange.CONTROL_RATE: self._apply_control_rate,
            OnChange.DIAGNOSTICS_PERIOD: self._apply_diagnostics_period,
            OnChange.INSTRUCTION: self._apply_instruction,
            OnChange.WAITING_BOUND: self._apply_waiting_bound})
        self.finished = threading.Event()
        """Set once the node reached the finalized state (main exits then)."""
        self.control_group = MutuallyExclusiveCallbackGroup()
        """The control timer's group: ``main`` pins it to a thread (``executor.NodeExecutor``),
        where configure builds the engine too (``executor.call_on``)."""
        self._text_group = MutuallyExclusiveCallbackGroup()
        self._input_group = ReentrantCallbackGroup()
        self._engine_lock = threading.Lock()
        self._engine: Engine | None = None
        self._cycle: ControlCycle | None = None
        self._failed = False
        self._timer = None
        preset = self.get_parameter('preset').value
        self._diag = EngineDiagnostics(preset)
        names = [n for n in self.get_parameter('robots').value if n] or ['']
        self._robots = [RobotIO(self, name, EngineDiagnostics(preset, robot=name) if name
                                else self._diag, self._notify_texts, self._input_group)
                        for name in names]
        """The robots, in ``robots`` order (``robot_io``)."""
        for diag in self._diagnostics:
            diag.security = self._security.describe()
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS.name, 10)
        self._diag_timer = self.create_timer(self.get_parameter('diagnostics_period').value,
                                             self._publish_diagnostics, self._text_group)
        self._text_gc = self.create_guard_condition(self._publish_texts, self._text_group)
        self._heap = HeapTrimmer()
        self._heap_timer = self.create_timer(POLL_PERIOD_S, self._poll_heap, self._text_group)
        self._autostart = None
        if self.get_parameter('autostart').value:
            self._autostart = self.create_timer(0.0, self._on_autostart)

    # -- lifecycle -------------------------------------------------------------------------
    def _on_autostart(self) -> None:
        self.destroy_timer(self._autostart)
        if self.trigger_configure() is _SUCCESS:
            self.trigger_activate()

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Read parameters, build the engine (weights, tokenizer, norm stats, KV pool), warm it up.

        Then create the lifecycle publishers and the subscriptions.

        :returns: SUCCESS → inactive. FAILURE → unconfigured, nothing kept: DDS security
            asked for but not holding (``security.SecuritySettings.problem``), a bad parameter,
            a missing or bad checkpoint / tokenizer / norm stats, or a warm-up error (logged
            with the reason; ``/diagnostics`` ERROR). An escaped exception would be ERROR →
            ``on_error`` → unconfigured.
        """
        security = self._security.problem()
        if security is not None:
            return self._configure_failed(f'DDS security: {security}')
        self.get_logger().info(self._security.start_line(self.context.get_domain_id()))
        try:
            engine_cfg, cfg = self._params.configs()
        except ParameterError as exc:
            return self._configure_failed(f'bad parameter: {exc}')
        for diag in self._diagnostics:
            diag.reset(cfg.preset, engine_cfg.checkpoint is None, cfg.action_space.value,
                       cfg.chunk_smoothing.value + engine_cfg.rtc_note())
        t0 = time.monotonic()
        try:
            if cfg.torch_threads:
                import torch  # loaded by the engine anyway
                torch.set_num_threads(cfg.torch_threads)
            engine = call_on(self.executor, self.control_group,
                             lambda: Engine(engine_cfg, robots=cfg.robot_names))
            call_on(self.executor, self.control_group, lambda: engine.warmup(
                synthetic_observation(engine.model_cfg, engine.robot, cfg.instruction)))
        except ObservationError as exc:     # only its prompt (the instruction) can be refused
            return self._configure_failed(f'bad parameter: instruction: {exc}')
        except Exception as exc:  # noqa: B902 (any build error must fail configure, logged)
            self.get_logger().error(traceback.format_exc())
            return self._configure_failed(f'cannot build the {cfg.preset} engine: '
                                          f'{type(exc).__name__}: {exc}')
        weights = engine_cfg.checkpoint or 'RANDOM weights'
        self.get_logger().info(
            f'engine {cfg.preset} ready in {time.monotonic() - t0:.1f} s ({weights}); '
            f'cameras {list(cfg.cameras)}, joints {list(cfg.joint_names)}; '
            f'{cfg.action_space.value} actions for {list(cfg.action_joint_names)}; '
            f'{engine.describe_text()}')
        if cfg.robot_settings:
            self.get_logger().info(
                f'robots {list(cfg.robot_names)} (max_robots '
                f'{engine_cfg.scheduler.max_robots}): ' + '; '.join(
                    f'/{n}: joints {list(cfg.robot(n).joint_names)}, '
                    f'{cfg.robot(n).control_rate_hz:g} Hz' for n in cfg.robot_names))
        for diag in self._diagnostics:
            diag.set_fallbacks(engine.fallbacks, engine.dropped_features)
            diag.quantization = engine.describe_quantization()
            diag.set_text_setup(engine.describe_contexts(), engine.describe_adapter())
        self._engine, self._failed = engine, False
        self._cycle = ControlCycle(self._robots, self._diag)
        self._params.config = cfg
        for io in self._robots:
            io.configure(cfg, engine)
        self._set_state('inactive')
        return super().on_configure(state)

    def _configure_failed(self, reason: str) -> TransitionCallbackReturn:
        self.get_logger().error(f'configure failed: {reason}')
        self._diag.record_failure(f'configure failed: {reason}')
        return _FAILURE

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Start the control timer; lifecycle publishers go live.

        :returns: SUCCESS → active. FAILURE → inactive: the engine failed in an earlier
            cycle (cleanup and configure again).
        """
        if self._failed:
            self.get_logger().error('not activating: the engine failed; cleanup and configure')
            return _FAILURE
        now, cfg = self._now_s(), self._params.config
        for io in self._robots:
            io.texts.start(now)
        self._cycle.reset(self._engine)
        self._timer = self.create_timer(cfg.control_period_s, self._control_tick,
                                        self.control_group)
        self._set_state('active')
        self.get_logger().info(f'active: {cfg.describe_rates()}')
        result = self._each_robot('activate', lambda: super(OxygenNode, self).on_activate(state))
        self._text_gc.trigger()
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Stop the control timer (after a running cycle); publishers go silent.

        :returns: SUCCESS → inactive (running texts pause, questions wait in the engine's
            queue, finished texts wait until the next activation).
        """
        self._stop_timer()
        self._set_state('inactive')
        return self._each_robot('deactivate',
                                lambda: super(OxygenNode, self).on_deactivate(state))

    def _each_robot(self, transition: str, node_transition: Callable[[], _T]) -> _T:
        """Run ``node_transition`` within every robot's publishers' ``transition``."""
        for io in reversed(self._robots):
            node_transition = functools.partial(getattr(io.pubs, transition), node_transition)
        return node_transition()

    @property
    def _diagnostics(self) -> list[EngineDiagnostics]:
        """Return the engine's figures, then each named robot's."""
        return [self._diag] + [io.diag for io in self._robots if io.name]

    def _set_state(self, label: str) -> None:
        for diag in self._diagnostics:
            diag.set_state(label, self._now_s())

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Shut the engine down, destroy publishers, subscriptions, and free the model.

        :returns: SUCCESS → unconfigured.
        """
        self._release()
        self._set_state('unconfigured')
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Release everything from any state; ``main`` then exits with status 0.

        :returns: SUCCESS → finalized.
        """
        self._stop_timer()
        self._release()
        self._set_state('finalized')
        self.finished.set()
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """
        Release everything after a transition raised.

        :returns: SUCCESS → unconfigured.
        """
        self.get_logger().error(f'error processing from {state.label}; releasing the engine')
        self._stop_timer()
        self._release()
        return super().on_error(state)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with self._engine_lock:  # let a running cycle finish
                self.destroy_timer(self._timer)
                self._timer = None

    def _release(self) -> None:
        with self._engine_lock:
            engine, self._engine, self._cycle = self._engine, None, None
            for io in self._robots:
                io.release()  # refuse questions until configured again
            if engine is not None:
                last = engine.shutdown()
                for io in self._robots:
                    io.texts.drop_all(last, 'engine shut down (node cleanup)')
                device = engine.config.backend.device
                del engine
                release_freed_memory(device)  # the engine's memory back to the OS
        for io in self._robots:
            io.pubs.destroy()

    def _now_ns(self) -> int:
        """Return the node clock (ROS time: ``/clock`` under ``use_sim_time``) in ns."""
        return self.get_clock().now().nanoseconds

    def _now_s(self) -> float:
        """Return the node clock in seconds (rates, periods and diagnostics windows)."""
        return self._now_ns() / NS_PER_S

    # -- parameters: what a change does (``param_handler``; the config is updated before) ---
    def _apply_frame_id(self, frame_id: str) -> None:
        for io in self._robots:
            io.text_out.frame_id = frame_id  # chunks: from the next cycle's ChunkOutput

    def _apply_control_rate(self, _rate_hz: float) -> None:
        timer, cfg = self._timer, self._params.config
        if timer is not None:
            timer.timer_period_ns = round(cfg.control_period_s * NS_PER_S)
            self.get_logger().info(f'control rate {cfg.describe_rates()}')

    def _apply_diagnostics_period(self, period_s: float) -> None:
        self._diag_timer.timer_period_ns = round(period_s * NS_PER_S)

    def _apply_instruction(self, instruction: str, robot: str = '') -> None:
        for io in self._robots:  # instruction: the one robot's; r1.instruction: robot r1's
            if io.name == robot:
                io.set_instruction(instruction)

    def _apply_waiting_bound(self, max_waiting_requests: int) -> None:
        engine = self._engine
        if engine is not None:
            engine.set_max_waiting_requests(max_waiting_requests)

    # -- the control cycle (``control_cycle``) ---------------------------------------------
    def _control_tick(self) -> None:
        cfg, now, timer = self._params.config, self._now_s(), self._timer
        deadline = cycle_deadline(timer, cfg.control_period_s) if cfg is not None else None
        with self._engine_lock:
            engine, cycle = self._engine, self._cycle
            if engine is None or cycle is None or cfg is None:
                return
            try:
                cycle.run(engine, cfg, now, deadline)
            except Exception:  # noqa: B902 (reported, then the node stops acting)
                failure = traceback.format_exc()
            else:
                failure = None
        if failure is not None:
            self._engine_failed(failure)

    def _engine_failed(self, failure: str) -> None:
        self.get_logger().error(f'engine failed in a control cycle; deactivating:\n{failure}')
        self._failed = True
        self._diag.record_failure(failure.strip().splitlines()[-1])
        self.trigger_deactivate()

    # -- text group ----------------------------------------------------------------------------
    def _notify_texts(self) -> None:
        self._text_gc.trigger()

    def _publish_texts(self) -> None:
        for io in self._robots:
            io.text_out.handle(io.texts.take())

    def _poll_heap(self) -> None:
        cfg = self._params.config
        mib = cfg.malloc_trim_mb if cfg else self.get_parameter('malloc_trim_mb').value
        heap = self._heap
        self._diag.record_heap(heap.poll(mib), heap.trims, heap.released, heap.last_trim_s)

    def _publish_diagnostics(self) -> None:
        cfg = self._params.config
        rate = cfg.control_rate_hz if cfg else self.get_parameter('control_rate_hz').value
        age = cfg.max_observation_age if cfg else \
            self.get_parameter('max_observation_age').value
        every = {io.name: cfg.due_every(io.name) if cfg else 1 for io in self._robots}
        robots = [(io.diag, rate / every[io.name], (every[io.name] - 1) / rate)
                  for io in self._robots if io.name]  # each its own rate (every n-th cycle)
        self._diag_pub.publish(self._diag.array(
            self.get_clock().now().to_msg(), self._now_s(), rate, age, robots,
            slack_s=(min(every.values()) - 1) / rate))


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run ``oxygen_node``; return 0 after SIGINT, SIGTERM or the shutdown transition.

    :returns: 1 if the node cannot start (one FATAL line says why and how to fix it): DDS
        security asked for and not holding (``security``), or a bad parameter override.
    """
    args = [NODE_NAME, *(sys.argv[1:] if argv is None else argv)]
    logging.basicConfig(level=logging.INFO, format='[%(levelname)s] [%(name)s]: %(message)s')
    log = rclpy.logging.get_logger(NODE_NAME)
    security = SecuritySettings.from_environment(args, os.environ)
    problem = security.problem()
    if problem is not None:  # before rclpy.init: no participant joins the domain
        log.fatal(f'not starting: {problem}')
        return 1
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        stop = stop_event_on_signals()
        node = OxygenNode(security=security)
    except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
        log.fatal(f'bad parameter: {exc}')
        rclpy.try_shutdown()
        return 1
    except _rclpy.RCLError as exc:
        if not security.enabled:
            raise
        log.fatal(f'not starting: {security.middleware_failure(exc)}')
        rclpy.try_shutdown()
        return 1
    executor = NodeExecutor(num_threads=4, pinned={'oxygen_control': node.control_group})
    executor.add_node(node)
    spinner = threading.Thread(target=spin, args=(executor,), name='executor')
    spinner.start()
    while not stop.wait(0.1) and not node.finished.is_set():
        pass
    if node.finished.is_set():
        time.sleep(0.3)  # let the change_state response leave before the context goes
    else:
        try:
            node.trigger_shutdown()
        except Exception as exc:  # noqa: B902 (e.g. mid-transition: release directly)
            node.get_logger().warning(f'shutdown transition failed ({exc}); releasing')
            node.on_shutdown(LifecycleState('active', 0))
    rclpy.try_shutdown()
    executor.shutdown(timeout_sec=5.0)
    spinner.join(timeout=5.0)
    node.destroy_node()
    return 0


if __name__ == '__main__':
    sys.exit(main())
