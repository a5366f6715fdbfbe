"""
Action chunks → the messages the node publishes, by action space (``control.action_space``).

- ``joint_position``: ``~/action_chunk`` (JointTrajectory), every action joint in
  ``positions``;
- ``joint_velocity``: ``~/action_chunk``, ``positions`` integrated from the observed joint
  state and ``velocities``;
- ``ee_delta``: ``~/ee_delta_chunk`` (MultiDOFJointTrajectory), per-step end-effector deltas,
  and ``~/action_chunk`` with the gripper joints only.

Every chunk is clipped to the limits before it is converted; the clip counts come back with
the messages. All messages carry ``header.stamp`` = the observation's stamp and
``time_from_start = i * action_dt``.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.config import ActionSpace
from oxygen_ros.control.action_space import ClipCount, EeDeltaCommand
from oxygen_ros.engine import ActionChunk
from oxygen_ros.ros.node_config import NodeConfig
from oxygen_ros.ros.trajectories import actions_to_trajectory, ee_deltas_to_multidof

ACTION_CHUNK = 'action'
"""Publisher key of ``~/action_chunk`` (JointTrajectory)."""
EE_DELTA_CHUNK = 'ee_delta'
"""Publisher key of ``~/ee_delta_chunk`` (MultiDOFJointTrajectory)."""


@dataclass(frozen=True, slots=True)
class ChunkMessages:
    """The messages of one action chunk, by publisher key, and what the limits clipped."""

    messages: tuple[tuple[str, object], ...]
    clips: ClipCount


class ChunkOutput:
    """
    Converts engine action chunks into messages for one node configuration.

    :param cfg: the node's configuration (action space, joints, limits, ``action_dt``).
    :raises ParameterError: a configuration whose joints cannot carry its action space.
    """

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.semantics = cfg.action_semantics()

    @property
    def publisher_keys(self) -> tuple[str, ...]:
        """Return the publishers this action space needs."""
        if self.cfg.action_space is ActionSpace.EE_DELTA:
            return (ACTION_CHUNK, EE_DELTA_CHUNK) if self.cfg.gripper_dims else \
                (EE_DELTA_CHUNK,)
        return (ACTION_CHUNK,)

    def messages(self, chunk: ActionChunk) -> ChunkMessages:
        """
        Return the clipped messages of ``chunk``.

        :raises ValueError: a chunk of the wrong shape or with NaN/Inf (also in the state a
            joint-velocity chunk starts from).
        """
        cfg = self.cfg
        cmd = self.semantics.command(chunk.actions, chunk.state)
        stamp, dt = chunk.stamp_ns, cfg.action_dt
        if isinstance(cmd, EeDeltaCommand):
            out = [(EE_DELTA_CHUNK, ee_deltas_to_multidof(
                cmd.translations, cmd.rotations, cfg.end_effector_name, stamp, dt,
                cfg.frame_id))]
            if cfg.gripper_dims:
                names = [cfg.action_joint_names[d] for d in cfg.gripper_dims]
                out.insert(0, (ACTION_CHUNK, actions_to_trajectory(
                    cmd.grippers, names, stamp, dt, cfg.frame_id)))
            return ChunkMessages(tuple(out), cmd.clips)
        msg = actions_to_trajectory(cmd.positions, cfg.action_joint_names, stamp, dt,
                                    cfg.frame_id, velocities=cmd.velocities)
        return ChunkMessages(((ACTION_CHUNK, msg),), cmd.clips)


__all__ = ['ACTION_CHUNK', 'ChunkMessages', 'ChunkOutput', 'EE_DELTA_CHUNK']
