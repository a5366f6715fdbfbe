"""
Exceptions in the ``~/ask`` action's callbacks, the node's executor, goal retention: real DDS.

rclpy keeps a callback's exception in its task; the node's executor used to raise it in a pool
worker whose future nobody read: the exception vanished and the goal got no response or no
result. Here the action server (``AskAction`` with the node's ``TextRequests``) runs in a node
of this process spun by ``NodeExecutor`` in a thread; an independent ``ActionClient`` (another
context) sends goals while a callback is made to fail. Finished goals are kept
``result_timeout_s`` (30 s in the node, not rclpy's 900 s: every status message lists them).
"""

import threading
import time

from action_msgs.msg import GoalStatus, GoalStatusArray
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.ros.ask_action import AskAction
from oxygen_ros.ros.diagnostics import EngineDiagnostics, status_values
from oxygen_ros.ros.executor import NodeExecutor, spin
from oxygen_ros.ros.text_requests import TextRequests
from oxygen_ros_interfaces.action import Ask
import pytest
import rclpy
from rclpy.action import ActionClient
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.context import Context

pytestmark = pytest.mark.ros


class Server:
    """An ``~/ask`` action server in node ``/oxygen`` of this process (its own context)."""

    def __init__(self, domain_id, engine, **action_kwargs):
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node('oxygen', context=self.context)
        self.diag = EngineDiagnostics('tiny')
        self.texts = TextRequests(self.node.get_logger(), self.diag, lambda: None)
        self.texts.connect(engine)  # configured (no control cycle runs: questions wait)
        self.ask = AskAction(self.node, self.texts, ReentrantCallbackGroup(), **action_kwargs)
        self.executor = NodeExecutor(num_threads=2, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=spin, args=(self.executor,), daemon=True)
        self.thread.start()

    def close(self):
        self.context.try_shutdown()
        self.executor.shutdown(timeout_sec=5.0)
        self.thread.join(timeout=5.0)
        self.node.destroy_node()


@pytest.fixture
def engine(tiny_models, tokenizer):
    cfg = EngineConfig(preset='tiny')
    return Engine(cfg, model=tiny_models(cfg.model_config().prefix_attention,
                                         cfg.robot().cameras), tokenizer=tokenizer)


@pytest.fixture
def server(ros_domain_id, engine):
    srv = Server(ros_domain_id, engine)
    yield srv
    srv.close()


def send(ros_node, client, question):
    sent = client.send_goal_async(Ask.Goal(question=question))
    assert ros_node.spin_until(sent.done, 20.0), 'no goal response'
    return sent.result()


def boom(*args, **kwargs):
    raise RuntimeError('boom')


def test_a_failing_callback_still_answers_the_goal_and_is_logged(ros_node, server, capfd):
    client = ActionClient(ros_node.node, Ask, '/oxygen/ask')
    assert ros_node.spin_until(client.server_is_ready)

    # the accepted callback fails: the goal ends DROPPED with the reason (it used to hang)
    server.texts.goal_accepted = boom
    handle = send(ros_node, client, 'what is on the table?')
    assert handle.accepted
    result = handle.get_result_async()
    assert ros_node.spin_until(result.done, 20.0), 'no result'
    res = result.result()
    assert res.status == GoalStatus.STATUS_ABORTED
    assert res.result.status == Ask.Result.STATUS_DROPPED
    assert res.result.reason == ('internal error in the ~/ask accepted callback: '
                                 'RuntimeError: boom')
    assert res.result.answer.is_final
    assert status_values(server.diag.status(0.0, 10.0, 0.5))['last text rejection'] == \
        'internal error in the ~/ask accepted callback: RuntimeError: boom'

    # the goal callback fails: the goal is rejected (no response at all before)
    server.texts.ask_goal = boom
    assert not send(ros_node, client, 'and now?').accepted
    logged = capfd.readouterr()
    assert 'internal error in the ~/ask goal callback (the request still gets its reply)' in \
        logged.err
    assert 'RuntimeError: boom' in logged.err and 'Traceback' in logged.err


def test_the_node_executor_logs_a_callback_exception_and_goes_on(ros_domain_id, capfd):
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    node = rclpy.create_node('executor_test', context=context)
    ticks = []
    node.create_timer(0.05, lambda: boom())
    node.create_timer(0.05, lambda: ticks.append(1))
    executor = NodeExecutor(num_threads=2, context=context)
    executor.add_node(node)
    thread = threading.Thread(target=spin, args=(executor,), daemon=True)
    thread.start()
    try:
        deadline = threading.Event()
        deadline.wait(1.0)
        assert len(ticks) >= 5 and thread.is_alive()  # the failing timer stops nothing
    finally:
        context.try_shutdown()
        executor.shutdown(timeout_sec=5.0)
        thread.join(timeout=5.0)
        node.destroy_node()
    err = capfd.readouterr().err
    assert 'a callback raised RuntimeError: boom; the node goes on' in err
    assert 'Traceback' in err and 'in boom' in err


def test_a_pinned_group_runs_on_its_own_thread_and_the_others_on_the_pool(ros_domain_id):
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    node = rclpy.create_node('executor_pin_test', context=context)
    pinned, other = MutuallyExclusiveCallbackGroup(), ReentrantCallbackGroup()
    ran = {'pinned': [], 'other': []}
    for name, group in (('pinned', pinned), ('other', other)):
        for _ in range(3):  # several timers at once: the pool's workers take turns
            node.create_timer(0.02, lambda n=name: ran[n].append(
                threading.current_thread().name), group)
    executor = NodeExecutor(num_threads=3, context=context, pinned={'control': pinned})
    executor.add_node(node)
    thread = threading.Thread(target=spin, args=(executor,), daemon=True)
    thread.start()
    try:
        threading.Event().wait(1.0)
    finally:
        context.try_shutdown()
        executor.shutdown(timeout_sec=5.0)
        thread.join(timeout=5.0)
        node.destroy_node()
    assert len(ran['pinned']) >= 30 and len(ran['other']) >= 30
    assert set(ran['pinned']) == {'control_0'}
    assert 'control_0' not in ran['other'] and len(set(ran['other'])) >= 2


def test_finished_goals_leave_the_status_after_the_result_timeout(
        ros_node, ros_domain_id, engine):
    server = Server(ros_domain_id, engine, result_timeout_s=1.0)
    try:
        statuses = ros_node.collect('/oxygen/ask/_action/status', GoalStatusArray, 10)
        client = ActionClient(ros_node.node, Ask, '/oxygen/ask')
        assert ros_node.spin_until(client.server_is_ready)
        server.texts.goal_accepted = boom  # every accepted goal ends at once (DROPPED)

        def finish_goal(question):
            handle = send(ros_node, client, question)
            result = handle.get_result_async()
            assert handle.accepted and ros_node.spin_until(result.done, 20.0)
            return bytes(handle.goal_id.uuid)

        first = [finish_goal(f'q{i}?') for i in range(3)]
        assert ros_node.spin_until(lambda: statuses.msgs and {
            bytes(s.goal_info.goal_id.uuid) for s in statuses.msgs[-1].status_list} >= set(
            first), 10.0)
        time.sleep(2.0)  # past the 1 s result timeout
        last = finish_goal('later?')
        assert ros_node.spin_until(lambda: any(
            [bytes(s.goal_info.goal_id.uuid) for s in m.status_list] == [last]
            for m in statuses.msgs), 10.0), [len(m.status_list) for m in statuses.msgs]
    finally:
        server.close()
