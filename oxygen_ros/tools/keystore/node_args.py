"""
The ROS arguments the ``oxygen`` node is started with, read as rcl reads them.

``oxygen_keystore`` takes the same ``--ros-args`` as the node (``-r``, ``--params-file``,
``-p``; what the launch file passes), so its permissions name the node's endpoints under the
names the running node will have. Parameter files are matched to the node's fully qualified
name as rcl matches them: a key is a node name or a pattern (``/**`` any namespace, ``*`` one
token), with or without a leading ``/``, at the top level or nested under namespace keys; files
apply in order, each in file order, then the ``-p`` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import re
from typing import Iterable, Mapping, Sequence

from oxygen_ros.tools.keystore.names import NodeNames, RemapRule, RosNameError
import yaml

ROS_ARGS = '--ros-args'
_END = '--'
_WITH_VALUE_IGNORED = frozenset({'-e', '--enclave', '--log-level', '--log-file-name',
                                 '--log-config-file'})
"""ROS arguments that take a value and do not change the node's names or parameters."""
_FLAGS_IGNORED = frozenset({f'--{state}-{what}-logs' for state in ('enable', 'disable')
                            for what in ('rosout', 'stdout', 'external-lib')})
PARAMS_KEY = 'ros__parameters'


class NodeArgsError(ValueError):
    """ROS arguments or a parameter file that cannot be read (the message names it)."""


@dataclass(frozen=True, slots=True)
class NodeArgs:
    """
    What the node's ROS arguments say about its names and parameters.

    :ivar names: name, namespace and remapping rules.
    :ivar params_files: in command-line order.
    :ivar overrides: ``-p name:=value`` in order (values parsed as YAML, as rcl does).
    """

    names: NodeNames
    params_files: tuple[Path, ...] = ()
    overrides: tuple[tuple[str, object], ...] = ()

    def parameters(self) -> dict[str, object]:
        """
        Return the node's parameter values from its files and overrides.

        :raises NodeArgsError: an unreadable file or one that is not a ROS parameter file.
        """
        fqn = self.names.fully_qualified_name
        values: dict[str, object] = {}
        for path in self.params_files:
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise NodeArgsError(f'cannot read the params file {path}: {exc}') from None
            if not isinstance(data, dict):
                raise NodeArgsError(f'{path} is not a ROS parameter file (no mapping at the top)')
            for key, params in _node_entries(data, ''):
                if _key_matches(key, fqn):
                    values.update(_flatten(params))
        values.update(self.overrides)
        return values


def parse_ros_args(args: Sequence[str], node_name: str, namespace: str = '/') -> NodeArgs:
    """
    Read ``--ros-args ... [--]`` sections of ``args`` (everything else is ignored).

    :param node_name: the name the code gives the node (``oxygen``).
    :raises NodeArgsError: an unknown ROS argument, one without its value, a bad remapping
        rule or ``-p`` without ``:=``.
    """
    rules: list[RemapRule] = []
    files: list[Path] = []
    overrides: list[tuple[str, object]] = []
    inside = False
    it = iter(args)
    for arg in it:
        if arg == ROS_ARGS:
            inside = True
            continue
        if not inside:
            continue
        if arg == _END:
            inside = False
        elif arg in ('-r', '--remap'):
            try:
                rules.append(RemapRule.parse(_value(it, arg)))
            except RosNameError as exc:
                raise NodeArgsError(str(exc)) from None
        elif arg == '--params-file':
            files.append(Path(_value(it, arg)))
        elif arg in ('-p', '--param'):
            text = _value(it, arg)
            name, sep, value = text.partition(':=')
            if not sep or not name:
                raise NodeArgsError(f'{arg} {text!r} is not name:=value')
            overrides.append((name, yaml.safe_load(value)))
        elif arg in _WITH_VALUE_IGNORED:
            _value(it, arg)
        elif arg not in _FLAGS_IGNORED:
            raise NodeArgsError(f'unknown ROS argument {arg!r} (this tool reads -r, '
                                '--params-file and -p)')
    try:
        names = NodeNames(node_name, namespace, tuple(rules))
        names.fully_qualified_name  # noqa: B018 (validates __ns / __node rules)
    except RosNameError as exc:
        raise NodeArgsError(str(exc)) from None
    return NodeArgs(names, tuple(files), tuple(overrides))


def _value(it: Iterable[str], flag: str) -> str:
    value = next(iter(it), None)
    if value is None:
        raise NodeArgsError(f'{flag} needs a value')
    return value


def _node_entries(data: Mapping, prefix: str) -> Iterable[tuple[str, Mapping]]:
    """Yield ``(node key, parameters)`` of a parameter file, nested namespaces joined."""
    for key, value in data.items():
        if not isinstance(value, dict):
            continue
        key = f'{prefix}/{str(key).strip("/")}'
        if PARAMS_KEY in value:
            if isinstance(value[PARAMS_KEY], dict):
                yield key, value[PARAMS_KEY]
        else:
            yield from _node_entries(value, key)


def _key_matches(key: str, fqn: str) -> bool:
    """Return whether a parameter-file node key (``/**``, ``/ns/*``, ``oxygen``) names ``fqn``."""
    if not key.startswith('/'):
        key = '/' + key
    pattern = ''.join('.*' if part == '**' else '[^/]*' if part == '*' else re.escape(part)
                      for part in re.split(r'(\*\*|\*)', key))
    if re.fullmatch(pattern, fqn):
        return True
    # '/**/oxygen' also names '/oxygen' ('/**' stands for any namespace, the root too)
    return key.startswith('/**/') and \
        re.fullmatch(pattern.replace('.*/', '(.*/)?', 1), fqn) is not None


def _flatten(params: Mapping, prefix: str = '') -> dict[str, object]:
    """Return nested parameter mappings as dotted names (``image_transport.base_0_rgb``)."""
    out = {}
    for name, value in params.items():
        full = f'{prefix}{name}'
        if isinstance(value, dict):
            out.update(_flatten(value, full + '.'))
        else:
            out[full] = value
    return out


__all__ = ['NodeArgs', 'NodeArgsError', 'ROS_ARGS', 'parse_ros_args']
