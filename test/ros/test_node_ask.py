"""
The ``~/ask`` action, the streamed texts and the question queue, over real DDS.

The node runs in a subprocess (tiny preset, config/test.yaml); the test process feeds it one
fixed image per camera (so one question gets one answer, whichever frame it reads) and talks to
it with an independent ``rclpy.action.ActionClient``, String publishers and subscriptions.
Every wait is on a condition, never a blind sleep.
"""

import re
import signal
import time

from action_msgs.msg import GoalStatus
from action_msgs.srv import CancelGoal
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros.tools.bag.topics import (
    CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, qos_profile, QosRole, typestore)
from oxygen_ros.units import NS_PER_S
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
import pytest
from rclpy.action import ActionClient
from rclpy.qos import QoSProfile
from ros_inputs import image, joint_state
from rosbags.rosbag2 import Reader
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

NODE = 'oxygen_ros.ros.node'
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')  # config/test.yaml (tiny preset)
TASKS = ('answer', 'subtask', 'memory')
QUESTIONS = ('what is on the table?', 'which cup is closer?')
START_TIMEOUT_S = 60.0
DEEP = QoSProfile(depth=1000)  # reliable, keep last 1000: a burst loses nothing


def start_node(ros_processes, *params):
    args = ['--ros-args', '--params-file', str(config_file('test'))]
    for p in params:
        args += ['-p', p]
    return ros_processes.start(NODE, *args)


class Inputs:
    """Publishes the node's inputs at 20 Hz: one fixed image per camera, joint states."""

    def __init__(self, ros_node):
        self.ros_node, node = ros_node, ros_node.node
        self.images = {slot: node.create_publisher(Image, CAMERA_TOPICS[slot],
                                                   qos_profile(QosRole.SENSOR_DATA))
                       for slot in CAMERAS}
        self.joints = node.create_publisher(JointState, JOINT_STATES_TOPIC, 10)
        self.instruction = node.create_publisher(String, INSTRUCTION_TOPIC,
                                                 qos_profile(QosRole.LATCHED))
        self.instruction.publish(String(data='pick up the cup'))
        self.stamps = set()

    def publish(self):
        now = self.ros_node.node.get_clock().now().nanoseconds
        for i, slot in enumerate(CAMERAS):
            self.images[slot].publish(image(now, h=48, w=64, seed=i)[1])
        self.joints.publish(joint_state(now))
        self.stamps.add(now)

    def run_until(self, predicate, timeout_s=30.0):
        """Publish and spin until ``predicate()``; False on timeout."""
        return self.ros_node.publish_until(self.publish, predicate, timeout_s)


def wait_done(inputs, future, what, proc, timeout_s=30.0):
    assert inputs.run_until(future.done, timeout_s), f'{what}:\n{proc.output()[-3000:]}'
    return future.result()


class Goal:
    """One goal sent by the ActionClient, with its feedback and result arrival times."""

    def __init__(self, client, question, max_tokens=0):
        self.question, self.feedback, self.result_s = question, [], None
        self.sent = client.send_goal_async(Ask.Goal(question=question, max_tokens=max_tokens),
                                           feedback_callback=self._on_feedback)
        self.handle = self.result = None

    def _on_feedback(self, msg):
        self.feedback.append((time.monotonic(), msg.feedback))

    def accepted(self, inputs, proc):
        self.handle = wait_done(inputs, self.sent, f'goal {self.question!r} answered', proc)
        return self.handle.accepted

    def wait_result(self, inputs, proc, timeout_s=30.0):
        future = self.handle.get_result_async()
        self.result = wait_done(inputs, future, f'result of {self.question!r}', proc, timeout_s)
        self.result_s = time.monotonic()
        return self.result


def streams_by_request(collector):
    out = {}
    for msg in collector.msgs:
        out.setdefault(msg.request_id, []).append(msg)
    return out


def check_stream(pieces, stamps):
    """One request's pieces: one final one, at the end; growing token counts; real stamps."""
    assert [p.is_final for p in pieces] == [False] * (len(pieces) - 1) + [True]
    counts = [p.num_tokens for p in pieces]
    assert counts == sorted(counts) and counts[0] >= 1
    assert len({stamp_to_ns(p.header.stamp) for p in pieces}) == 1
    assert stamp_to_ns(pieces[0].header.stamp) in stamps
    assert all(p.header.frame_id == 'base_link' for p in pieces)
    return ''.join(p.text for p in pieces)


def test_ask_action_streams_and_equals_the_string_answer(ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, 'subtask_period:=1.0')
    streams = {t: ros_node.collect(f'/oxygen/{t}/stream', DecodedText, TEXT_QOS) for t in TASKS}
    strings = {t: ros_node.collect(f'/oxygen/{t}', String, DEEP) for t in TASKS}
    client = ActionClient(ros_node.node, Ask, '/oxygen/ask')
    inputs = Inputs(ros_node)
    ask = ros_node.node.create_publisher(String, '/oxygen/ask', DEEP)
    bag = tmp_path / 'texts'
    record = ros_processes.start('oxygen_ros.tools.bag.record', str(bag), '/oxygen/answer/stream',
                                 '/oxygen/memory/stream')
    # acting: subtask and memory notes stream (their periods are 1 s)
    assert inputs.run_until(lambda: all(any(m.is_final for m in streams[t].msgs)
                                        for t in ('subtask', 'memory')), START_TIMEOUT_S), \
        proc.output()
    assert ros_node.spin_until(lambda: ros_node.node.count_subscribers(
        '/oxygen/answer/stream') >= 2 and client.server_is_ready() and
        ask.get_subscription_count() >= 1), record.output()

    # two goals at once, and the first question again on the String topic
    goals = [Goal(client, q) for q in QUESTIONS]
    ask.publish(String(data=QUESTIONS[0]))
    assert all(g.accepted(inputs, proc) for g in goals)
    results = [g.wait_result(inputs, proc) for g in goals]
    assert inputs.run_until(lambda: len(strings['answer']) >= 1, 10.0)
    for goal, res in zip(goals, results):
        assert res.status == GoalStatus.STATUS_SUCCEEDED
        answer = res.result.answer
        assert res.result.status in (Ask.Result.STATUS_EOS, Ask.Result.STATUS_LENGTH)
        assert res.result.reason == '' and answer.is_final and answer.num_tokens >= 1
        assert answer.task == DecodedText.TASK_ANSWER
        assert stamp_to_ns(answer.header.stamp) in inputs.stamps
        assert 0 < answer.time_from_request.sec * NS_PER_S + answer.time_from_request.nanosec
        # feedback before the result; the pieces make the answer
        assert goal.feedback and all(t < goal.result_s for t, _ in goal.feedback)
        pieces = [f.piece for _, f in goal.feedback]
        assert {p.request_id for p in pieces} == {answer.request_id}
        assert ''.join(p.text for p in pieces) == answer.text == goal.feedback[-1][1].text_so_far
    assert results[0].result.answer.request_id != results[1].result.answer.request_id
    assert strings['answer'].msgs[0].data == results[0].result.answer.text

    # oxygen_ask prints the same answer as it streams, then a summary line
    asker = ros_processes.start('oxygen_ros.tools.ask', QUESTIONS[0])
    assert inputs.run_until(lambda: asker.popen.poll() is not None, 30.0), asker.output()
    assert asker.popen.returncode == 0, asker.output()
    printed = asker.output()
    assert printed.startswith(results[0].result.answer.text + '\n'), printed
    summary = re.search(r'^\[(answer-\d+): \d+ tokens, (EOS|token budget); first piece after '
                        r'\d+\.\d\d s, [1-9]\d* pieces, \d+\.\d\d s\]$', printed, re.M)
    assert summary, printed

    # every task: the streamed pieces of each finished text concatenate to that text
    inputs.run_until(lambda: False, 1.5)  # texts finishing now come in
    answers = streams_by_request(streams['answer'])
    goal_ids = {r.result.answer.request_id: r.result.answer.text for r in results}
    goal_ids[summary.group(1)] = results[0].result.answer.text  # oxygen_ask's goal
    string_asked = [texts for rid, texts in answers.items() if rid not in goal_ids]
    assert len(string_asked) == 1 and len(strings['answer']) == 1  # exactly one reply
    assert check_stream(string_asked[0], inputs.stamps) == strings['answer'].msgs[0].data
    for rid, text in goal_ids.items():
        assert check_stream(answers[rid], inputs.stamps) == text
    for task in ('subtask', 'memory'):
        finished = [p for p in streams_by_request(streams[task]).values() if p[-1].is_final]
        texts = {m.data for m in strings[task].msgs}
        assert finished and texts
        for pieces in finished:  # (String messages carry no request id to pair them by)
            assert check_stream(pieces, inputs.stamps) in texts
            assert pieces[0].task == getattr(DecodedText, f'TASK_{task.upper()}')

    # the recorded bag reads back with the project's types registered
    assert record.stop(signal.SIGINT) == 0, record.output()
    with Reader(bag) as reader:
        conns = {c.topic: c for c in reader.connections}
        assert conns['/oxygen/answer/stream'].msgtype == 'oxygen_ros_interfaces/msg/DecodedText'
        assert conns['/oxygen/answer/stream'].digest == typestore().hash_rihs01(
            'oxygen_ros_interfaces/msg/DecodedText')
        recorded = [typestore().deserialize_cdr(bytes(raw), conn.msgtype)
                    for conn, _, raw in reader.messages()]
    assert conns['/oxygen/memory/stream'].msgcount >= 1

    def fields(msgs, rid):
        return [(m.text, m.is_final, m.num_tokens, stamp_to_ns(m.header.stamp)) for m in msgs
                if m.request_id == rid]
    for rid in goal_ids:  # asked after the recorder subscribed: every piece, in order
        assert fields(recorded, rid) == fields(streams['answer'].msgs, rid) != []


def change_state(ros_node, transition_id):
    client = ros_node.node.create_client(ChangeState, '/oxygen/change_state')
    assert client.wait_for_service(timeout_sec=20.0)
    future = client.call_async(ChangeState.Request(transition=Transition(id=transition_id)))
    assert ros_node.spin_until(future.done, 20.0) and future.result().success


def test_cancel_frees_kv_and_goals_beyond_capacity_are_rejected(ros_node, ros_processes):
    proc = start_node(ros_processes, 'memory_period:=0.0', 'decode_budget:=400',
                      'stop_on_eos:=false', 'max_waiting_requests:=1')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    client = ActionClient(ros_node.node, Ask, '/oxygen/ask')
    inputs = Inputs(ros_node)
    assert inputs.run_until(lambda: len(chunks) >= 3 and client.server_is_ready(),
                            START_TIMEOUT_S), proc.output()

    def status_after(t_s):
        return [(r.received_ns, status_values(r.msg.status[0])) for r in diagnostics.messages
                if r.received_ns > t_s]

    # cancel: 400 tokens at <= 4 per cycle would hold their KV blocks for >= 10 s
    goal = Goal(client, QUESTIONS[0])
    assert goal.accepted(inputs, proc)
    assert inputs.run_until(lambda: len(goal.feedback) >= 2, 20.0), proc.output()
    t_fb = time.time_ns()
    assert inputs.run_until(lambda: any(int(v['KV blocks used']) > 0
                                        for _, v in status_after(t_fb)), 5.0)
    cancel = wait_done(inputs, goal.handle.cancel_goal_async(), 'cancel', proc)
    assert cancel.return_code == CancelGoal.Response.ERROR_NONE
    assert len(cancel.goals_canceling) == 1
    res = goal.wait_result(inputs, proc, 10.0)
    t_result = time.time_ns()
    assert res.status == GoalStatus.STATUS_CANCELED
    assert res.result.status == Ask.Result.STATUS_CANCELED and res.result.reason == 'cancelled'
    answer = res.result.answer
    assert answer.is_final and 0 < answer.num_tokens < 400
    assert answer.text.startswith(goal.feedback[-1][1].text_so_far)
    freed = inputs.run_until(lambda: any(v['KV blocks used'] == '0' and
                                         v['text requests running'] == '0'
                                         for _, v in status_after(t_result)), 2.0)
    assert freed, [v['KV blocks used'] for _, v in status_after(t_fb)]

    # capacity: an inactive node drains no queue; one slot (max_waiting_requests 1)
    change_state(ros_node, Transition.TRANSITION_DEACTIVATE)
    first = Goal(client, QUESTIONS[1], max_tokens=8)
    assert first.accepted(inputs, proc)
    t_full = time.time_ns()
    assert not Goal(client, 'one too many?').accepted(inputs, proc)
    assert inputs.run_until(lambda: any(
        v['last text rejection'] == 'question refused: queue full (1 requests waiting, '
                                    'max_waiting_requests 1)'
        for _, v in status_after(t_full)), 5.0)
    asker = ros_processes.start('oxygen_ros.tools.ask', 'still full?')
    assert inputs.run_until(lambda: asker.popen.poll() is not None, 30.0), asker.output()
    assert asker.popen.returncode == 1
    assert 'oxygen_ask: rejected: question refused: queue full (1 requests waiting' in \
        asker.output()
    t_budget = time.time_ns()
    assert not Goal(client, 'long?', max_tokens=401).accepted(inputs, proc)
    assert inputs.run_until(lambda: any(
        v['last text rejection'] == 'question refused: max_tokens 401 outside [1, 400] '
                                    '(decode_budget)' for _, v in status_after(t_budget)), 5.0)
    change_state(ros_node, Transition.TRANSITION_ACTIVATE)
    res = first.wait_result(inputs, proc)
    assert res.status == GoalStatus.STATUS_SUCCEEDED
    assert (res.result.status, res.result.answer.num_tokens) == (Ask.Result.STATUS_LENGTH, 8)


def test_a_burst_of_questions_gets_exactly_one_reply_each(ros_node, ros_processes):
    proc = start_node(ros_processes, 'memory_period:=0.0', 'max_waiting_requests:=16')
    answers = ros_node.collect('/oxygen/answer', String, DEEP)
    chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    ask = ros_node.node.create_publisher(String, '/oxygen/ask', DEEP)
    inputs = Inputs(ros_node)
    assert inputs.run_until(lambda: len(chunks) >= 3 and ask.get_subscription_count() >= 1,
                            START_TIMEOUT_S), proc.output()
    n = 120
    for i in range(n):
        ask.publish(String(data=f'question {i}?' if i % 10 else ' '))
    assert inputs.run_until(lambda: len(answers) >= n, 40.0), (len(answers), proc.output())
    inputs.run_until(lambda: False, 1.0)  # a second reply would have come by now
    replies = [m.data for m in answers.msgs]
    assert len(replies) == n
    refused = [r for r in replies if r.startswith('no answer: ')]
    assert replies.count('no answer: empty question') == n // 10
    assert any(r.startswith('no answer: queue full (16 requests waiting') for r in refused)
    assert len(replies) - len(refused) >= 16  # the queue's worth at least was answered
