"""
PyTorch's own compile caches on disk under the project cache, so that a second start is quick.

Two layers, both PyTorch's (no cache of our own):

- Inductor's FX graph cache, AOTAutograd cache and Triton kernel cache live in
  ``TORCHINDUCTOR_CACHE_DIR``; :meth:`CompileCache.activate` points it (and Triton's) at
  ``<cache>/torch_compile/inductor`` unless the user set it, so they survive reboots (the
  default is under ``/tmp``).
- The "mega-cache" (``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``):
  after a warm-up that compiled something new, every artifact of this process is written to
  one file keyed by torch version, GPU, model config, dtype, compile mode and shapes; the next
  start loads it before compiling. The file is portable: copy it to another machine with the
  same GPU and torch to skip compilation there too.

Hits and misses are torch's counters (``torch._dynamo.utils.counters['inductor']``,
``fxgraph_cache_hit`` / ``fxgraph_cache_miss``): a warm start compiles nothing new. Both
layers spare Inductor's work, not Dynamo's trace of each step: the steps compiled ahead of
time (``precompile.py``, under ``<cache>/torch_compile/aot``) spare that too; these caches
serve what is still compiled just in time.
"""

from __future__ import annotations

from dataclasses import dataclass
import hashlib
import logging
import os
from pathlib import Path

from oxygen_ros.resources import cache_dir
import torch

_LOG = logging.getLogger(__name__)

SUBDIR = 'torch_compile'
COMPILE_CACHE_ENV = 'OXYGEN_ROS_COMPILE_CACHE'
"""Where the compile caches go instead of ``<project cache>/torch_compile`` (e.g. a machine's
local disk while the project cache is a folder carried along)."""


@dataclass(frozen=True, slots=True)
class CacheCounts:
    """Inductor FX graph cache hits and misses (process totals, torch's counters)."""

    hits: int
    misses: int


def cache_counts() -> CacheCounts:
    """Return torch's FX graph cache counters so far in this process."""
    from torch._dynamo.utils import counters
    inductor = counters['inductor']
    return CacheCounts(int(inductor['fxgraph_cache_hit']), int(inductor['fxgraph_cache_miss']))


def cache_root() -> Path:
    """Return ``$OXYGEN_ROS_COMPILE_CACHE``, else ``<project cache>/torch_compile``."""
    env = os.environ.get(COMPILE_CACHE_ENV)
    return Path(env) if env else cache_dir() / SUBDIR


class CompileCache:
    """
    The on-disk compile caches of one fast-path configuration.

    :param key: what the compiled code depends on (any string; hashed into the file name).
    :param root: default :func:`cache_root` (``$OXYGEN_ROS_COMPILE_CACHE``, else
        ``<project cache>/torch_compile`` under ``$OXYGEN_ROS_CACHE``).
    """

    def __init__(self, key: str, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root()
        digest = hashlib.sha256(f'{torch.__version__}|{key}'.encode()).hexdigest()[:24]
        self.artifacts = self.root / 'artifacts' / f'{digest}.bin'
        self._start: CacheCounts | None = None
        self.loaded = False

    def activate(self) -> None:
        """
        Use the persistent Inductor and Triton cache directories; load the artifact file.

        A damaged or incompatible artifact file is logged and ignored (it is rewritten after
        this warm-up).
        """
        inductor = self.root / 'inductor'
        if 'TORCHINDUCTOR_CACHE_DIR' not in os.environ:
            os.environ['TORCHINDUCTOR_CACHE_DIR'] = str(inductor)
        os.environ.setdefault('TRITON_CACHE_DIR', str(Path(os.environ[
            'TORCHINDUCTOR_CACHE_DIR']) / 'triton'))
        self._start = cache_counts()
        if self.artifacts.is_file():
            try:
                info = torch.compiler.load_cache_artifacts(self.artifacts.read_bytes())
            except Exception as exc:  # noqa: B902 - any bad file: compile afresh
                _LOG.warning('ignoring compile cache %s (%s: %s)', self.artifacts,
                             type(exc).__name__, exc)
            else:
                self.loaded = info is not None
                _LOG.info('loaded compile cache artifacts %s', self.artifacts)

    def counts(self) -> CacheCounts:
        """Return hits and misses since :meth:`activate`."""
        now, start = cache_counts(), self._start or CacheCounts(0, 0)
        return CacheCounts(now.hits - start.hits, now.misses - start.misses)

    def save(self) -> Path | None:
        """
        Write this process's compile artifacts when something new was compiled.

        :returns: the file written, or None (nothing new, or nothing to save).
        """
        if self.counts().misses == 0 and self.artifacts.is_file():
            return None
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return None
        data, _ = saved
        self.artifacts.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.artifacts.with_name(self.artifacts.name + f'.tmp{os.getpid()}')
        tmp.write_bytes(data)
        tmp.replace(self.artifacts)
        _LOG.info('wrote compile cache artifacts %s (%.1f MB)', self.artifacts, len(data) / 1e6)
        return self.artifacts


__all__ = ['COMPILE_CACHE_ENV', 'CacheCounts', 'CompileCache', 'SUBDIR', 'cache_counts',
           'cache_root']
