"""
The parity gate's tolerances, recorded by a full gate for the next start on the same weights.

The gate (``parity.py``) holds ``max|compiled - eager|`` to ``max(FLOOR * scale, FACTOR *
max|eager - eager_fp32|)``. The tolerance is a property of the eager computation: the weights,
the probe's inputs (``parity_probe.py`` seeds them per step and shape) and eager's code,
torch and GPU. Computing it costs a float32 copy of the model (13.4 GB for ``pi05_droid``) and
a float32 eager run of every probe. The compiled-vs-eager error is what checks a graph, and it
is measured afresh at every start. So a full gate writes its tolerances here; the next start
of the same configuration (the folder: ``precompile.ArtifactStore``, whose key holds the
model config, torch, GPU and a digest of the model's source code) with the same weights
(:func:`weights_fingerprint`) runs each probe compiled and eager in the model's dtype and
holds the error to the recorded tolerance: the decision a full gate would take, without the
float32 copy. Other weights (a new checkpoint, a fine-tune), a record missing a shape or
unreadable: the full gate runs, and records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
import tempfile

import torch
from torch import nn

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')

FILE = 'gate.json'
_CHUNK = 1 << 24
"""Elements per pass of :func:`weights_fingerprint` (int64 temporaries of 128 MiB)."""
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_sum(t: torch.Tensor) -> torch.Tensor:
    """Return ``sum_i bits_i * (2 i + 1)`` over the bit patterns of ``t``, int64, wrapping."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    bits = flat.view(_INTS[flat.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), _CHUNK):
        part = bits[start:start + _CHUNK].to(torch.int64)
        odd = torch.arange(start, start + part.numel(), dtype=torch.int64,
                           device=flat.device) * 2 + 1
        total += (part * odd).sum()
    return total


def weights_fingerprint(model: nn.Module) -> str:
    """
    Return a fingerprint of every tensor of ``model.state_dict()`` (names, shapes, values).

    Each tensor's bit patterns are summed with odd weights in int64 on its device (exact,
    wrapping: any change of one element changes the sum; integer sums do not depend on the
    reduction order), one host sync for all; the sums, names, shapes and dtypes are hashed.
    ~2 reads of the weights: milliseconds on a GPU.
    """
    h = hashlib.sha256()
    sums = []
    with torch.no_grad():
        for name, t in model.state_dict().items():
            h.update(f'{name}|{tuple(t.shape)}|{t.dtype};'.encode())
            sums.append(_bits_sum(t))
        if sums:
            values = torch.stack([s.to(sums[0].device) for s in sums]).cpu().tolist()
            h.update(repr(values).encode())
    return h.hexdigest()[:24]


class GateRecord:
    """
    The tolerances a full gate measured, in ``folder``, for weights ``weights``.

    :param folder: the configuration's folder (``ArtifactStore.dir``).
    :param weights: :func:`weights_fingerprint` of the model being warmed up.
    """

    def __init__(self, folder: Path, weights: str) -> None:
        self.path = Path(folder) / FILE
        self.weights = weights

    def tolerances(self, needed: set[str]) -> tuple[dict[str, tuple[float, float]] | None,
                                                    str]:
        """
        Return ``{probe: (tolerance, reference error)}`` and why, or None and why not.

        :param needed: the probes (``ParityProbe.label``) this warm-up gates.
        """
        if not self.path.is_file():
            return None, 'no gate recorded for this configuration'
        try:
            data = json.loads(self.path.read_text())
            found = {k: (float(v[0]), float(v[1])) for k, v in data['tolerances'].items()}
            weights = data['weights']
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            return None, f'unreadable gate record {self.path} ({type(exc).__name__}: {exc})'
        if weights != self.weights:
            return None, (f'the weights changed since the gate was recorded (fingerprint '
                          f'{self.weights}, recorded {weights})')
        missing = needed - set(found)
        if missing:
            return None, f'the recorded gate lacks {len(missing)} probe(s), e.g. {min(missing)}'
        return {k: found[k] for k in needed}, f'recorded for these weights ({self.weights})'

    def save(self, tolerances: dict[str, tuple[float, float]]) -> None:
        """Write the tolerances of a full gate (errors logged: the next start gates in full)."""
        data = json.dumps({'weights': self.weights, 'torch': torch.__version__,
                           'tolerances': {k: list(v) for k, v in sorted(tolerances.items())}},
                          indent=1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=FILE + '.')
            with os.fdopen(fd, 'w') as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            _LOG.error('cannot record the parity gate in %s (the next start gates against '
                       'float32 again): %s', self.path, exc)


__all__ = ['FILE', 'GateRecord', 'weights_fingerprint']
