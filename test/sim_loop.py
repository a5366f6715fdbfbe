"""What the closed-loop tests read from ``oxygen_sim``: its chunk events, its commands replayed."""

import numpy as np
from oxygen_ros.control.chunk_executor import ChunkExecutor
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.units import NS_PER_S


def stamp_ns(header):
    return header.stamp.sec * NS_PER_S + header.stamp.nanosec


def chunk_events(event_msgs):
    """Return the refused messages, the accepted events' values and the executed statuses."""
    statuses = [s for msg in event_msgs for s in msg.status]
    refused = [s.message for s in statuses if s.message.startswith('refused')]
    accepted = [{kv.key: kv.value for kv in s.values} for s in statuses
                if s.message == 'accepted']
    executed = [s for s in statuses if s.message == 'executed']
    return refused, accepted, executed


def replay(accepted, chunk_msgs, command_msgs, first_ns, end_ns):
    """
    Feed an offline ``ChunkExecutor`` the chunks at their recorded arrival times.

    One publisher, reliable: the sim took the chunks in the order the test got them (two chunks
    may share a stamp when the node acts twice on one frame), so they are paired by order.
    Compared up to ``end_ns`` only: the sim ran on after it, so every event of that span had
    arrived (the last ones before the sim's shutdown may not).

    :returns: ``(matched, compared, mismatches, executor)``: commands equal to the replay's,
        commands compared in ``[first_ns, end_ns]``, the mismatches' times (ms before end_ns).
    """
    arrivals = [(int(a['arrival_ns']), m) for a, m in zip(accepted, chunk_msgs)]
    cmd_t = np.array([stamp_ns(m.header) for m in command_msgs])
    cmd_q = np.array([m.position for m in command_msgs])
    executor = ChunkExecutor(tuple(command_msgs[0].name), cmd_q[0])
    matched, compared, k, mismatches = 0, 0, 0, []
    for t_ns, recorded in zip(cmd_t, cmd_q):
        while k < len(arrivals) and arrivals[k][0] <= t_ns:
            arrival, msg = arrivals[k]
            assert executor.submit(trajectory_from_msg(msg), arrival)
            k += 1
        expected = executor.command(int(t_ns)).positions
        if first_ns <= t_ns <= end_ns:
            compared += 1
            if np.allclose(expected, recorded, atol=1e-9):
                matched += 1
            else:
                mismatches.append((t_ns - end_ns) / 1e6)
    return matched, compared, mismatches, executor
