"""Simulator tests: MuJoCo renders headless (EGL through Mesa) unless MUJOCO_GL says otherwise."""

import os

os.environ.setdefault('MUJOCO_GL', 'egl')  # before any test module imports mujoco
