"""
The closed-loop figures of one simulated run and their printed summary.

Definitions (all in **sim time**):

- **frame-to-action latency** of a chunk: its arrival at the simulator (the sim time when the
  simulator received it) minus its ``header.stamp`` (the stamp of the camera frame it was
  computed from): camera publishing, node queueing, inference, DDS.
- **points skipped**: chunk points due before the chunk arrived (never targets), except those
  of a chunk that arrived while the executor held: it starts where the hold began
  (**resumed after a hold**).
- **hold time**: sim time the executor held its last point because no fresher chunk had taken
  over (after the first chunk).
- **boundary jump** (``boundary_metrics``): at each switch, ``|p_new(t_s) -
  p_prev(t_s)|``, the max over the arm joints (rad).
- **boundary / interior jerk**: ``|third difference| / h^3`` of the commanded arm positions
  sampled every ``h`` (the joint-command period), max over the arm joints; boundary = the
  stencils holding a switch, interior = the others (rad/s³).
- **tracking error**: ``|commanded - achieved|`` of the arm joints at the joint-state stamps,
  max over joints (rad): how well the servos follow.
- **limit clips**: the node's own ``/diagnostics`` counters whose key contains ``clip`` (its
  action space and chunk smoothing are read the same way, by key name; 'n/a' if absent).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Sequence

import numpy as np
from oxygen_ros.sim.reports import EXECUTOR_STATUS, SIMULATION_STATUS
from oxygen_ros.tools.demo.boundary_metrics import boundary_jerk
from oxygen_ros.tools.demo.sim_bag import SimRun
from oxygen_ros.units import NS_PER_S

ARM = 7
"""The first 7 command joints are the arm's (rad); the 8th is the gripper (0..1)."""


@dataclass(frozen=True, slots=True)
class SimMetrics:
    """The figures of one run (NaN where nothing was measured)."""

    smoothing: str
    sim_s: float
    wall_s: float
    chunks_published: int
    chunks_received: int
    chunks_executed: int
    chunks_refused: int
    chunks_superseded: int
    latency_p50_ms: float
    latency_p99_ms: float
    points_skipped: int
    hold_s: float
    limit_clips: str
    node_smoothing: str
    """What the node's diagnostics say about its chunk smoothing ('n/a' if nothing)."""
    node_action_space: str
    jump_p50: float
    jump_p99: float
    jump_max: float
    jerk_boundary_p50: float
    jerk_boundary_p99: float
    jerk_interior_p50: float
    jerk_interior_p99: float
    jerk_period_ms: float
    tracking_p50: float
    tracking_p99: float
    arm_motion: float
    """Largest range of an achieved arm joint over the run (rad)."""
    render_ms: float
    """The simulator's offscreen rendering time per camera frame (wall ms)."""
    chunks_resumed: int = 0
    """Chunks that arrived while the executor held and started where the hold began."""
    robot: str = ''
    """The arm and the node's robot ('' = the one arm)."""

    @property
    def real_time_factor(self) -> float:
        return self.sim_s / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def chunk_rate_hz(self) -> float:
        """Chunks executed per second of sim time."""
        return self.chunks_executed / self.sim_s if self.sim_s > 0 else math.nan


def _pct(values: Sequence[float], q: float) -> float:
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


def node_values(node_status: Sequence[dict[str, str]], word: str) -> str:
    """
    Return the node's ``/diagnostics`` values whose key contains ``word``, or 'n/a'.

    Read by key name from its last status (``key value; ...``): counters the node may or may
    not have (limit clips, action space, chunk smoothing).
    """
    if not node_status:
        return 'n/a'
    found = [f'{k} {v}' for k, v in node_status[-1].items()
             if word in k.lower() and k not in ('message', 'level')]
    return '; '.join(found) if found else 'n/a'


def compute_metrics(run: SimRun, smoothing: str, wall_s: float, robot: str = '') -> SimMetrics:
    """
    Return the figures of a recorded run of one arm (module docstring).

    :param run: the run read back from its bag (``read_run(bag, robot)``).
    :param smoothing: the node's ``chunk_smoothing`` (a label).
    :param wall_s: wall seconds the simulated span took (for the real-time factor).
    :param robot: the arm (a label; '' = the one arm).
    """
    events = run.events
    accepted = [e for e in events if e['message'] == 'accepted']
    executed = run.executed()
    refused = [e for e in events if e['message'].startswith('refused')]
    latency = [(int(e['arrival_ns']) - int(e['stamp_ns'])) / 1e6 for e in accepted]
    names = run.joint_names[:ARM]
    jumps = [max(abs(float(e[f'jump {n}'])) for n in names) for e in executed[1:]]
    switches = [int(e['switch_ns']) for e in executed[1:]]
    period_ns = int(np.median(np.diff(run.command_t))) if run.command_t.size > 4 else 0
    jb, ji = np.zeros(0), np.zeros(0)
    if period_ns > 0:
        boundary, interior = boundary_jerk(run.command_t, run.command_q[:, :ARM], switches,
                                           period_ns)
        if switches:
            jb = boundary.max(axis=1)  # NaN rows (no complete stencil) stay NaN
        if interior.size:
            ji = interior.max(axis=1)
    tracking: list[float] = []
    if run.state_t.size and run.command_t.size:
        idx = np.searchsorted(run.command_t, run.state_t)
        ok = (idx < run.command_t.size) & (run.command_t[np.minimum(idx, run.command_t.size - 1)]
                                           == run.state_t)
        err = np.abs(run.command_q[idx[ok], :ARM] - run.state_q[ok, :ARM])
        tracking = err.max(axis=1).tolist()
    sim_status = run.sim_status.get(EXECUTOR_STATUS, [{}])[-1]
    sim_loop = run.sim_status.get(SIMULATION_STATUS, [{}])[-1]
    span = (run.state_t[-1] - run.state_t[0]) / NS_PER_S if run.state_t.size > 1 else 0.0
    motion = float(np.ptp(run.state_q[:, :ARM], axis=0).max()) if run.state_q.size else 0.0
    return SimMetrics(
        smoothing=smoothing, robot=robot, sim_s=span, wall_s=wall_s,
        chunks_published=len(run.chunks),
        chunks_received=len(accepted) + len(refused), chunks_executed=len(executed),
        chunks_refused=len(refused),
        chunks_superseded=int(sim_status.get('chunks superseded', 0)),
        chunks_resumed=int(sim_status.get('chunks resumed after a hold', 0)),
        latency_p50_ms=_pct(latency, 50), latency_p99_ms=_pct(latency, 99),
        points_skipped=sum(int(e['points skipped']) for e in accepted),
        hold_s=float(sim_status.get('hold time (s)', 'nan')),
        limit_clips=node_values(run.node_status, 'clip'),
        node_smoothing=node_values(run.node_status, 'smoothing'),
        node_action_space=node_values(run.node_status, 'action space'),
        jump_p50=_pct(jumps, 50), jump_p99=_pct(jumps, 99),
        jump_max=max(jumps) if jumps else math.nan,
        jerk_boundary_p50=_pct(jb, 50), jerk_boundary_p99=_pct(jb, 99),
        jerk_interior_p50=_pct(ji, 50), jerk_interior_p99=_pct(ji, 99),
        jerk_period_ms=period_ns / 1e6, tracking_p50=_pct(tracking, 50),
        tracking_p99=_pct(tracking, 99), arm_motion=motion,
        render_ms=float(sim_loop.get('render time per frame (ms)', 'nan')))


def summary(m: SimMetrics) -> str:
    """Return the printed summary of one run."""
    per = m.points_skipped / m.chunks_received if m.chunks_received else math.nan
    return '\n'.join([
        f'{"robot: " + m.robot + "; " if m.robot else ""}smoothing: {m.smoothing}; sim time '
        f'{m.sim_s:.1f} s in {m.wall_s:.1f} s wall (real-time factor '
        f'{m.real_time_factor:.2f}; rendering {m.render_ms:.1f} ms per 224x224 frame)',
        f'chunks: {m.chunks_published} published by the node, {m.chunks_received} received by '
        f'the sim, {m.chunks_executed} executed ({m.chunk_rate_hz:.1f} per sim second), '
        f'{m.chunks_refused} refused, '
        f'{m.chunks_superseded} superseded, {m.chunks_resumed} resumed after a hold',
        f'frame-to-action latency (sim time, arrival - header.stamp): p50 '
        f'{m.latency_p50_ms:.1f} ms, p99 {m.latency_p99_ms:.1f} ms',
        f'points skipped for lateness: {m.points_skipped} ({per:.2f} per chunk); hold time '
        f'{m.hold_s:.2f} s',
        'node /diagnostics: ' + '; '.join(
            value if value != 'n/a' else f'{label} n/a' for label, value in (
                ('limit clips', m.limit_clips), ('action space', m.node_action_space),
                ('chunk smoothing', m.node_smoothing))),
        f'boundary jump (arm, rad): p50 {m.jump_p50:.4f}, p99 {m.jump_p99:.4f}, max '
        f'{m.jump_max:.4f}',
        f'jerk (arm, rad/s^3, h = {m.jerk_period_ms:g} ms): boundary p50 '
        f'{m.jerk_boundary_p50:.0f}, p99 {m.jerk_boundary_p99:.0f}; interior p50 '
        f'{m.jerk_interior_p50:.0f}, p99 {m.jerk_interior_p99:.0f}',
        f'tracking |commanded - achieved| (arm, rad): p50 {m.tracking_p50:.4f}, p99 '
        f'{m.tracking_p99:.4f}; largest joint range moved {m.arm_motion:.3f} rad',
    ])


def compare_table(runs: Sequence[SimMetrics]) -> str:
    """Return one table of the runs side by side (``--compare``; a robot column if named)."""
    rows = [('smoothing', 'robot', 'node says', 'executed', 'lat p50 ms', 'lat p99 ms',
             'skipped', 'hold s', 'jump p50', 'jump p99', 'jump max', 'jerk bnd p50',
             'jerk bnd p99', 'jerk int p99')]
    for m in runs:
        rows.append((m.smoothing, m.robot, m.node_smoothing, str(m.chunks_executed),
                     f'{m.latency_p50_ms:.1f}', f'{m.latency_p99_ms:.1f}',
                     str(m.points_skipped), f'{m.hold_s:.2f}',
                     f'{m.jump_p50:.4f}', f'{m.jump_p99:.4f}', f'{m.jump_max:.4f}',
                     f'{m.jerk_boundary_p50:.0f}',
                     f'{m.jerk_boundary_p99:.0f}', f'{m.jerk_interior_p99:.0f}'))
    if not any(m.robot for m in runs):
        rows = [r[:1] + r[2:] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return '\n'.join('  '.join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


__all__ = ['ARM', 'SimMetrics', 'compare_table', 'compute_metrics', 'node_values', 'summary']
