"""
``oxygen_bench image_decode``: what a compressed camera costs the node per frame, and on the wire.

Encodes one 640x480 photograph (``skimage.data.coffee()`` resized) as JPEG (quality 90, as
``oxygen_bag make_demo --compressed jpeg``) and PNG (zlib level 3, image_transport's default)
and times ``compressed.compressed_to_rgb`` on it: the node's decode path (simplejpeg for JPEG,
Pillow for PNG), run in the control cycle for each compressed camera. For comparison, the same
bytes are decoded side by side, interleaved, by Pillow and, when installed, by OpenCV
(``opencv-python-headless``, not a requirement). Also prints the bytes per frame and the
bandwidth of one camera at 15 and 30 Hz, raw rgb8 against each codec, and how many one-byte
corruptions of the JPEG each decoder refuses (the others decode to wrong pixels).

Usage::

    oxygen_bench image_decode [--runs 200] [--width 640 --height 480] [--corrupt 180]
                        [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
from pathlib import Path
import platform
import statistics
import sys
import time
from typing import Callable, Sequence

import numpy as np
from oxygen_ros.ros.images.compressed import Codec, compressed_to_rgb, encode_rgb, JPEG_QUALITY
from oxygen_ros.tools.common.machine import cpu_name
from sensor_msgs.msg import CompressedImage


def test_frame(width: int, height: int) -> np.ndarray:
    """Return ``uint8 [height, width, 3]``: the coffee photograph resized (bicubic)."""
    from PIL import Image as PilImage
    from skimage import data
    img = PilImage.fromarray(data.coffee()).resize((width, height), PilImage.BICUBIC)
    return np.asarray(img)


def _pillow(data: bytes) -> np.ndarray:
    from PIL import Image as PilImage
    with PilImage.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert('RGB'))


def _opencv() -> Callable[[bytes], np.ndarray] | None:
    try:
        import cv2
    except ImportError:
        return None

    def decode(data: bytes) -> np.ndarray:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return decode


def time_decoders(decoders: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Return the median ms of each decoder, runs interleaved (one warm-up call each)."""
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for fn in decoders.values():
        fn()
    for _ in range(runs):
        for name, fn in decoders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def corruption_refusals(jpeg: bytes, decoders: dict[str, Callable[[bytes], object]],
                        positions: int) -> dict[str, int]:
    """
    Return, per decoder, how many of ``positions`` one-byte corruptions of a JPEG it refuses.

    Byte ``i`` (evenly spaced over the second half of the file: entropy-coded data, past the
    headers) is XORed with 0x5A; a decoder refuses if it raises.
    """
    refused = dict.fromkeys(decoders, 0)
    start = len(jpeg) // 2
    for k in range(positions):
        at = start + k * (len(jpeg) - 4 - start) // positions
        data = bytearray(jpeg)
        data[at] ^= 0x5A
        data = bytes(data)
        for name, decode in decoders.items():
            try:
                decode(data)
            except Exception:  # noqa: B902 (any refusal counts; OpenCV raises cv2.error)
                refused[name] += 1
    return refused


def run(width: int, height: int, runs: int, positions: int = 180) -> dict:
    """Measure; return a JSON-able dict (``rows``: one per codec)."""
    frame = test_frame(width, height)
    opencv = _opencv()
    rows = []
    for codec in Codec:
        fmt, data = encode_rgb(frame, codec)
        msg = CompressedImage(format=fmt, data=data)
        decoders = {'oxygen_ros': lambda msg=msg: compressed_to_rgb(msg),
                    'Pillow': lambda data=data: _pillow(data)}
        if opencv is not None:
            decoders['OpenCV'] = lambda data=data: opencv(data)
        ms = time_decoders(decoders, runs if codec is Codec.JPEG else max(runs // 4, 10))
        rows.append({'codec': codec.value, 'bytes': len(data), 'ms': ms,
                     'decoder': 'simplejpeg' if codec is Codec.JPEG else 'Pillow'})
        if codec is Codec.JPEG:
            by_bytes = {'oxygen_ros': lambda b: compressed_to_rgb(CompressedImage(
                format=fmt, data=b)), 'Pillow': _pillow}
            if opencv is not None:
                by_bytes['OpenCV'] = opencv
            corrupted = {'positions': positions,
                         'refused': corruption_refusals(data, by_bytes, positions)}
    import PIL
    import simplejpeg
    versions = {'simplejpeg': simplejpeg.__version__, 'Pillow': PIL.__version__}
    if opencv is not None:
        import cv2
        versions['OpenCV'] = cv2.__version__
    return {'date': f'{datetime.datetime.now():%Y-%m-%d %H:%M}', 'host': platform.node(),
            'cpu': cpu_name(), 'width': width, 'height': height, 'runs': runs,
            'raw_bytes': frame.nbytes, 'jpeg_quality': JPEG_QUALITY, 'versions': versions,
            'rows': rows, 'jpeg_corruption': corrupted}


def report(result: dict) -> str:
    """Return the printed table of ``run``'s result."""
    mbit = 8 / 1e6
    raw = result['raw_bytes']
    names = list(result['rows'][0]['ms'])
    lines = [f"decode_bench {result['date']}, {result['host']}, {result['cpu']}, "
             f"{result['width']}x{result['height']}, median of {result['runs']} runs (PNG: "
             f"a quarter), {', '.join(f'{k} {v}' for k, v in result['versions'].items())}",
             f"{'codec':<6}{'bytes':>9}{'ratio':>7}{'Mbit/s @15 Hz':>15}{'@30 Hz':>8}"
             + ''.join(f'{name + " ms":>15}' for name in names),
             f"{'raw':<6}{raw:>9}{1.0:>7.1f}{raw * 15 * mbit:>15.1f}{raw * 30 * mbit:>8.1f}"]
    for row in result['rows']:
        lines.append(
            f"{row['codec']:<6}{row['bytes']:>9}{raw / row['bytes']:>7.1f}"
            f"{row['bytes'] * 15 * mbit:>15.1f}{row['bytes'] * 30 * mbit:>8.1f}"
            + ''.join(f"{row['ms'][name]:>15.2f}" for name in names))
    lines.append("oxygen_ros = the node's path (JPEG: simplejpeg strict; PNG: Pillow), checks "
                 'included')
    bad = result['jpeg_corruption']
    lines.append(f"JPEG with one byte of its entropy-coded data changed ({bad['positions']} "
                 'positions), refused by: ' + ', '.join(
                     f'{name} {n}' for name, n in bad['refused'].items()))
    return '\n'.join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_bench image_decode',
                                     description=__doc__.split('\n\n')[0].strip())
    parser.add_argument('--runs', type=int, default=200, help='timed decodes per decoder')
    parser.add_argument('--width', type=int, default=640)
    parser.add_argument('--height', type=int, default=480)
    parser.add_argument('--corrupt', type=int, default=180, metavar='N',
                        help='one-byte JPEG corruptions to try per decoder (default 180)')
    parser.add_argument('--json', type=Path, default=None, help='also write the result here')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table; return 0."""
    args = _parser().parse_args(argv)
    if min(args.runs, args.width, args.height, args.corrupt) < 1:
        _parser().error('--runs, --width, --height and --corrupt must be >= 1')
    result = run(args.width, args.height, args.runs, args.corrupt)
    print(report(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
