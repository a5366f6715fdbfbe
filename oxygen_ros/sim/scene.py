"""
The simulated scene, built in code with ``mujoco.MjSpec`` (never hand-merged XML).

A table whose top is the world's ``z = 0``, MuJoCo Menagerie's Franka Emika Panda with its
hand standing on it at the origin (``MjSpec.attach`` of ``panda.xml`` with the prefix
``panda/``), a red cup (a free cylinder), a fixed ``base_camera`` looking at the workspace from
the front right (like DROID's exterior camera) and a ``wrist_camera`` on the ``hand`` body
looking along the fingers. For fast software rendering (Mesa's llvmpipe; the figures:
``docs/simulation.md#the-simulator-oxygen_sim-node-oxygen_sim-oxygen_rossim``) lights cast no
shadows, nothing reflects and the offscreen buffer has no multisampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from oxygen_ros.parameters import in_config
from oxygen_ros.sim.arms import ARM_JOINTS, FINGER_JOINTS, GRIPPER
from oxygen_ros.sim.assets import PANDA_XML

PANDA_PREFIX = 'panda/'
"""The Panda's names in the scene (``panda/joint1``); the joint names: ``sim.arms``."""
HOME_KEY = 'home'
BASE_CAMERA = 'base_camera'
WRIST_CAMERA = 'wrist_camera'


@dataclass(frozen=True, slots=True)
class SceneConfig:
    """
    What the scene is made of.

    :ivar image_size: width = height of the offscreen buffer (px; default: the declared
        ``image_size`` of ``oxygen_sim``).
    :ivar timestep_s: physics step (Menagerie's Panda: 2 ms).
    :ivar cup_xy: cup position on the table (m, world frame: x forward, y left).
    :ivar base_camera_pos: base camera position (m).
    :ivar base_camera_target: point it looks at (m).
    :ivar fovy_deg: vertical field of view of both cameras.
    """

    image_size: int = in_config('sim')['image_size'].default
    timestep_s: float = 0.002
    cup_xy: tuple[float, float] = (0.5, 0.15)
    base_camera_pos: tuple[float, float, float] = (1.25, -0.75, 0.75)
    base_camera_target: tuple[float, float, float] = (0.3, 0.0, 0.3)
    fovy_deg: float = 55.0

    def __post_init__(self) -> None:
        if not 16 <= self.image_size <= 4096:
            raise ValueError(f'image_size must be in [16, 4096], got {self.image_size}')
        if not 0 < self.timestep_s <= 0.01:
            raise ValueError(f'timestep_s must be in (0, 0.01], got {self.timestep_s}')


def look_at(pos: np.ndarray, target: np.ndarray) -> list[float]:
    """
    Return MJCF ``xyaxes`` of a camera at ``pos`` looking at ``target`` (world z up).

    A MuJoCo camera looks along its -z axis with +y up in the image.
    """
    back = np.asarray(pos, dtype=float) - np.asarray(target, dtype=float)
    back /= np.linalg.norm(back)
    right = np.cross([0.0, 0.0, 1.0], back)
    right /= np.linalg.norm(right)
    up = np.cross(back, right)
    return [*right, *up]


def build_spec(panda_folder: Path, config: SceneConfig = SceneConfig()) -> mujoco.MjSpec:
    """
    Return the scene's spec (compile it with ``spec.compile()``).

    :param panda_folder: Menagerie's ``franka_emika_panda/`` (``assets.panda_dir()``).
    :raises ValueError: MuJoCo cannot read ``panda.xml`` (message from MuJoCo).
    """
    panda = mujoco.MjSpec.from_file(str(panda_folder / PANDA_XML))
    panda.meshdir = str(panda_folder / 'assets')
    spec = mujoco.MjSpec()
    spec.modelname = 'oxygen_sim_panda'
    spec.option.timestep = config.timestep_s
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST  # as panda.xml
    spec.visual.global_.offwidth = config.image_size
    spec.visual.global_.offheight = config.image_size
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = 0
    spec.visual.headlight.ambient = [0.4, 0.4, 0.4]
    spec.visual.headlight.diffuse = [0.5, 0.5, 0.5]
    world = spec.worldbody
    world.add_light(name='sun', pos=[0.5, 0.0, 2.0], dir=[0.0, 0.0, -1.0],
                    type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL, castshadow=0,
                    diffuse=[0.6, 0.6, 0.6])
    world.add_geom(name='floor', type=mujoco.mjtGeom.mjGEOM_PLANE, size=[3.0, 3.0, 0.05],
                   pos=[0.0, 0.0, -0.75], rgba=[0.35, 0.37, 0.4, 1.0])
    world.add_geom(name='table', type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.55, 0.6, 0.375],
                   pos=[0.35, 0.0, -0.375], rgba=[0.62, 0.48, 0.34, 1.0])
    cup = world.add_body(name='cup', pos=[config.cup_xy[0], config.cup_xy[1], 0.05])
    cup.add_freejoint(name='cup_free')
    cup.add_geom(name='cup', type=mujoco.mjtGeom.mjGEOM_CYLINDER, size=[0.035, 0.05, 0.0],
                 rgba=[0.8, 0.1, 0.1, 1.0], mass=0.1)
    world.add_camera(name=BASE_CAMERA, pos=list(config.base_camera_pos),
                     xyaxes=look_at(np.array(config.base_camera_pos),
                                    np.array(config.base_camera_target)),
                     fovy=config.fovy_deg)
    spec.attach(panda, prefix=PANDA_PREFIX, frame=world.add_frame(pos=[0.0, 0.0, 0.0]))
    hand = spec.body(PANDA_PREFIX + 'hand')
    # Fingers point along the hand's +z; the camera looks along its own -z: turn it half
    # around the hand's x+y diagonal, and sit it behind the fingers, off the hand's centre.
    hand.add_camera(name=WRIST_CAMERA, pos=[0.06, 0.0, 0.02],
                    quat=[0.0, 0.7071068, 0.7071068, 0.0], fovy=70.0)
    return spec


def build_model(panda_folder: Path, config: SceneConfig = SceneConfig()) -> mujoco.MjModel:
    """Return the compiled scene (see ``build_spec``)."""
    return build_spec(panda_folder, config).compile()


__all__ = ['ARM_JOINTS', 'BASE_CAMERA', 'FINGER_JOINTS', 'GRIPPER', 'HOME_KEY', 'PANDA_PREFIX',
           'SceneConfig', 'WRIST_CAMERA', 'build_model', 'build_spec', 'look_at']
