"""
``oxygen_doctor``'s shared-memory check: can a camera's image pass through Fast DDS's segment.

Fast DDS delivers a sample between processes of one host through the publisher's
shared-memory segment, 512 KiB unless a profile says otherwise (``SharedMemTransport::init``,
``shm_default_segment_size``; a message may not exceed the segment). A 640×480 rgb8 image
(921,600 bytes) does not fit: it falls back to fragmented UDP and, best effort, most frames are
lost (docs/running.md#install-and-launch). Jazzy's Fast DDS reads its XML profile from
``FASTRTPS_DEFAULT_PROFILES_FILE`` (newer releases: ``FASTDDS_DEFAULT_PROFILES_FILE``); the
camera drivers' environment is what counts, which is the shell the doctor runs in when they
are started from it.
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from pathlib import Path
import re
from typing import Mapping, Sequence
import xml.etree.ElementTree as ET

from oxygen_ros.tools.doctor.findings import Finding, Level

DEFAULT_SEGMENT = 512 * 1024
"""Fast DDS's default shared-memory segment, bytes."""
PROFILE_VARS = ('FASTRTPS_DEFAULT_PROFILES_FILE', 'FASTDDS_DEFAULT_PROFILES_FILE')
BYTES_PER_PIXEL = {'rgb8': 3, 'bgr8': 3, 'rgba8': 4, 'bgra8': 4, 'mono8': 1, 'mono16': 2,
                   '16uc1': 2, '8uc1': 1, '8uc3': 3}
LARGE_SHM_PROFILE = 'config/fastdds_large_shm.xml'


@dataclass(frozen=True, slots=True)
class CameraSize:
    """A camera's image: width and height (pixels) and ROS encoding."""

    width: int
    height: int
    encoding: str = 'rgb8'

    @classmethod
    def parse(cls, text: str) -> CameraSize:
        """
        Parse ``WxH`` or ``WxH:encoding`` (``640x480``, ``1280x720:bgr8``).

        :raises ValueError: another form or an encoding of unknown size.
        """
        m = re.fullmatch(r'(\d+)x(\d+)(?::(\w+))?', text.strip().lower())
        if m is None or (m[3] or 'rgb8') not in BYTES_PER_PIXEL:
            raise ValueError(f'camera size {text!r}: give WxH or WxH:encoding, the encoding '
                             f'one of {", ".join(BYTES_PER_PIXEL)}')
        return cls(int(m[1]), int(m[2]), m[3] or 'rgb8')

    @property
    def nbytes(self) -> int:
        """Return the image data's size in bytes."""
        return self.width * self.height * BYTES_PER_PIXEL[self.encoding]

    def __str__(self) -> str:
        return f'{self.width}x{self.height} {self.encoding}'


def shm_limit(environ: Mapping[str, str]) -> tuple[int, str]:
    """
    Return the largest message the publisher's segment holds, bytes, and where it comes from.

    The profile's ``SHM`` transport descriptor: its ``segment_size`` bounded by its
    ``maxMessageSize``, which is 512 KiB unless given (``SharedMemTransportDescriptor()`` sets it
    to the default segment); the default segment without a profile or an SHM descriptor.

    :raises ValueError: a profile file that is not readable XML.
    """
    var = next((v for v in PROFILE_VARS if environ.get(v)), None)
    if var is None:
        return DEFAULT_SEGMENT, f'the default: {" and ".join(PROFILE_VARS)} unset'
    path = Path(environ[var])
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f'{var}={path}: {exc}') from None
    for desc in root.iter():
        if desc.tag.rsplit('}', 1)[-1] != 'transport_descriptor':
            continue
        fields = {c.tag.rsplit('}', 1)[-1]: (c.text or '').strip() for c in desc}
        if fields.get('type', '').upper() != 'SHM':
            continue
        segment = int(fields.get('segment_size') or DEFAULT_SEGMENT)
        limit = min(segment, int(fields.get('maxMessageSize') or DEFAULT_SEGMENT))
        return limit, f'{var}={path}'
    return DEFAULT_SEGMENT, f'the default: {var}={path} has no SHM transport'


def check_shared_memory(cameras: Sequence[str], compressed: Sequence[str], size: CameraSize,
                        environ: Mapping[str, str] = os.environ) -> Finding:
    """Return whether the cameras' raw images fit the shared-memory segment of this shell."""
    raw = [c for c in cameras if c not in compressed]
    try:
        limit, origin = shm_limit(environ)
    except ValueError as exc:
        return Finding('shared memory', Level.WARN, str(exc), 'fix the profile file')
    segment = f"{limit:,} B, the largest message Fast DDS's shared-memory segment takes ({origin})"
    if not raw:
        return Finding('shared memory', Level.OK, f'every camera is compressed (JPEG frames of '
                       f'tens of KB); {segment}')
    image = f'one {size} image is {size.nbytes:,} B'
    if size.nbytes <= limit:
        return Finding('shared memory', Level.OK, f'{image}, within {segment}')
    return Finding('shared memory', Level.WARN, f'{image}, more than {segment}: best-effort '
                   f'publishers of the raw cameras ({", ".join(raw)}) on this host lose most '
                   'frames',
                   'start the camera drivers with FASTRTPS_DEFAULT_PROFILES_FILE=$(ros2 pkg '
                   f'prefix oxygen_ros)/share/oxygen_ros/{LARGE_SHM_PROFILE} (32 MiB segment, '
                   '4 MiB messages), or image_transport.<slot>:=compressed')


__all__ = ['CameraSize', 'DEFAULT_SEGMENT', 'check_shared_memory', 'shm_limit']
