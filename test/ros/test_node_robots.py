"""
Robots on one node and one engine, over real DDS: their own topics, joints, questions, rates.

The node runs in a subprocess (tiny preset, config/test.yaml: 10 Hz) with
``robots: [left, right]``; ``right`` has joint names of its own. The test process feeds each
robot's cameras and joint states on its namespace (``/left/camera/...``,
``/right/joint_states``) and talks to each robot's ``~/ask`` topic and action
(``/left/oxygen/ask``) and to the node's parameter services. Every wait is on a condition,
never a blind sleep; rates are checked by counting chunks, not by timing them.
"""

import time

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import Level, status_values
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, qos_profile, QosRole
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
import pytest
from rclpy.action import ActionClient
from rclpy.duration import Duration
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import QoSProfile
from ros_inputs import image, joint_state, JOINTS
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

NODE = 'oxygen_ros.ros.node'
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')  # config/test.yaml (tiny preset)
RIGHT_JOINTS = [f'right_joint_{i}' for i in range(1, 8)] + ['right_gripper']
JOINT_NAMES = {'left': JOINTS, 'right': RIGHT_JOINTS}
"""Each robot's joints: left has the node's (config/test.yaml), right its own."""
ROBOTS_YAML = """\
/**:
  ros__parameters:
    robots: [left, right]
    left:
      instruction: pick up the cup
    right:
      joint_names: [{joints}]
      instruction: stack the blocks
"""
START_TIMEOUT_S = 60.0
DEEP = QoSProfile(depth=1000)


class RobotInputs:
    """Publishes one robot's inputs on its namespace: a fixed image per camera, joint states."""

    def __init__(self, node, robot, seed):
        self.robot, self.seed, self.cameras_on = robot, seed, True
        self.images = {slot: node.create_publisher(Image, f'/{robot}{CAMERA_TOPICS[slot]}',
                                                   qos_profile(QosRole.SENSOR_DATA))
                       for slot in CAMERAS}
        self.joints = node.create_publisher(JointState, f'/{robot}/joint_states', 10)

    def publish(self, now_ns):
        if self.cameras_on:
            for i, slot in enumerate(CAMERAS):
                self.images[slot].publish(image(now_ns, h=48, w=64, seed=self.seed + i)[1])
        self.joints.publish(joint_state(now_ns, names=JOINT_NAMES[self.robot]))


class Inputs:
    """Publishes the robots' inputs (both by default) at 20 Hz while the test spins."""

    def __init__(self, ros_node, robots=('left', 'right')):
        self.ros_node = ros_node
        self.robots = {name: RobotInputs(ros_node.node, name, seed)
                       for name, seed in (('left', 0), ('right', 10)) if name in robots}

    def publish(self):
        stamp = self.ros_node.node.get_clock().now().nanoseconds
        for robot in self.robots.values():
            robot.publish(stamp)

    def run_until(self, predicate, timeout_s=30.0):
        """Publish and spin until ``predicate()``; False on timeout."""
        return self.ros_node.publish_until(self.publish, predicate, timeout_s)


def latest_status(diagnostics, name):
    for received in reversed(diagnostics.messages):
        for status in received.msg.status:
            if status.name == name:
                return status
    return None


def start_node(ros_processes, tmp_path, text, **fields):
    """Start the node on config/test.yaml and a params file of ``text`` (formatted)."""
    robots_yaml = tmp_path / 'robots.yaml'
    robots_yaml.write_text(text.format(joints=', '.join(RIGHT_JOINTS), **fields))
    return ros_processes.start(NODE, '--ros-args', '--params-file', str(config_file('test')),
                               '--params-file', str(robots_yaml))


def test_two_robots_have_their_own_topics_joints_questions_and_staleness(
        ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, tmp_path, ROBOTS_YAML)
    node = ros_node.node
    chunks = {r: ros_node.collect(f'/{r}/oxygen/action_chunk', JointTrajectory, 100)
              for r in JOINT_NAMES}
    answers = {r: ros_node.collect(f'/{r}/oxygen/answer', String, DEEP) for r in JOINT_NAMES}
    streams = {r: ros_node.collect(f'/{r}/oxygen/answer/stream', DecodedText, TEXT_QOS)
               for r in JOINT_NAMES}
    memory = {r: ros_node.collect(f'/{r}/oxygen/memory', String, DEEP) for r in JOINT_NAMES}
    unnamed = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    asks = {r: node.create_publisher(String, f'/{r}/oxygen/ask', DEEP) for r in JOINT_NAMES}
    client = ActionClient(node, Ask, '/right/oxygen/ask')
    inputs = Inputs(ros_node)

    # both robots act, each on its own topics with its own joint names; nothing un-namespaced
    assert inputs.run_until(lambda: all(len(c) >= 3 for c in chunks.values()) and
                            client.server_is_ready() and
                            all(p.get_subscription_count() for p in asks.values()),
                            START_TIMEOUT_S), proc.output()
    for robot, names in JOINT_NAMES.items():
        assert {tuple(m.joint_names) for m in chunks[robot].msgs} == {tuple(names[:7])}
    assert len(unnamed) == 0 and node.count_publishers('/oxygen/action_chunk') == 0
    assert inputs.run_until(lambda: all(len(m) >= 1 for m in memory.values()), 30.0), \
        proc.output()  # each robot's periodic memory note, on its own topic

    # a question on left's topic is answered on left's topic only; a goal on right's action
    # gets right's answer, streamed on right's stream only
    asks['left'].publish(String(data='what is on the table?'))
    goal = client.send_goal_async(Ask.Goal(question='which block is on top?'))
    assert inputs.run_until(goal.done, 30.0), proc.output()
    handle = goal.result()
    assert handle.accepted
    result = handle.get_result_async()
    assert inputs.run_until(lambda: result.done() and len(answers['left']) >= 1, 60.0), \
        proc.output()
    assert result.result().status == GoalStatus.STATUS_SUCCEEDED
    answer = result.result().result.answer
    assert answer.request_id.startswith('right/answer-') and answer.num_tokens >= 1
    inputs.run_until(lambda: False, 1.0)  # pieces still in flight come in
    assert len(answers['left']) == 1 and len(answers['right']) == 0  # the goal's is its result
    assert not answers['left'].msgs[0].data.startswith('no answer')
    left_ids = {m.request_id for m in streams['left'].msgs}
    right_ids = {m.request_id for m in streams['right'].msgs}
    assert left_ids and all(i.startswith('left/answer-') for i in left_ids)
    assert right_ids == {answer.request_id}
    assert ''.join(m.text for m in streams['right'].msgs) == answer.text

    # right's cameras go silent: right stops getting chunks and says why, left keeps acting
    inputs.robots['right'].cameras_on = False
    stale_since = time.monotonic()
    assert inputs.run_until(lambda: time.monotonic() - stale_since > 1.5, 5.0)
    right_before, left_before = len(chunks['right']), len(chunks['left'])
    assert inputs.run_until(lambda: len(chunks['left']) >= left_before + 10, 20.0), \
        proc.output()
    assert len(chunks['right']) == right_before, 'a robot with stale images got a chunk'

    def reported():  # right's ERROR, and left's chunks of the window counted in its status
        left, right = (latest_status(diagnostics, f'oxygen: robot {r}') for r in JOINT_NAMES)
        return right is not None and right.level == Level.ERROR.octet and left is not None and \
            int(status_values(left)['action chunks published']) >= left_before + 10
    assert inputs.run_until(reported, 10.0), proc.output()
    right, left, engine = (latest_status(diagnostics, name) for name in (
        'oxygen: robot right', 'oxygen: robot left', 'oxygen: engine'))
    assert 'no action chunk' in right.message and 'stale' in right.message, right.message
    assert int(status_values(right)['rejected: stale']) >= 1
    assert status_values(right)['robot'] == 'right'
    assert left.level != Level.ERROR.octet and engine.level != Level.ERROR.octet, \
        (left.message, engine.message)
    assert float(status_values(left)['action chunk rate (Hz)']) > 0

    # right's cameras back: right acts again
    inputs.robots['right'].cameras_on = True
    assert inputs.run_until(lambda: len(chunks['right']) >= right_before + 3, 20.0), \
        proc.output()
    assert proc.stop() == 0, proc.output()


RATES_YAML = """\
/**:
  ros__parameters:
    robots: [left, right]
    instruction: pick up the cup
    right:
      joint_names: [{joints}]
      control_rate_hz: {rate}
      action_dt: 0.2
"""
THREE_ON_TEN = ('right.control_rate_hz 3 Hz is not control_rate_hz 10 Hz / n for a whole n (a '
                'robot is due every n-th control cycle): the nearest are 3.33333333 Hz (n = 3) '
                'and 2.5 Hz (n = 4)')


def set_parameter(ros_node, client, name, value):
    """Set one parameter over the node's ~/set_parameters service; return its result."""
    future = client.set_parameters([Parameter(name, value=value)])
    assert ros_node.spin_until(future.done, 20.0), f'no reply setting {name}'
    return future.result().results[0]


def both_robots_status(diagnostics, at_least):
    """Return the newest (left, right) statuses of one message, left's chunks >= at_least."""
    for received in reversed(diagnostics.messages):
        found = {s.name: s for s in received.msg.status}
        left, right = found.get('oxygen: robot left'), found.get('oxygen: robot right')
        if left is not None and right is not None and \
                int(status_values(left)['action chunks published']) >= at_least:
            return left, right
    return None


def test_a_robot_at_half_the_rate_is_due_every_second_cycle(ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, tmp_path, RATES_YAML, rate='5.0')
    chunks = {r: ros_node.collect(f'/{r}/oxygen/action_chunk', JointTrajectory, DEEP)
              for r in JOINT_NAMES}
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    params = AsyncParameterClient(ros_node.node, '/oxygen')
    inputs = Inputs(ros_node)
    assert inputs.run_until(lambda: all(len(c) >= 4 for c in chunks.values()) and
                            params.services_are_ready(), START_TIMEOUT_S), proc.output()

    def counted(window):
        """Return (left's, right's) chunks while left gets ``window`` more."""
        before = {r: len(c) for r, c in chunks.items()}
        assert inputs.run_until(lambda: len(chunks['left']) >= before['left'] + window, 30.0), \
            proc.output()
        inputs.run_until(lambda: False, 0.3)  # the cycle's last chunk still in flight
        return tuple(len(chunks[r]) - before[r] for r in ('left', 'right'))

    # left is due every cycle, right every 2nd: half as many chunks over the same cycles
    left, right = counted(30)
    assert abs(2 * right - left) <= 4, (left, right)
    # right's points are its own action_dt apart, left's the node's (config/test.yaml: 0.05 s)
    for robot, dt_ns in (('left', 50_000_000), ('right', 200_000_000)):
        points = chunks[robot].msgs[-1].points
        steps = {Duration.from_msg(b.time_from_start).nanoseconds -
                 Duration.from_msg(a.time_from_start).nanoseconds
                 for a, b in zip(points, points[1:])}
        assert steps == {dt_ns}, (robot, steps)
    # each robot's status has its own target, and counts its own chunks (one message: one
    # instant, both counted from activation)
    assert inputs.run_until(lambda: both_robots_status(diagnostics, 20) is not None, 10.0)
    left_status, right_status = both_robots_status(diagnostics, 20)
    lv, rv = status_values(left_status), status_values(right_status)
    assert (lv['control rate target (Hz)'], rv['control rate target (Hz)']) == ('10', '5')
    published = int(lv['action chunks published']), int(rv['action chunks published'])
    assert abs(2 * published[1] - published[0]) <= 3, published
    assert Level.ERROR.octet not in (left_status.level, right_status.level), \
        (left_status.message, right_status.message)
    assert float(rv['control rate achieved (Hz)']) < float(lv['control rate achieved (Hz)'])

    # a rate that is no whole fraction is refused with its reason, and so is a node rate
    # that would leave right's none; right's rate is dynamic
    result = set_parameter(ros_node, params, 'right.control_rate_hz', 3.0)
    assert (result.successful, result.reason) == (False, THREE_ON_TEN)
    result = set_parameter(ros_node, params, 'control_rate_hz', 12.0)
    assert not result.successful and result.reason.startswith(
        'right.control_rate_hz 5 Hz is not control_rate_hz 12 Hz / n for a whole n'), \
        result.reason
    result = set_parameter(ros_node, params, 'right.control_rate_hz', 10.0)
    assert result.successful, result.reason
    left, right = counted(20)  # both due every cycle now
    assert abs(right - left) <= 2, (left, right)
    assert proc.stop() == 0, proc.output()


def test_a_robot_rate_no_whole_fraction_of_the_nodes_fails_configure(
        ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, tmp_path, RATES_YAML, rate='3.0')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)

    def failed():
        status = latest_status(diagnostics, 'oxygen: engine')
        return status is not None and status.level == Level.ERROR.octet
    assert ros_node.spin_until(failed, START_TIMEOUT_S), proc.output()
    assert latest_status(diagnostics, 'oxygen: engine').message == \
        f'engine failed: configure failed: bad parameter: {THREE_ON_TEN}'
    assert f'configure failed: bad parameter: {THREE_ON_TEN}' in proc.output()
    assert proc.stop() == 0, proc.output()


ONE_ROBOT_YAML = """\
/**:
  ros__parameters:
    robots: [left]
    instruction: pick up the cup
"""


def test_one_named_robot_alone_is_under_its_namespace(ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, tmp_path, ONE_ROBOT_YAML)
    node = ros_node.node
    chunks = ros_node.collect('/left/oxygen/action_chunk', JointTrajectory, DEEP)
    unnamed = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    client = ActionClient(node, Ask, '/left/oxygen/ask')
    inputs = Inputs(ros_node, robots=('left',))
    assert inputs.run_until(lambda: len(chunks) >= 3 and client.server_is_ready() and
                            latest_status(diagnostics, 'oxygen: robot left') is not None,
                            START_TIMEOUT_S), proc.output()
    assert {tuple(m.joint_names) for m in chunks.msgs} == {tuple(JOINTS[:7])}
    # nothing of the robot on the node's own names: every topic the node publishes or reads
    # but the node's own (diagnostics, lifecycle, parameters, log) is under /left
    assert len(unnamed) == 0

    def topics():
        return {name for get in (node.get_publisher_names_and_types_by_node,
                                 node.get_subscriber_names_and_types_by_node)
                for name, _ in get('oxygen', '/')}
    assert ros_node.spin_until(lambda: {'/left/oxygen/action_chunk', '/left/oxygen/answer',
                                        '/left/joint_states', '/left/oxygen/ask'} <= topics())
    own = {'/diagnostics', '/rosout', '/parameter_events', '/oxygen/transition_event'}
    assert {t for t in topics() - own if not t.startswith('/left/')} == set(), topics()
    assert node.count_publishers('/oxygen/action_chunk') == 0
    services = {name for name, _ in node.get_service_names_and_types_by_node('oxygen', '/')}
    assert '/left/oxygen/ask/_action/send_goal' in services
    assert not {s for s in services if s.startswith('/oxygen/ask')}, services
    status = latest_status(diagnostics, 'oxygen: robot left')
    assert status_values(status)['robot'] == 'left'
    assert proc.stop() == 0, proc.output()
