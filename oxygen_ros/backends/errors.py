"""Errors of the backend layer (a module of its own so that every backend can raise them)."""

from __future__ import annotations


class BackendUnavailableError(RuntimeError):
    """The selected backend cannot run here (its package or device is missing)."""


__all__ = ['BackendUnavailableError']
