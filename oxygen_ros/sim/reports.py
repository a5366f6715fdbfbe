"""
The simulator's ``diagnostic_msgs`` reports: executor and simulation status, chunk events.

``/diagnostics`` gets two statuses, ``oxygen_sim: chunk executor`` (counters of
``ExecutorStats``) and ``oxygen_sim: simulation`` (sim time, real-time factor, rendering);
with several arms one executor status per arm, ``oxygen_sim: chunk executor <arm>``.
An arm's ``~/chunk_events`` gets one status per chunk event, named ``oxygen_sim: chunk``, message
``accepted`` / ``refused: <reason>`` / ``executed``, with integer-ns stamps as values, so a
recorded bag holds every switch of the run (``oxygen_demo sim`` reads them back by key name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
import numpy as np
from oxygen_ros.control.chunk_executor import ExecutorStats, Switch
from oxygen_ros.units import NS_PER_S

EXECUTOR_STATUS = 'oxygen_sim: chunk executor'
SIMULATION_STATUS = 'oxygen_sim: simulation'
CHUNK_EVENT = 'oxygen_sim: chunk'
_OK, _WARN = bytes([0]), bytes([1])


@dataclass(frozen=True, slots=True)
class SimStats:
    """What the simulation loop measured (wall times from ``time.monotonic``)."""

    sim_time_s: float
    wall_time_s: float
    frames_rendered: int
    render_s_per_frame: float
    num_lagging_resets: int


def _kv(values: dict[str, object]) -> list[KeyValue]:
    return [KeyValue(key=k, value=str(v)) for k, v in values.items()]


def executor_status_name(arm: str = '') -> str:
    """Return the name of arm ``arm``'s executor status (``oxygen_sim: chunk executor left``)."""
    return f'{EXECUTOR_STATUS} {arm}' if arm else EXECUTOR_STATUS


def executor_status(stats: ExecutorStats, arm: str = '') -> DiagnosticStatus:
    """
    Return ``oxygen_sim: chunk executor`` (WARN if a chunk was ever refused).

    :param arm: the arm (a named one's status is ``executor_status_name(arm)``, its first
        value ``arm``).
    """
    lat = np.asarray(stats.latencies_ns, dtype=np.float64) / 1e6
    values = {
        'chunks received': stats.num_received, 'chunks accepted': stats.num_accepted,
        'chunks refused': stats.num_refused, 'chunks late': stats.num_late,
        'chunks executed': stats.num_executed, 'chunks superseded': stats.num_superseded,
        'points skipped': stats.num_points_skipped,
        'chunks resumed after a hold': stats.num_resumed,
        'hold time (s)': f'{stats.hold_ns / NS_PER_S:.3f}',
        'latency p50 (ms)': f'{np.percentile(lat, 50):.1f}' if lat.size else 'n/a',
        'latency p99 (ms)': f'{np.percentile(lat, 99):.1f}' if lat.size else 'n/a',
    }
    if arm:
        values = {'arm': arm, **values}
    level = _WARN if stats.num_refused else _OK
    message = (f'{stats.num_refused} chunk(s) refused' if stats.num_refused
               else 'executing' if stats.num_executed else 'waiting for chunks')
    return DiagnosticStatus(level=level, name=executor_status_name(arm), message=message,
                            hardware_id='oxygen_sim', values=_kv(values))


def simulation_status(stats: SimStats, target_rtf: float) -> DiagnosticStatus:
    """Return ``oxygen_sim: simulation`` (WARN below 90 % of the target real-time factor)."""
    rtf = stats.sim_time_s / stats.wall_time_s if stats.wall_time_s > 0 else 0.0
    slow = stats.wall_time_s > 2.0 and rtf < 0.9 * target_rtf
    values = {'sim time (s)': f'{stats.sim_time_s:.3f}', 'real-time factor': f'{rtf:.3f}',
              'target real-time factor': f'{target_rtf:g}',
              'frames rendered': stats.frames_rendered,
              'render time per frame (ms)': f'{stats.render_s_per_frame * 1e3:.1f}',
              'lagging resets': stats.num_lagging_resets}
    return DiagnosticStatus(level=_WARN if slow else _OK, name=SIMULATION_STATUS,
                            message='slower than the target real-time factor' if slow
                            else 'running', hardware_id='oxygen_sim', values=_kv(values))


def accepted_event(stamp_ns: int, arrival_ns: int, num_skipped: int) -> DiagnosticStatus:
    """Return the event of an accepted chunk."""
    return DiagnosticStatus(level=_OK, name=CHUNK_EVENT, message='accepted',
                            values=_kv({'stamp_ns': stamp_ns, 'arrival_ns': arrival_ns,
                                        'points skipped': num_skipped}))


def refused_event(stamp_ns: int, arrival_ns: int, reason: str) -> DiagnosticStatus:
    """Return the event of a refused chunk."""
    return DiagnosticStatus(level=_WARN, name=CHUNK_EVENT, message=f'refused: {reason}',
                            values=_kv({'stamp_ns': stamp_ns, 'arrival_ns': arrival_ns}))


def executed_event(switch: Switch, joint_names: Sequence[str]) -> DiagnosticStatus:
    """Return the event of a chunk taking over the command (``jump <joint>`` per joint)."""
    values: dict[str, object] = {'stamp_ns': switch.stamp_ns, 'arrival_ns': switch.arrival_ns,
                                 'switch_ns': switch.time_ns,
                                 'points skipped': switch.num_skipped}
    values.update({f'jump {name}': repr(float(v)) for name, v in zip(joint_names, switch.jump)})
    return DiagnosticStatus(level=_OK, name=CHUNK_EVENT, message='executed', values=_kv(values))


__all__ = ['CHUNK_EVENT', 'EXECUTOR_STATUS', 'SIMULATION_STATUS', 'SimStats',
           'accepted_event', 'executed_event', 'executor_status', 'executor_status_name',
           'refused_event', 'simulation_status']
