"""
Overload, the KV part: a KV pool with room for the action path and ~2 questions, over real DDS.

The node (tiny preset, ``kv_cache_mb`` 0.1 = 50 blocks of 16 tokens: the action reserve of 12
blocks kept free for the action path, and room for two 32-token answers beside the current
frame's prefix) gets valid inputs at 20 Hz; after 4 s of actions only, questions come at 5/s
for 8 s, each needing ~1 s of decoding, so most of them cannot get KV blocks. Text waits in the
engine's queue, admitted first come first served as blocks free up; once
``max_waiting_requests`` (8 here) wait, a question is refused at arrival with the reason. None is
dropped after it was taken: every question waits its turn or is refused. The action path never
waits for KV: in every ``/diagnostics`` status of the loaded span, every control cycle published a
chunk (chunk rate == control rate, no input rejected), and chunks keep arriving around each
refusal. The rate itself is compute (text decoding shares the CPU with the actions and, here,
with other jobs): it is printed for docs/robustness.md, and only a stall (under half the rate
before the questions) fails the test (house rule: speed is measured, not asserted in timed
tests).
"""

import time

from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import State
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.tools.common.node_client import LifecycleClient
import pytest
from ros_load import Load, start_node
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

MAX_WAITING = 8
"""Full after about 4-5 s of the 8 s of questions: they come at ~4.5/s, two KV slots answer
~2.5/s (the default 16 would fill just as the questions stop, and refuse none)."""
# answers with a prefix of their own (the KV arithmetic above); on the action prefix they share
# the frame's root and more of them fit
PARAMS = ('memory_period:=0.0', 'decode_budget:=32', 'stop_on_eos:=false', 'kv_cache_mb:=0.1',
          'answer_context:=own_prompt', f'max_waiting_requests:={MAX_WAITING}')
RATE_HZ = 10.0
NO_ANSWER = 'no answer: '


def rate(collector, t0_ns, t1_ns):
    times = [r.received_ns for r in collector.messages if t0_ns <= r.received_ns < t1_ns]
    return len(times) * 1e9 / (t1_ns - t0_ns)


def test_text_is_queued_or_refused_while_actions_keep_their_rate(ros_node, ros_processes):
    proc = start_node(ros_processes, *PARAMS)
    chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    answers = ros_node.collect('/oxygen/answer', String, 100)
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    assert LifecycleClient(ros_node.node, ros_node.spin_until).wait_for(
        State.PRIMARY_STATE_ACTIVE, 60, lambda: proc.popen.poll() is None), proc.output()
    load = Load(ros_node)
    load.wait_for_node()
    load.instruction.publish(String(data='pick up the coffee cup'))
    load.run(2.0, ask=False)  # discovery settles, chunks flow
    t0 = time.time_ns()
    load.run(4.0, ask=False)
    t1 = time.time_ns()
    load.run(8.0)  # 40 questions
    t2 = time.time_ns()
    asked = load.asked
    load.flush_questions()
    assert ros_node.spin_until(lambda: (load.run(0.2, ask=False), len(answers) >= asked)[1],
                               60), (len(answers), asked, proc.output()[-3000:])
    load.run(1.0, ask=False)

    quiet, loaded = rate(chunks, t0, t1), rate(chunks, t1, t2)
    refused = [r for r in answers.messages if r.msg.data.startswith(NO_ANSWER)]
    statuses = [status_values(d.status[0]) for d in diagnostics.msgs]
    kv_peak = max(int(s['KV blocks used']) for s in statuses)
    capacity = int(statuses[-1]['KV blocks capacity'])
    running_peak = max(int(s['text requests running']) for s in statuses)
    print(f'kv overload: {asked} questions, {len(answers) - len(refused)} answered, '
          f'{len(refused)} refused ({sorted({r.msg.data for r in refused})}); chunks/s '
          f'{quiet:.2f} before, {loaded:.2f} under the questions; KV peak {kv_peak}/{capacity}'
          f' blocks, at most {running_peak} decoding at once')
    assert len(answers) == asked  # one reply each
    assert refused and len(refused) < asked  # some refused, some answered after waiting
    assert all(r.msg.data == f'{NO_ANSWER}queue full ({MAX_WAITING} requests waiting, '
               f'max_waiting_requests {MAX_WAITING})' for r in refused)
    assert capacity == 50 and kv_peak >= 24 and running_peak <= 3
    # Actions never wait for KV: every cycle of the loaded span published its chunk.
    during = [status_values(r.msg.status[0]) for r in diagnostics.messages
              if t1 + 3_000_000_000 <= r.received_ns < t2]  # 3 s windows inside the span
    assert len(during) >= 10
    for values in during:
        assert values['action chunk rate (Hz)'] == values['control rate achieved (Hz)'], values
    assert int(during[-1]['rejected: stale']) == int(during[0]['rejected: stale'])
    assert loaded >= 0.5 * quiet, (quiet, loaded)  # no stall
    # Chunks keep coming while refusals go out: none of the 100 ms gaps around a refusal.
    for r in refused:
        around = [c for c in chunks.messages if abs(c.received_ns - r.received_ns) < 300_000_000]
        assert around, r.msg.data
    assert proc.popen.poll() is None
    assert proc.stop() == 0, proc.output()
