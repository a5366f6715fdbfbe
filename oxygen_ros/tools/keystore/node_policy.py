"""
The node's endpoints and grants for the node arguments ``create`` and ``permissions`` share.

The node is described as it is started: ``--preset P`` (the launch file's
``config/<P>.yaml``) and then the node's own ``--ros-args`` (``-r`` remappings and ``__ns``,
``--params-file``, ``-p``), so the permissions name the endpoints of exactly that node.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

from oxygen_ros.resources import config_file
from oxygen_ros.ros.endpoints import node_endpoints, NODE_NAME
from oxygen_ros.ros.node_config import build_configs, declared_spec, NodeConfig
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.tools.keystore.names import RosNameError, validate_namespace
from oxygen_ros.tools.keystore.node_args import (
    NodeArgs, NodeArgsError, parse_ros_args, ROS_ARGS)
from oxygen_ros.tools.keystore.policy import (
    DEFAULT_ENCLAVE_ROOT, Grant, grants, resolve_endpoints, ResolvedEndpoint, Role)

NODE_ARGS_HELP = (f'the node as it is started: --preset, then {ROS_ARGS} with its remappings '
                  '(-r from:=to, -r __ns:=/ns), --params-file and -p name:=value, as given to '
                  'oxygen_node (or passed by the launch file)')


class PolicyError(ValueError):
    """The node arguments describe a node that cannot start (the message says why)."""


@dataclass(frozen=True, slots=True)
class NodePolicy:
    """The node's resolved endpoints and every role's grant."""

    node_args: NodeArgs
    config: NodeConfig
    use_sim_time: bool
    endpoints: tuple[ResolvedEndpoint, ...]
    grants: dict[Role, Grant]


def split_ros_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Return ``(the tool's own arguments, --ros-args ... to the end)``."""
    argv = list(argv)
    if ROS_ARGS in argv:
        i = argv.index(ROS_ARGS)
        return argv[:i], argv[i:]
    return argv, []


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--preset``, ``--node-name`` and ``--enclave-root``."""
    parser.add_argument('--preset', default=None,
                        help="load the launch file's params file config/<PRESET>.yaml before "
                             f'the {ROS_ARGS} ones (launch: preset:=PRESET)')
    parser.add_argument('--node-name', default=NODE_NAME,
                        help=f'the node name in the code (default {NODE_NAME}; -r __node:= '
                             'renames it)')
    parser.add_argument('--enclave-root', default=DEFAULT_ENCLAVE_ROOT,
                        help=f'enclaves are ROOT/<role> (default {DEFAULT_ENCLAVE_ROOT})')


def node_policy(args: argparse.Namespace, ros_args: Sequence[str]) -> NodePolicy:
    """
    Return the endpoints and grants of the node ``args`` and ``ros_args`` describe.

    :param args: ``preset``, ``node_name`` and ``enclave_root`` (``add_node_arguments``).
    :raises PolicyError: see ``policy_for``.
    """
    return policy_for(args.preset, ros_args, args.node_name, args.enclave_root)


def policy_for(preset: str | None, ros_args: Sequence[str], node_name: str = NODE_NAME,
               enclave_root: str = DEFAULT_ENCLAVE_ROOT) -> NodePolicy:
    """
    Return the endpoints and grants of the node started with ``preset`` and ``ros_args``.

    :param preset: the params file ``config/<preset>.yaml`` given before ``ros_args`` (None:
        none).
    :param ros_args: the node's ``--ros-args ...`` (remappings, params files, ``-p``).
    :raises PolicyError: unreadable arguments or params files, a parameter value the node
        would refuse, a name or remapping rcl would refuse, an unknown preset, a bad
        ``enclave_root``.
    """
    try:
        preset_args: list[str] = []
        if preset:
            preset_args = [ROS_ARGS, '--params-file', str(config_file(preset)), '--']
        node_args = parse_ros_args([*preset_args, *ros_args], node_name)
        values = node_args.parameters()
        _, config = build_configs({k: v for k, v in values.items()
                                   if declared_spec(k) is not None})  # robots' too
        use_sim_time = bool(values.get('use_sim_time', False))
        endpoints = resolve_endpoints(node_endpoints(config, use_sim_time=use_sim_time),
                                      node_args.names)
        try:
            validate_namespace(enclave_root)  # enclave names are namespaces (rcl, sros2)
        except RosNameError:
            raise PolicyError(f'--enclave-root {enclave_root!r} must be an absolute path of '
                              f'ROS name tokens like {DEFAULT_ENCLAVE_ROOT}') from None
        return NodePolicy(node_args, config, use_sim_time, endpoints,
                          grants(endpoints, enclave_root))
    except (FileNotFoundError, NodeArgsError, ParameterError, RosNameError) as exc:
        raise PolicyError(str(exc)) from None


__all__ = ['NODE_ARGS_HELP', 'NodePolicy', 'PolicyError', 'add_node_arguments', 'node_policy',
           'policy_for', 'split_ros_args']
