"""
``oxygen_doctor``'s ROS 2 checks: which rclpy, the venv beside a ROS 2 install, DDS security.

Beside a ROS 2 install the node runs in a venv made with the system interpreter and
``--system-site-packages`` (apt's ``python3-*`` and JetPack's TensorRT bindings stay visible),
with a ``COLCON_IGNORE`` in it (ROS 2's "Using Python Packages" guide), and without the
``ros-*`` wheels of PyPI, whose rclpy and messages would stand beside the install's
(docs/running.md#on-a-robot-with-ros-2).

DDS security needs a middleware built with its plugins. rmw_fastrtps compiles the sentence
``ros.security.NO_PLUGINS_MARKER`` into ``librmw_fastrtps_shared_cpp`` only when Fast DDS was
built without them (``-DSECURITY=OFF``, the PyPI wheels), and Fast DDS then lacks its builtin
``builtin.PKI-DH`` authentication plugin; Cyclone DDS ships them as ``libdds_security_*``.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
import sys
from typing import Iterable, Mapping

from oxygen_ros.tools.doctor.findings import Finding, Level

FAST_DDS_RMWS = ('rmw_fastrtps_cpp', 'rmw_fastrtps_dynamic_cpp')
ROS_WHEEL_PREFIXES = ('ros-', 'ros_')


def ros_wheels() -> list[str]:
    """Return the ``ros-*`` distributions (PyPI's ROS 2 wheels) this interpreter sees."""
    names = {d.metadata['Name'] for d in importlib.metadata.distributions()}
    return sorted(n for n in names if n and n.lower().startswith(ROS_WHEEL_PREFIXES))


def ros_install(environ: Mapping[str, str]) -> Path | None:
    """Return the sourced ROS 2 install (``/opt/ros/<distro>``), or None."""
    distro = environ.get('ROS_DISTRO', '')
    for prefix in environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep):
        if prefix and Path(prefix) != Path(sys.prefix) and \
                (Path(prefix) / 'share' / 'rclpy').is_dir() and distro:
            return Path(prefix)
    return None


def check_ros(environ: Mapping[str, str] = os.environ) -> Finding:
    """Return which rclpy this interpreter imports: a ROS 2 install's or the PyPI wheels'."""
    install = ros_install(environ)
    try:
        import rclpy
    except ImportError as exc:
        return Finding('ros 2', Level.ERROR, f'rclpy is not importable ({exc})',
                       'source /opt/ros/jazzy/setup.bash and run the venv made from the '
                       "system python3 (ROS 2 Jazzy is built for Ubuntu 24.04's Python 3.12)")
    where = Path(rclpy.__file__).resolve().parent
    wheels = ros_wheels()
    if install is not None and wheels:
        return Finding('ros 2', Level.WARN, f'rclpy from {where}, and {len(wheels)} ROS 2 '
                       f'wheels of PyPI in {sys.prefix} ({", ".join(wheels[:3])}, ...) beside '
                       f'the ROS 2 install {install}: two rclpys and two sets of messages',
                       f'{sys.executable} -m pip uninstall {" ".join(wheels)}; the robot '
                       'path installs requirements/robot.txt, which has none')
    if install is not None:
        return Finding('ros 2', Level.OK, f'rclpy from the ROS 2 {environ["ROS_DISTRO"]} '
                       f'install {install} ({where})')
    version = next((importlib.metadata.version(n) for n in wheels
                    if n.lower().endswith('rclpy')), '?')
    return Finding('ros 2', Level.INFO, f'rclpy {version} from the PyPI wheels in {sys.prefix} '
                   '(no ROS 2 install sourced)')


def check_venv(environ: Mapping[str, str] = os.environ) -> Finding:
    """Return how this venv sits beside a ROS 2 install (system site packages, COLCON_IGNORE)."""
    if sys.prefix == sys.base_prefix:
        return Finding('venv', Level.INFO, f'none: {sys.executable} is the system interpreter')
    cfg = Path(sys.prefix) / 'pyvenv.cfg'
    text = cfg.read_text() if cfg.is_file() else ''
    system = any(line.replace(' ', '') == 'include-system-site-packages=true'
                 for line in text.lower().splitlines())
    summary = (f'{sys.prefix}, made from {sys.base_prefix} '
               f'{"with" if system else "without"} the system site packages')
    if ros_install(environ) is None:
        return Finding('venv', Level.INFO, summary)
    if not system:
        return Finding('venv', Level.WARN, f"{summary}: apt's python3-* packages and "
                       "JetPack's TensorRT bindings are not importable",
                       f'make it again: python3 -m venv --system-site-packages {sys.prefix}')
    if not (Path(sys.prefix) / 'COLCON_IGNORE').exists():
        return Finding('venv', Level.WARN, f'{summary}, no COLCON_IGNORE in it: colcon build '
                       'descends into the venv', f'touch {sys.prefix}/COLCON_IGNORE')
    return Finding('venv', Level.OK, f'{summary}; COLCON_IGNORE in it')


def library_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Return where the middleware's shared libraries are looked for, in order."""
    dirs = [Path(p) / 'lib' for p in environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep)
            if p]
    dirs += [Path(sys.prefix) / 'lib']
    dirs += [Path(p) for p in environ.get('LD_LIBRARY_PATH', '').split(os.pathsep) if p]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def find_library(stems: Iterable[str], dirs: Iterable[Path]) -> Path | None:
    """Return the first ``<stem>.so*`` found in ``dirs`` (in order), or None."""
    for d in dirs:
        for stem in stems:
            found = sorted(d.glob(f'{stem}.so*'))
            if found:
                return found[0]
    return None


def check_dds_security(environ: Mapping[str, str] = os.environ) -> Finding:
    """Return whether the middleware has DDS security plugins (and whether security is on)."""
    from oxygen_ros.ros.security import ENABLE_VAR, NO_PLUGINS_MARKER
    rmw = environ.get('RMW_IMPLEMENTATION', '') or FAST_DDS_RMWS[0]
    dirs = library_dirs(environ)
    enabled = environ.get(ENABLE_VAR) == 'true'
    present, where = None, 'not checked (rmw_fastrtps_cpp and rmw_cyclonedds_cpp are)'
    if rmw in FAST_DDS_RMWS:
        lib = find_library(['librmw_fastrtps_shared_cpp'], dirs)
        dds = find_library(['libfastdds', 'libfastrtps'], dirs)
        if lib is None:
            where = f'librmw_fastrtps_shared_cpp not found in {", ".join(map(str, dirs))}'
        else:
            present = NO_PLUGINS_MARKER.encode() not in lib.read_bytes() and \
                (dds is None or b'builtin.PKI-DH' in dds.read_bytes())
            where = str(lib) + (f', {dds.name}' if dds else '')
    elif rmw == 'rmw_cyclonedds_cpp':
        lib = find_library(['libdds_security_auth'], dirs)
        present, where = lib is not None, str(lib or 'no libdds_security_auth')
    if present is None:
        return Finding('dds security', Level.INFO, f'{rmw}: {where}')
    if present:
        return Finding('dds security', Level.OK, f'{rmw} has the security plugins ({where}); '
                       f'{ENABLE_VAR}={"true" if enabled else "unset: off"}')
    summary = (f'{rmw} has no DDS security plugins ({where}): the node cannot run in an '
               'SROS2 enclave')
    fix = ('install ROS 2 from the official packages (apt install ros-jazzy-ros-base: Fast DDS '
           'built with -DSECURITY=ON); docs/security.md')
    if enabled:
        return Finding('dds security', Level.ERROR, f'{summary}, and {ENABLE_VAR}=true: it '
                       'refuses to start', fix)
    return Finding('dds security', Level.WARN, f'{summary}: anyone on the DDS domain can '
                   'command the arm', fix)


__all__ = ['check_dds_security', 'check_ros', 'check_venv', 'find_library', 'library_dirs',
           'ros_install', 'ros_wheels']
