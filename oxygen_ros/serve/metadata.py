"""
The metadata a client gets on connect: the policy, its layout, the language side, the limits.

openpi's server sends its policy's metadata first (``websocket_policy_server.py``); here it
names what a client needs to talk to this server without reading its docs: the preset, the
action horizon and dims in robot units, the observation keys, the text tasks and k, and
every bound (docs/serving.md#metadata).
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from oxygen_ros.engine import TextTask
from oxygen_ros.serve.language import MAX_PER_MESSAGE
from oxygen_ros.serve.layouts import Layout, observation_keys
from oxygen_ros.serve.limits import ServeLimits

if TYPE_CHECKING:
    from oxygen_ros.engine import Engine

PROTOCOL = 'openpi websocket policy (msgpack-numpy), OxyGen language_updates'


def server_metadata(engine: Engine, layout: Layout, limits: ServeLimits, *,
                    default_prompt: str | None, tls: bool, api_key: bool,
                    client_certs: bool) -> dict[str, Any]:
    """Return the metadata map (plain msgpack types only) sent first on every connection."""
    config, model, robot = engine.config, engine.model_cfg, engine.robot
    return {
        'server': 'oxygen_serve', 'protocol': PROTOCOL,
        'preset': model.name, 'layout': layout.value, 'checkpoint': config.checkpoint,
        'random_weights': config.checkpoint is None,
        'action_horizon': model.action_horizon, 'action_dim': robot.robot_action_dim,
        'action_space': robot.action_space.value, 'state_dim': robot.state_dim,
        'cameras': list(robot.cameras), 'observation_keys': observation_keys(layout, robot),
        'default_prompt': default_prompt, 'dtype': config.dtype, 'seed': config.seed,
        'language': {'tasks': [t.value for t in TextTask],
                     'tokens_per_frame': config.scheduler.tokens_per_cycle,
                     'decode_budget': engine.decode_budget,
                     'max_per_message': MAX_PER_MESSAGE},
        'security': {'tls': tls, 'api_key': api_key, 'client_certificates': client_certs},
        'limits': limits.as_metadata(),
    }


__all__ = ['PROTOCOL', 'server_metadata']
