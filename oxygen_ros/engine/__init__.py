"""
The engine's public API: the one door to the model, the KV cache and the scheduler.

The node (``ros/``), the policy server (``serve/``), the simulator and the tools that drive
the engine import from here only (``test/test_import_boundaries.py`` holds it), as vLLM keeps
one request/output vocabulary at its engine's edge (``vllm/v1/engine/__init__.py``): the
``Engine`` and its ``EngineConfig`` (with the values its fields take), what goes in (an
``Observation`` and its ``CameraImage``, a ``TextTask`` request), what comes out (per cycle a
``StepOutput``: the ``ActionChunk``, one ``TextOutput`` per text request with news, ending
with a ``FinishReason``, and the ``CycleStats``) and how it refuses (``ObservationError``
with its ``RefusalReason``, ``QueueFullError``, ``EngineClosedError``, ...).
docs/design.md#the-engines-door lists the names and where each lives.

Nothing is imported until a name is used (PEP 562 ``__getattr__``): ``oxygen_ros.engine``
costs nothing at import, and a name costs only its own module (``EngineConfig`` no torch,
``Engine`` the model).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and readers: the same names, imported eagerly
    from oxygen_ros.backends.config import (  # noqa: F401
        ALL_STEPS, AttentionBackend, BackendKind, CompileMode, parse_compile_steps,
        Quantization, Step)
    from oxygen_ros.backends.errors import BackendUnavailableError  # noqa: F401
    from oxygen_ros.engine.config import (  # noqa: F401
        ENGINE_CONFIGS, EngineConfig, MAX_STATE_PROMPT_PAD, QUANTIZATION_FALLBACK)
    from oxygen_ros.engine.cycle import Cycle  # noqa: F401
    from oxygen_ros.engine.engine import Engine, EngineClosedError  # noqa: F401
    from oxygen_ros.engine.loading import load_model, LoadedModel  # noqa: F401
    from oxygen_ros.engine.outputs import (  # noqa: F401
        ActionChunk, CycleStats, StepOutput, TextOutput)
    from oxygen_ros.model.lora import AdapterFormatError  # noqa: F401
    from oxygen_ros.observation import (  # noqa: F401
        Observation, ObservationError, RefusalReason)
    from oxygen_ros.sched.request import FinishReason, TextContext  # noqa: F401
    from oxygen_ros.sched.request_queue import QueueFullError  # noqa: F401
    from oxygen_ros.sched.scheduler_config import Policy  # noqa: F401
    from oxygen_ros.transforms.images import ImageResize  # noqa: F401
    from oxygen_ros.transforms.inputs import CameraImage, PreparedObservation  # noqa: F401
    from oxygen_ros.transforms.prompt import TextTask  # noqa: F401

_EXPORTS = {
    # the engine and its configuration
    'Engine': 'oxygen_ros.engine.engine',
    'Cycle': 'oxygen_ros.engine.cycle',
    'EngineClosedError': 'oxygen_ros.engine.engine',
    'ENGINE_CONFIGS': 'oxygen_ros.engine.config',
    'EngineConfig': 'oxygen_ros.engine.config',
    'QUANTIZATION_FALLBACK': 'oxygen_ros.engine.config',
    'MAX_STATE_PROMPT_PAD': 'oxygen_ros.engine.config',
    'ALL_STEPS': 'oxygen_ros.backends.config',
    'AttentionBackend': 'oxygen_ros.backends.config',
    'BackendKind': 'oxygen_ros.backends.config',
    'CompileMode': 'oxygen_ros.backends.config',
    'Quantization': 'oxygen_ros.backends.config',
    'Step': 'oxygen_ros.backends.config',
    'parse_compile_steps': 'oxygen_ros.backends.config',
    'Policy': 'oxygen_ros.sched.scheduler_config',
    'TextContext': 'oxygen_ros.sched.request',
    'ImageResize': 'oxygen_ros.transforms.images',
    'load_model': 'oxygen_ros.engine.loading',
    'LoadedModel': 'oxygen_ros.engine.loading',
    # what goes in
    'Observation': 'oxygen_ros.observation',
    'CameraImage': 'oxygen_ros.transforms.inputs',
    'PreparedObservation': 'oxygen_ros.transforms.inputs',
    'TextTask': 'oxygen_ros.transforms.prompt',
    # what comes out
    'ActionChunk': 'oxygen_ros.engine.outputs',
    'CycleStats': 'oxygen_ros.engine.outputs',
    'StepOutput': 'oxygen_ros.engine.outputs',
    'TextOutput': 'oxygen_ros.engine.outputs',
    'FinishReason': 'oxygen_ros.sched.request',
    # refusals
    'ObservationError': 'oxygen_ros.observation',
    'RefusalReason': 'oxygen_ros.observation',
    'QueueFullError': 'oxygen_ros.sched.request_queue',
    'AdapterFormatError': 'oxygen_ros.model.lora',
    'BackendUnavailableError': 'oxygen_ros.backends.errors',
}
"""Public name -> the module that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """Import the module of a public name on first use (PEP 562)."""
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}') from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
