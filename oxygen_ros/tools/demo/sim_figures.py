"""
The pictures of a simulated run: commanded vs achieved joint trajectories, and the video.

``plot_trajectories`` draws, for every command joint over a window of sim time, each chunk's
plan (its points as published, thin), the executor's command (what the servos were told), the
achieved joint position, and a vertical line at every chunk switch. ``write_video`` encodes the
base camera frames as h264 mp4 with imageio-ffmpeg (its bundled ffmpeg).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from oxygen_ros.tools.demo.sim_bag import SimRun
from oxygen_ros.units import NS_PER_S


def plot_trajectories(run: SimRun, path: Path, start_s: float, span_s: float,
                      title: str) -> None:
    """
    Write the trajectory figure (PNG).

    :param run: the recorded run.
    :param path: output file.
    :param start_s: window start, sim seconds.
    :param span_s: window length, sim seconds.
    :param title: figure title.
    """
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt

    lo, hi = round(start_s * NS_PER_S), round((start_s + span_s) * NS_PER_S)
    names = run.joint_names
    rows = (len(names) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 1.9 * rows), sharex=True, squeeze=False)
    switches = [int(e['switch_ns']) for e in run.executed()]
    cmd_in = (run.command_t >= lo) & (run.command_t <= hi)
    st_in = (run.state_t >= lo) & (run.state_t <= hi)
    for j, (name, ax) in enumerate(zip(names, axes.T.flat)):
        for chunk in run.chunks:
            keep = (chunk.times_ns >= lo) & (chunk.times_ns <= hi)
            if keep.any():
                ax.plot(chunk.times_ns[keep] / NS_PER_S, chunk.positions[keep, j], color='0.75',
                        lw=0.6, marker='.', ms=2, zorder=1)
        for t in switches:
            if lo <= t <= hi:
                ax.axvline(t / NS_PER_S, color='tab:orange', lw=0.5, alpha=0.5, zorder=0)
        ax.plot(run.command_t[cmd_in] / NS_PER_S, run.command_q[cmd_in, j], color='tab:blue',
                lw=1.2, label='commanded', zorder=3)
        ax.plot(run.state_t[st_in] / NS_PER_S, run.state_q[st_in, j], color='tab:green', lw=1.0,
                ls='--', label='achieved', zorder=2)
        unit = '' if name == 'gripper' else ' (rad)'
        ax.set_ylabel(f'{name}{unit}', fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.T.flat[len(names):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color='0.75', marker='.', lw=0.6, label='chunk plans'),
               plt.Line2D([], [], color='tab:blue', label='commanded'),
               plt.Line2D([], [], color='tab:green', ls='--', label='achieved'),
               plt.Line2D([], [], color='tab:orange', lw=0.8, label='chunk switch')]
    fig.legend(handles=handles, loc='lower center', ncol=4, fontsize=8, frameon=False)
    for ax in axes[-1]:
        ax.set_xlabel('sim time (s)', fontsize=8)
    fig.suptitle(title, fontsize=9, x=0.01, ha='left')
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_video(frames: Sequence[tuple[int, np.ndarray]], path: Path, fps: float) -> int:
    """
    Encode frames as an h264 mp4.

    :param frames: ``(stamp_ns, uint8 [h, w, 3])`` in time order.
    :param path: output ``.mp4``.
    :param fps: frames per second of the video (the camera rate plays it in sim time).
    :returns: the number of frames written.
    :raises ValueError: no frames.
    """
    import imageio.v2 as imageio

    if not frames:
        raise ValueError('no camera frames to encode')
    with imageio.get_writer(path, fps=fps, codec='libx264', quality=7,
                            macro_block_size=16, ffmpeg_log_level='error') as writer:
        for _, frame in frames:
            writer.append_data(frame)
    return len(frames)


def save_frame(frames: Sequence[tuple[int, np.ndarray]], path: Path, at: float = 0.5) -> None:
    """Write the frame at fraction ``at`` of the run as PNG."""
    import imageio.v2 as imageio

    imageio.imwrite(path, frames[min(int(at * len(frames)), len(frames) - 1)][1])


__all__ = ['plot_trajectories', 'save_frame', 'write_video']
