"""
Offscreen rendering of the scene's cameras (headless: EGL through Mesa, or OSMesa).

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when ``mujoco`` is first imported: set
``MUJOCO_GL=egl`` (Mesa's llvmpipe on a machine without a GPU, the NVIDIA driver's EGL on one
with) or ``MUJOCO_GL=osmesa`` (Debian ``libosmesa6``) before that; ``oxygen_sim`` sets ``egl``
when it is unset. Without a display, the default (GLFW) fails.
"""

from __future__ import annotations

import os

import mujoco
import numpy as np


class CameraRenderer:
    """
    Render named cameras of one model into ``uint8 [size, size, 3]`` RGB arrays.

    :param model: the compiled scene.
    :param size: width = height in px (at most the model's offscreen buffer).
    :raises RuntimeError: no headless OpenGL backend could be created (the message says what to
        set or install).
    """

    def __init__(self, model: mujoco.MjModel, size: int) -> None:
        backend = os.environ.get('MUJOCO_GL', '')
        try:
            self._renderer = mujoco.Renderer(model, size, size)
        except Exception as exc:  # noqa: B902 (GL errors come in many types)
            raise RuntimeError(
                f'cannot create an offscreen OpenGL context (MUJOCO_GL={backend!r}): {exc}. '
                f'Set MUJOCO_GL=egl (Mesa libEGL + libGL: Debian libegl1 libegl-mesa0 libgl1 '
                f'libgl1-mesa-dri) or '
                f'MUJOCO_GL=osmesa (libosmesa6) before Python starts.') from None
        self.size = size

    def render(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        """
        Return what ``camera`` sees in ``data``'s state.

        :returns: a new ``uint8 [size, size, 3]`` RGB array (row 0 is the image top).
        :raises KeyError: no such camera (MuJoCo's message).
        """
        self._renderer.update_scene(data, camera=camera)
        return self._renderer.render().copy()

    def close(self) -> None:
        """Free the OpenGL context."""
        self._renderer.close()


__all__ = ['CameraRenderer']
