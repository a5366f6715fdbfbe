"""
Compressed camera images: ``sensor_msgs/CompressedImage`` in image_transport's convention.

A camera publishing through image_transport's ``compressed`` plugin sends JPEG or PNG files on
``<image topic>/compressed`` with ``format`` = ``"<raw encoding>; <codec> compressed <what the
codec got>"``, e.g. ``"rgb8; jpeg compressed bgr8"`` or ``"mono8; png compressed "``
(image_transport_plugins, ``compressed_publisher.cpp``). Older drivers write just ``"jpeg"`` or
``"png"``. The data is an ordinary JPEG/PNG file, so its colours are real whatever channel order
the publisher's OpenCV matrix had: it decodes straight to RGB.

Decoders (chosen with ``oxygen_bench image_decode``, docs/running.md): JPEG with
simplejpeg (libjpeg-turbo inside the wheel) in strict mode, so libjpeg's "corrupt data" and
"premature end" warnings raise (Pillow and OpenCV decode such frames to wrong pixels; the bench
counts how many one-byte corruptions each refuses). PNG with Pillow (zlib, chunk CRCs
checked). Both read the header first, so the size is checked before a pixel is decoded (a
100000 px wide header is refused, not allocated).

Pure functions, no node: the node decodes in the control cycle, for the newest message only
(``transport.camera_image_to_rgb``).
"""

from __future__ import annotations

import enum
import io

from builtin_interfaces.msg import Time
import numpy as np
from oxygen_ros.ros.images.raw import Encoding, ImageConversionError, MAX_IMAGE_SIDE
from oxygen_ros.ros.stamps import as_stamp
from sensor_msgs.msg import CompressedImage
from std_msgs.msg import Header

JPEG_QUALITY = 90
"""Default JPEG quality of ``rgb_to_compressed`` (image_transport's default is 95)."""
_PNG_LEVEL = 3
"""zlib level of ``rgb_to_compressed``'s PNG (image_transport's ``png_level`` default, 3)."""
_PNG_TRAILER = b'IEND\xaeB`\x82'
"""The last 8 bytes of every complete PNG file: the IEND chunk type and its CRC."""
_JPEG_EOI = b'\xff\xd9'
_JPEG_TAIL = 1024
"""A JPEG's end-of-image marker must lie in its last this many bytes (some UVC cameras pad
frames after it; 0xFFD9 cannot occur inside entropy-coded data, where 0xFF is stuffed)."""
_ACCEPTED_MODES = frozenset({'1', 'L', 'LA', 'P', 'PA', 'RGB', 'RGBA'})
"""Pillow modes of 8-bit PNGs (16-bit modes are depth images: refused)."""


class Codec(str, enum.Enum):
    """Image file formats of the ``compressed`` transport."""

    JPEG = 'jpeg'
    PNG = 'png'

    @property
    def signature(self) -> bytes:
        """Return the bytes every file of this format starts with."""
        return b'\xff\xd8\xff' if self is Codec.JPEG else b'\x89PNG\r\n\x1a\n'


class CompressedImageError(ImageConversionError):
    """A ``CompressedImage`` that cannot be decoded into RGB (the message says why)."""


def codec_of_format(fmt: str) -> Codec | None:
    """
    Return the codec a ``CompressedImage.format`` names, None if it names none (empty).

    Accepts image_transport's ``"rgb8; jpeg compressed bgr8"`` form and the bare ``"jpeg"``,
    ``"jpg"``, ``"png"`` of older drivers (case-insensitive).

    :raises CompressedImageError: a ``compressedDepth`` format (depth images) or another codec.
    """
    text = fmt.strip()
    if not text:
        return None
    if 'compresseddepth' in text.lower():
        raise CompressedImageError(
            f'format {fmt!r} is compressedDepth (a depth image), not a camera image')
    words = text.split(';', 1)[-1].split()
    name = words[0].lower() if words else ''
    name = 'jpeg' if name == 'jpg' else name
    try:
        return Codec(name)
    except ValueError:
        raise CompressedImageError(
            f"unsupported compressed format {fmt!r}; supported: 'jpeg', 'png' "
            f"(image_transport's '<encoding>; jpeg compressed bgr8' form or bare)") from None


def _sniff(data: bytes | memoryview) -> Codec | None:
    head = bytes(data[:8])
    return next((c for c in Codec if head.startswith(c.signature)), None)


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """
    Decode a JPEG or PNG ``sensor_msgs/CompressedImage`` into an RGB array.

    Grey, palette, alpha and CMYK images become RGB (alpha dropped). The codec comes from
    ``format`` (see ``codec_of_format``) and must match the data's signature; an empty format
    is decided by the signature alone.

    :param msg: the message.
    :returns: ``uint8 [height, width, 3]`` RGB, read-only, a new array.
    :raises CompressedImageError: empty data, an unsupported or lying format, a size of zero
        or over ``MAX_IMAGE_SIDE`` px (checked from the header, before decoding), a truncated
        file (no PNG IEND chunk at the end, no JPEG end-of-image marker near the end, or data
        missing before them) or a corrupt one (what the decoders detect: PNG chunk CRCs and
        zlib streams; libjpeg's corrupt-data warnings for JPEG, which has no checksum, so a
        few flipped bits still decode to wrong pixels), a 16-bit image.
    """
    data = memoryview(msg.data).cast('B')
    if data.nbytes == 0:
        raise CompressedImageError(f'empty compressed image (format {msg.format!r})')
    named, found = codec_of_format(msg.format), _sniff(data)
    if found is None:
        raise CompressedImageError(
            f'data ({data.nbytes} bytes, starting {bytes(data[:4]).hex()}) is neither JPEG nor '
            f'PNG (format {msg.format!r})')
    if named is not None and named is not found:
        raise CompressedImageError(f'format {msg.format!r} says {named.value} but the data is '
                                   f'{found.value}')
    if found is Codec.PNG and bytes(data[-len(_PNG_TRAILER):]) != _PNG_TRAILER:
        raise CompressedImageError(f'png of {data.nbytes} bytes does not end with its IEND '
                                   f'chunk: truncated')
    if found is Codec.JPEG and _JPEG_EOI not in bytes(data[-_JPEG_TAIL:]):
        raise CompressedImageError(f'jpeg of {data.nbytes} bytes has no end-of-image marker: '
                                   f'truncated')
    try:
        rgb = _decode_jpeg(data) if found is Codec.JPEG else _decode_png(data)
    except CompressedImageError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, RuntimeError) as exc:
        raise CompressedImageError(
            f'corrupt or truncated {found.value} ({data.nbytes} bytes): {exc}') from None
    rgb.flags.writeable = False
    return rgb


def _check_size(codec: Codec, width: int, height: int) -> None:
    if not (0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE):
        raise CompressedImageError(f'{codec.value} image {width}x{height} (width x height) not '
                                   f'within 1..{MAX_IMAGE_SIDE} px')


def _decode_jpeg(data: memoryview) -> np.ndarray:
    """Decode with libjpeg-turbo (simplejpeg), strict: its warnings (corrupt data) raise."""
    import simplejpeg  # not at import time
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    _check_size(Codec.JPEG, width, height)
    rgb = simplejpeg.decode_jpeg(data, colorspace='RGB', strict=True)
    if rgb.shape != (height, width, 3):  # a decoder returning less than its header said
        raise CompressedImageError(f'jpeg decoded to shape {rgb.shape}, header said '
                                   f'{width}x{height}')
    return rgb


def _decode_png(data: memoryview) -> np.ndarray:
    """Decode with Pillow (zlib; chunk CRCs checked), the size read from the header first."""
    from PIL import Image as PilImage  # slow to import: on first use, not at import time
    try:
        with PilImage.open(io.BytesIO(data), formats=['PNG']) as img:
            _check_size(Codec.PNG, *img.size)
            if img.mode not in _ACCEPTED_MODES:
                raise CompressedImageError(f'png image of mode {img.mode!r} (16-bit or float) '
                                           f'is not an 8-bit camera image')
            img.load()
            rgb = np.asarray(img if img.mode == 'RGB' else img.convert('RGB'))
    except PilImage.DecompressionBombError as exc:
        raise CompressedImageError(str(exc)) from None
    if rgb.shape != (img.size[1], img.size[0], 3):
        raise CompressedImageError(f'png decoded to shape {rgb.shape}, header said '
                                   f'{img.size[0]}x{img.size[1]}')
    return rgb


def encode_rgb(arr: np.ndarray, codec: Codec | str,
               quality: int = JPEG_QUALITY) -> tuple[str, bytes]:
    """
    Encode an RGB array as image_transport's ``compressed`` plugin would.

    :param arr: ``uint8 [h, w, 3]`` RGB.
    :param codec: ``jpeg`` or ``png``.
    :param quality: JPEG quality 1..100 (ignored for PNG).
    :returns: ``(format, file bytes)``, format ``"rgb8; <codec> compressed bgr8"``.
    :raises ImageConversionError: wrong dtype or shape, a quality out of range.
    """
    codec = Codec(codec)
    arr = np.asarray(arr)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ImageConversionError(f'need a uint8 [h, w, 3] RGB array, got {arr.dtype} '
                                   f'{arr.shape}')
    if not 1 <= quality <= 100:
        raise ImageConversionError(f'JPEG quality must be in 1..100, got {quality}')
    from PIL import Image as PilImage
    out = io.BytesIO()
    img = PilImage.fromarray(np.ascontiguousarray(arr), mode='RGB')
    if codec is Codec.JPEG:
        img.save(out, format='JPEG', quality=quality)
    else:
        img.save(out, format='PNG', compress_level=_PNG_LEVEL)
    return f'{Encoding.RGB8.value}; {codec.value} compressed bgr8', out.getvalue()


def rgb_to_compressed(arr: np.ndarray, stamp: Time | int, frame_id: str, codec: Codec | str,
                      quality: int = JPEG_QUALITY) -> CompressedImage:
    """
    Return an RGB array as a ``sensor_msgs/CompressedImage`` (see ``encode_rgb``).

    :param stamp: ``header.stamp``: a ``builtin_interfaces/Time`` or integer nanoseconds.
    """
    fmt, data = encode_rgb(arr, codec, quality)
    return CompressedImage(header=Header(stamp=as_stamp(stamp), frame_id=frame_id),
                           format=fmt, data=data)


__all__ = ['Codec', 'CompressedImageError', 'JPEG_QUALITY', 'codec_of_format',
           'compressed_to_rgb', 'encode_rgb', 'rgb_to_compressed']
