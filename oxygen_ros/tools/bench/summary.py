"""Figures the benchmarks summarize their samples with (numpy)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q``-th percentile of ``values`` (numpy's linear rule), NaN for none."""
    return float(np.percentile(np.asarray(values), q)) if len(values) else float('nan')


__all__ = ['percentile']
