"""
Child processes of the tools (the node, bag replay and record) on a private ROS domain.

With DDS security (``secure_environment``) each child runs in the enclave of its role
(docs/security.md): the node in ``/oxygen_ros/oxygen``, the recorder as an observer, the bag
replay as the robot's drivers; the tool's own node is the operator.
"""

from __future__ import annotations

import os
from pathlib import Path
import random
import signal
import subprocess
import sys
from typing import Sequence

from oxygen_ros.ros.security import (
    ENABLE_VAR, ENFORCE, KEYSTORE_VAR, SecuritySettings, STRATEGY_VAR)
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC
from oxygen_ros.tools.keystore.coverage import keystore_problem
from oxygen_ros.tools.keystore.keystore import keystore_domain_id
from oxygen_ros.tools.keystore.node_policy import PolicyError
from oxygen_ros.tools.keystore.policy import Role

_DOMAIN_IDS = tuple(range(1, 102))  # clear of the ephemeral port range (ROS 2 docs)


class Child:
    """A ROS tool run as ``python -m module``, output in a log file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f'{name}.log'
        with open(self.log_path, 'wb') as log:
            self.popen = subprocess.Popen([sys.executable, '-m', *args], stdout=log,
                                          stderr=subprocess.STDOUT)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGINT, then SIGKILL after ``timeout_s``; return the exit status."""
        if self.alive:
            self.popen.send_signal(signal.SIGINT)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def tail(self, lines: int = 15) -> str:
        return '\n'.join(self.log_path.read_text(errors='replace').splitlines()[-lines:])


def stop_children(children: Sequence[Child], tool: str = '') -> bool:
    """
    Stop ``children`` last first; print the log tail of each that exited non-zero.

    :param tool: prefix of those messages (``'oxygen_stress flood: '``).
    :returns: True when every one exited with status 0.
    """
    ok = True
    for child in reversed(children):
        code = child.stop()
        if code != 0:
            ok = False
            print(f'{tool}{child.name} exited with {code}:\n{child.tail()}', file=sys.stderr)
    return ok


def ros_environment(domain_id: int | None) -> int:
    """Set this process's (and its children's) ROS domain; return it."""
    if domain_id is None:
        domain_id = random.SystemRandom().choice(_DOMAIN_IDS)
    os.environ['ROS_DOMAIN_ID'] = str(domain_id)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    os.environ['PYTHONUNBUFFERED'] = '1'
    return domain_id


def replay_args(bag: Path, cameras: Sequence[str] = ('base_0_rgb', 'left_wrist_0_rgb'), *,
                instruction: bool = True) -> list[str]:
    """
    Return ``oxygen_bag replay`` arguments: loop the node's input topics of ``bag``.

    :param instruction: replay ``/oxygen/instruction`` too (not as the robot's enclave,
        which may not publish it).
    """
    return ['oxygen_ros.tools.bag.replay', str(bag), '--loop', '--wait-for-subscribers', '20',
            '--topics', *(CAMERA_TOPICS[c] for c in cameras), JOINT_STATES_TOPIC,
            *([INSTRUCTION_TOPIC] if instruction else [])]


DEMO_ROLES = {'demo': Role.OPERATOR, 'node': Role.NODE, 'record': Role.OBSERVER,
              'replay': Role.ROBOT}
"""The role of each process of ``oxygen_demo --keystore``."""
DEMO_ENCLAVES = {process: role.enclave() for process, role in DEMO_ROLES.items()}
"""The enclave of each process of ``oxygen_demo --keystore`` (``/oxygen_ros/<role>``)."""


def secure_environment(keystore: Path, domain_id: int | None, preset: str
                       ) -> tuple[int | None, str | None]:
    """
    Turn DDS security on (Enforce) for this process and its children.

    :param domain_id: the domain asked for (None: the keystore's).
    :param preset: the node's params file, ``config/<preset>.yaml`` (no remappings).
    :returns: ``(the domain to run on, None)``, or ``(None, why security would not hold)``: a
        keystore without governance or without one of ``DEMO_ENCLAVES``, made for another
        domain (its permissions hold on that domain only) or for another configuration of
        the node (``coverage.keystore_problem``: the missing grants named).
    """
    os.environ.update({ENABLE_VAR: 'true', STRATEGY_VAR: ENFORCE,
                       KEYSTORE_VAR: str(keystore.resolve())})
    for enclave in DEMO_ENCLAVES.values():
        problem = SecuritySettings.from_environment(
            ['--ros-args', '--enclave', enclave], os.environ).problem(enclave)
        if problem is not None:
            return None, problem
    own = keystore_domain_id(keystore)
    if own is None:
        return None, f'{keystore} has no readable enclaves/governance.xml: make it with ' \
                     f'oxygen_keystore create {keystore}'
    if domain_id is not None and domain_id != own:
        return None, (f'--domain-id {domain_id}, but the keystore {keystore} is for domain '
                      f'{own} (its permissions hold there only): leave --domain-id out or run '
                      f'oxygen_keystore create {keystore} --domain-id {domain_id}')
    try:
        problem = keystore_problem(keystore, preset, [],
                                   {role: role.enclave() for role in DEMO_ROLES.values()})
    except PolicyError as exc:
        problem = f'the node cannot start with --preset {preset}: {exc}'
    return (own, None) if problem is None else (None, problem)


def enclave_args(enclave: str | None) -> list[str]:
    """Return ``--ros-args --enclave ENCLAVE`` (nothing for None: security off)."""
    return ['--ros-args', '--enclave', enclave] if enclave else []
