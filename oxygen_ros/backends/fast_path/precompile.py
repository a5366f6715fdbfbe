"""
Steps compiled ahead of time: a warm start loads each step's compiled code, Dynamo traces none.

With every compile cache warm a start of the fast path still spent most of its warm-up in
Dynamo: 60 of the 69 s to the first chunk on the H100 (``docs/gpu/2026-11-25-h100``), 19 of
26 s on this CPU (tiny preset, ``cProfile``). The caches of ``compile_cache.py`` spare
Inductor's code generation, not Dynamo's trace of every step through every layer, nor its
guards. PyTorch's ahead-of-time compile of ``torch.compile`` (``torch.compile(fn,
fullgraph=True).aot_compile(...)``, ``save_compiled_function``,
``torch.compiler.load_compiled_function``; experimental, documented at
docs.pytorch.org/docs/2.13/user_guide/torch_compiler/torch.compiler_aot_compile.html) saves
the traced bytecode, its guards and the backend's compiled code (Inductor's, or
``aot_eager``'s graph) in one file; loading it runs no trace. AOTInductor
(``aoti_compile_and_package``) would need ``torch.export`` of every step and the KV pool's
writes as graph outputs; this keeps the fast path's ``torch.compile`` functions as they are.

:class:`ArtifactStore` is one folder per fast-path configuration: its name hashes the key
(torch, Triton, GPU, model config, dtype, shapes, compile mode, attention; see
``warmup.fast_path_key``) and a digest of the model's source files (:func:`source_digest`:
the saved bytecode is that of the code traced, so changed code must not load it). A step
keeps one file per compiled variant (``<step>-<digest>.bin``: one serves every bucket whose
guards it passes; a dim of size 1 needs its own, as in a just-in-time compile), and a
``<step>.refused`` file with the reason when it cannot be compiled ahead of time.

:class:`PrecompiledStep` stands where ``torch.compile(target)`` stood: a call runs the first
variant whose guards accept its arguments; none does: it compiles one ahead of time on these
very arguments (their ``maybe_mark_dynamic`` dims symbolic, as the just-in-time compile has
them), saves it and runs it. A loaded function takes the module whose method was compiled as
its first argument: weights are read from the live model at every call, never stored in a
file (a changed checkpoint needs no new artifact; the parity gate re-runs in full for it,
``gate_record.py``). Its arguments go without Dynamo's dim marks (a fresh alias of each
marked tensor): torch 2.13 saves the marks' guard so that a loaded function refuses a marked
tensor, while an unmarked one satisfies it.

Nothing fails silently: a file that cannot be loaded is logged and skipped; an error while
compiling ahead of time propagates to the warm-up, which records the refusal (WARNING) and
compiles the step just in time.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
from pathlib import Path
import tempfile
import types
from typing import Any, Callable

import torch
from torch import nn

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')

AOT_BACKENDS = ('inductor', 'aot_eager')
"""``torch.compile`` backends whose compiled code ``save_compiled_function`` can write."""
SUBDIR = 'aot'
_MARKS = ('_dynamo_', '_has_dynamo_')
"""Prefixes of the tensor attributes ``torch._dynamo.maybe_mark_dynamic`` and kin set."""
_SOURCES = ('model', 'config.py', 'backends/fast_path/static_calls.py',
            'backends/fast_path/denoise_fused.py', 'backends/fast_path/paged_attention.py',
            'backends/fast_path/folding.py', 'backends/fast_path/kernels')
"""What the traced code is made of, relative to the package: hashed by :func:`source_digest`."""


def source_digest() -> str:
    """
    Return a digest of the traced sources: ``model/**``, ``config.py``, the static calls.

    The static calls are ``static_calls.py``, ``denoise_fused.py``, ``paged_attention.py``,
    ``folding.py`` and ``kernels/`` of the fast path.

    The traced bytecode of an artifact is that of these files at compile time.
    """
    package = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for part in _SOURCES:
        path = package / part
        for file in sorted(path.rglob('*.py')) if path.is_dir() else [path]:
            h.update(str(file.relative_to(package)).encode() + b'\0' + file.read_bytes())
    return h.hexdigest()[:16]


class ArtifactStore:
    """
    The ahead-of-time compiled steps of one fast-path configuration, on disk.

    :param root: the compile cache folder (``compile_cache.CompileCache.root``).
    :param key: what the compiled code depends on (hashed with torch's version and
        :func:`source_digest` into the folder name).
    :ivar loaded: functions loaded from disk per step (each a Dynamo trace spared).
    :ivar compiled: functions compiled ahead of time and saved per step.
    """

    def __init__(self, root: Path, key: str) -> None:
        digest = hashlib.sha256(f'{torch.__version__}|{source_digest()}|{key}'.encode())
        self.dir = Path(root) / SUBDIR / digest.hexdigest()[:24]
        self.loaded: dict[str, int] = {}
        self.compiled: dict[str, int] = {}
        self._variants: dict[str, list[Any]] = {}

    def variants(self, step: str) -> list[Any]:
        """Return the step's loaded functions (read from disk on first use; bad files skipped)."""
        if step not in self._variants:
            found = []
            for file in sorted(self.dir.glob(f'{step}-*.bin'), key=lambda f: f.stat().st_mtime):
                try:
                    found.append(torch.compiler.load_compiled_function(
                        io.BytesIO(file.read_bytes())))
                except Exception as exc:  # noqa: B902 - any bad file: compile afresh
                    _LOG.warning('fast path: ignoring %s (%s: %s)', file, type(exc).__name__,
                                 exc)
            self._variants[step] = found
            self.loaded[step] = len(found)
        return self._variants[step]

    def add(self, step: str, fn: Any) -> None:
        """Save a function compiled ahead of time (errors are logged: the next start traces)."""
        self._variants.setdefault(step, []).append(fn)
        self.compiled[step] = self.compiled.get(step, 0) + 1
        try:
            data = type(fn).serialize(fn).serialized_data
            name = f'{step}-{hashlib.sha256(data).hexdigest()[:16]}.bin'
            _write(self.dir / name, data)
        except Exception as exc:  # noqa: B902 - torch raises more than OSError here
            _LOG.error('fast path: cannot save the %s step compiled ahead of time (the next '
                       'start traces it again): %s: %s', step, type(exc).__name__, exc)

    def drop(self, step: str) -> None:
        """Forget the step's functions and delete its files (they failed)."""
        self._variants[step] = []
        for file in self.dir.glob(f'{step}-*.bin'):
            file.unlink(missing_ok=True)

    def refused(self, step: str) -> str | None:
        """Return why the step cannot be compiled ahead of time here, or None."""
        file = self.dir / f'{step}.refused'
        return file.read_text() if file.is_file() else None

    def refuse(self, step: str, reason: str) -> None:
        """Record that the step is compiled just in time from now on, and why."""
        self.drop(step)
        try:
            _write(self.dir / f'{step}.refused', reason.encode())
        except OSError as exc:
            _LOG.error('fast path: cannot record %s in %s: %s', step, self.dir, exc)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + '.')
    with os.fdopen(fd, 'wb') as f:
        f.write(data)
    os.replace(tmp, path)


def _plain(x: Any) -> Any:
    """Return ``x`` with every dim-marked tensor replaced by an unmarked alias (same storage)."""
    if isinstance(x, torch.Tensor):
        if any(k.startswith(_MARKS) for k in getattr(x, '__dict__', ())):
            return x.detach()
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def available() -> bool:
    """Return whether this torch can load functions compiled ahead of time."""
    return hasattr(torch.compiler, 'load_compiled_function')


def _aot_enabled() -> contextlib.AbstractContextManager:
    """Return a context with ``aot_compile`` on (a flag older torch releases leave off)."""
    config = torch._dynamo.config
    if hasattr(config, 'enable_aot_compile'):
        return config.patch(enable_aot_compile=True)
    return contextlib.nullcontext()


def _stub(step: str) -> None:
    """Stand for a ``PrecompiledStep`` in a pickled module state."""
    return None


def _accepts(fn: Any, owner: nn.Module, args: tuple) -> bool:
    """Return whether ``fn``'s guards accept ``args`` (a stale signature: no)."""
    try:
        return bool(fn.guard_check(owner, *args))
    except Exception:  # noqa: B902 - a function from another version of the code
        return False


def _signature(x: Any) -> Any:
    """Return what a variant's choice depends on: shapes, dtypes and devices, or the value."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    return x


class PrecompiledStep:
    """
    ``torch.compile(target, backend=backend, fullgraph=True)``, compiled ahead of time.

    :param target: an ``nn.Module`` (its ``forward``) or a bound method of one.
    :param backend: a name in :data:`AOT_BACKENDS`.
    :param store: where the step's functions are loaded from and saved to.
    :param step: the step's name in ``store``.
    :param options: Inductor's options (``torch.compile(options=...)``), None: its defaults.
    """

    def __init__(self, target: nn.Module | types.MethodType, backend: str,
                 store: ArtifactStore, step: str, options: dict | None = None) -> None:
        with _aot_enabled():
            if isinstance(target, nn.Module):
                self.owner: nn.Module = target
                self._compiled: Callable = torch.compile(target, backend=backend,
                                                         fullgraph=True,
                                                         options=options).forward
            else:
                self.owner = target.__self__
                self._compiled = torch.compile(target, backend=backend, fullgraph=True,
                                               options=options)
        self.store, self.step = store, step
        self.variants = store.variants(step)
        self._chosen: dict[Any, Any] = {}

    def __reduce__(self) -> tuple:
        """
        Pickle as a stub: never saved itself.

        Dynamo's guard serialization pickles the state of the compiled method's module; a
        denoise loop holds this object there (its ``step``), which holds unpicklable guards.
        """
        return _stub, (self.step,)

    def __call__(self, *args: Any) -> Any:
        plain = _plain(args)
        signature = _signature(plain)
        fn = self._chosen.get(signature)
        if fn is None:
            fn = next((v for v in self.variants if _accepts(v, self.owner, plain)), None)
            if fn is None:
                fn = self._compile(args, plain)
            self._chosen[signature] = fn
        return fn(self.owner, *plain)

    def _compile(self, args: tuple, plain: tuple) -> Any:
        """Compile a variant on ``args`` (dim marks and all), save it, check it takes them."""
        aot = getattr(self._compiled, 'aot_compile', None)
        if aot is None:
            raise RuntimeError(f'torch {torch.__version__} has no torch.compile(...)'
                               f'.aot_compile')
        with _aot_enabled():
            fn = aot((args, {}))
        if not _accepts(fn, self.owner, plain):
            raise RuntimeError('the function compiled ahead of time refuses the arguments it '
                               'was compiled on')
        self.store.add(self.step, fn)
        return fn


__all__ = ['AOT_BACKENDS', 'ArtifactStore', 'PrecompiledStep', 'available', 'source_digest']
