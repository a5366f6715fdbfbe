"""
The client's side of ``oxygen_bench serve``: the openpi observation dicts it sends.

What a client does before anything reaches the server: the bundled photographs (a drifting
crop per frame) resized with pad to ``--image-size`` in uint8, as openpi's clients resize
them (``openpi_client/image_tools.py`` ``resize_with_pad``; the same geometry and filter as
``transforms.images.resize_with_pad``), the state and the prompt in the layout's keys, and a
question every ``--text-every`` frames. The benchmark itself drives the engines through their
public API only (``tools/bench/serve.py``).
"""

from __future__ import annotations

import numpy as np


def client_messages(layout, robot, frames: int, size: int, text_every: int) -> list[dict]:
    """Return the openpi observation dicts of every frame (what the client sends)."""
    from oxygen_ros.tools.common.workload import camera_image, DEFAULT_INSTRUCTION, joint_state
    from oxygen_ros.transforms.images import resize_with_pad

    out = []
    for f in range(frames):
        imgs = [resize_with_pad(camera_image(slot, f), size, size)
                for slot in ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')]
        state = joint_state(f, robot.state_dim).astype(np.float64)
        if layout.value == 'libero':
            msg = {'observation/image': imgs[0], 'observation/wrist_image': imgs[1],
                   'observation/state': state}
        elif layout.value == 'droid':
            msg = {'observation/exterior_image_1_left': imgs[0],
                   'observation/wrist_image_left': imgs[1],
                   'observation/joint_position': state[:7],
                   'observation/gripper_position': state[7:]}
        else:
            msg = {'images': {name: img.transpose(2, 0, 1) for name, img in zip(
                ('cam_high', 'cam_left_wrist', 'cam_right_wrist'), imgs)}, 'state': state}
        msg['prompt'] = DEFAULT_INSTRUCTION
        if text_every and f % text_every == 0:
            msg['language_requests'] = [{'task': 'answer', 'question': 'what is on the table?',
                                         'request_id': f'q{f}'}]
        out.append(msg)
    return out


__all__ = ['client_messages']
