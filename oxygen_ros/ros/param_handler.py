"""
The node's parameters while it runs: declared from the table, checked before a set, applied after.

As Nav2's ``nav2_controller::ParameterHandler`` (``parameter_handler.hpp``): one object holds
the node's parameters, a validate callback runs before rclpy sets any
(``add_on_set_parameters_callback``: refuse with a reason; parameters set together are checked
as one, ``node_config.check_updates``) and an update callback after
(``add_post_set_parameters_callback``: the new values take effect). What a change does is the
parameter's ``on_change`` in the declaration (``params.PARAMETERS``); the node hands over one
function per kind of change, so no parameter name is tested anywhere else.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from oxygen_ros.engine import EngineConfig
from oxygen_ros.parameters import OnChange
from oxygen_ros.ros.node_config import build_configs, check_updates, declared_spec, NodeConfig
from oxygen_ros.ros.params import declare_parameters, parameter_values
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter


class ParameterHandler:
    """
    Declares the node's parameters and handles their changes.

    :param node: the node; every parameter of ``PARAMETERS`` is declared on it now.
    :param apply: for every ``OnChange`` but ``NEXT_CYCLE``, the node's function that makes a
        new value take effect (called after ``config`` was updated, with the new value; a
        robot's parameter, ``r1.instruction``, with ``robot=`` its name too).
    :raises ValueError: ``apply`` lacks a kind of change.
    :raises rclpy.exceptions.InvalidParameterTypeException: an override of the wrong type;
        ``InvalidParameterValueException``: one out of range.
    """

    def __init__(self, node: Node,
                 apply: Mapping[OnChange, Callable[[object], None]]) -> None:
        missing = set(OnChange) - {OnChange.NEXT_CYCLE} - set(apply)
        if missing:
            raise ValueError(f'no function applies {sorted(c.value for c in missing)}')
        declare_parameters(node)
        self._node = node
        self._apply = dict(apply)
        self.config: NodeConfig | None = None
        """The node's config: set by the node once a configure succeeded, updated here."""
        node.add_on_set_parameters_callback(self._validate)
        node.add_post_set_parameters_callback(self._update)

    def configs(self) -> tuple[EngineConfig, NodeConfig]:
        """
        Return the configs the node's parameter values build (``build_configs``).

        :raises ParameterError: a value the node cannot use.
        """
        return build_configs(parameter_values(self._node))

    def _validate(self, params: Sequence[Parameter]) -> SetParametersResult:
        reason = check_updates(self.config, [(p.name, p.value) for p in params])
        return SetParametersResult(successful=not reason, reason=reason or '')

    def _update(self, params: Sequence[Parameter]) -> None:
        ours = [(spec, p.value) for p in params
                for spec in [declared_spec(p.name)] if spec is not None and not spec.read_only]
        if self.config is not None:
            config = self.config
            for spec, value in ours:  # checked together before (``_validate``)
                config = config.updated(spec.name, value, check=False)
            self.config = config
        for spec, value in ours:
            if spec.on_change is OnChange.NEXT_CYCLE:
                continue
            if spec.map_of:
                self._apply[spec.on_change](value, robot=spec.name[:-len(spec.key) - 1])
            else:
                self._apply[spec.on_change](value)


__all__ = ['ParameterHandler']
