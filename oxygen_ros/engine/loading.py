"""
Building what an engine needs from its config: model weights, tokenizer and backend.

With no checkpoint the model gets seeded random weights and identity norm stats: the
pipeline, timings and KV behaviour are real, the actions and texts are meaningless (logged).
FP8 weights (``quantization: fp8``) are quantized here, after loading, and held to the action
rule of ``backends/fp8_gate.py`` before the engine may use them (:func:`load_model`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
from typing import Any

from oxygen_ros.backends.config import Quantization
from oxygen_ros.backends.factory import make_backend
from oxygen_ros.backends.interface import Backend
from oxygen_ros.config import ModelConfig
from oxygen_ros.engine.config import EngineConfig, QUANTIZATION_FALLBACK
from oxygen_ros.model.lora import load_oxygen_adapter, SuffixLoRA
from oxygen_ros.model.pi05 import build_model as build_random_model, Pi05Model
from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer
import torch

_LOG = logging.getLogger(__name__)


def torch_dtype(name: str) -> torch.dtype:
    """
    Return the torch dtype called ``name`` (``float32`` or ``bfloat16``).

    :raises ValueError: any other name.
    """
    dtypes = {'float32': torch.float32, 'bfloat16': torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f'dtype must be one of {sorted(dtypes)}, got {name!r}')
    return dtypes[name]


def build_model(config: EngineConfig, model_cfg: ModelConfig) -> Pi05Model:
    """
    Load the checkpoint of ``config``, or build seeded random weights if it has none.

    :raises ValueError: checkpoint keys or shapes do not fit ``model_cfg`` (CheckpointError).
    :raises FileNotFoundError: the checkpoint does not exist.
    """
    dtype, device = torch_dtype(config.dtype), config.backend.device
    if config.checkpoint:
        from oxygen_ros.checkpoint.weights import load_checkpoint
        model = load_checkpoint(config.checkpoint, model_cfg, dtype=dtype, device=device)
        _LOG.info('loaded %s weights from %s', model_cfg.name, config.checkpoint)
        return model
    torch.manual_seed(config.seed)
    model = build_random_model(model_cfg, dtype=dtype, device=device)
    _LOG.warning('preset %s: RANDOM weights (seed %d), no checkpoint given: actions and text '
                 'are meaningless; pass a checkpoint for a real policy', model_cfg.name,
                 config.seed)
    return model


@dataclass
class LoadedModel:
    """
    The model an engine runs, and what its loading found.

    :ivar reference: a float32 copy of the unquantized weights when one was made (the FP8
        check's): the fast path's parity gate takes it (an FP8 model has no other float32
        reference); None otherwise.
    :ivar fallbacks: ``{QUANTIZATION_FALLBACK: reason}`` when the quantization asked for
        does not run as asked (the weight-only reference path, or the unquantized weights
        after a failed check); empty otherwise.
    :ivar check: the FP8 action check's figures (``ActionCheck.as_dict``), or None.
    """

    model: Pi05Model
    reference: Pi05Model | None = None
    fallbacks: dict[str, str] = field(default_factory=dict)
    check: dict | None = None


def load_model(config: EngineConfig, model_cfg: ModelConfig) -> LoadedModel:
    """
    Build the model of ``config`` (:func:`build_model`) and quantize it as asked.

    FP8: the kernel is chosen for the device (``model/fp8.py`` ``fp8_kernel``: compute
    capability >= 8.9 and a row-wise ``torch._scaled_mm`` that runs there, probed), a float32
    and a bf16 copy of the weights are made (one of them may be the model itself), the FP8
    copy is checked against both (``fp8_gate.check_fp8_actions``) and kept when it passes;
    else the unquantized model is returned. A device without the FP8 product runs the
    unquantized weights too: the load never aborts for FP8. Every departure from "FP8 with
    ``torch._scaled_mm``" is logged (ERROR for a refused device or a failed check, WARNING for
    the reference path) and returned in ``fallbacks``. Peak memory: the model, its float32
    copy, a bf16 copy (float32 models) and the FP8 weights; the float32 copy stays for the
    fast path's gate.

    :raises ValueError: as :func:`build_model`.
    """
    model = build_model(config, model_cfg)
    if config.quantization is Quantization.NONE:
        return LoadedModel(model)
    from oxygen_ros.backends.fp8_gate import check_fp8_actions
    from oxygen_ros.backends.parity import model_copy
    from oxygen_ros.model.fp8 import (
        describe_quantization, fp8_kernel, Fp8Unsupported, quantized_copy)

    try:
        kernel, why = fp8_kernel(model.device)
    except Fp8Unsupported as exc:
        reason = f'{exc}; running the unquantized {config.dtype} weights'
        _LOG.error('%s', reason)
        return LoadedModel(model, None, {QUANTIZATION_FALLBACK: reason})
    reference = model if model.dtype == torch.float32 else model_copy(model, torch.float32)
    bf16 = model if model.dtype == torch.bfloat16 else model_copy(model, torch.bfloat16)
    fp8 = quantized_copy(model, kernel)
    check = check_fp8_actions(fp8, bf16, reference, num_cameras=len(config.robot().cameras))
    if check.passed:
        _LOG.info('FP8 weights (%s) accepted: %s', describe_quantization(fp8), check.describe())
        reason = f'fp8 runs the weight-only reference path ({why})' if why else ''
        if reason:
            _LOG.warning('%s', reason)
        out, ref = fp8, reference
    else:
        reason = (f'FP8 weights ({kernel.value} kernel) refused by the action check: '
                  f'{check.describe()}; running the unquantized {config.dtype} weights')
        _LOG.error('%s', reason)
        out, ref = model, (reference if reference is not model else None)
    return LoadedModel(out, ref, {QUANTIZATION_FALLBACK: reason} if reason else {},
                       check.as_dict())


def check_quantization(config: EngineConfig, loaded: LoadedModel) -> None:
    """
    Refuse a shared model that is not quantized as ``config.quantization`` says.

    One from :func:`load_model` may be unquantized after a reported fallback.

    :raises ValueError: FP8 asked for and a plain model given, or FP8 weights not asked for.
    """
    from oxygen_ros.model.fp8 import fp8_kernel_of

    fp8 = fp8_kernel_of(loaded.model) is not None
    if fp8 and config.quantization is not Quantization.FP8:
        raise ValueError(f'the model has FP8 weights but the config asks for quantization '
                         f'{config.quantization.value!r}')
    if not fp8 and config.quantization is Quantization.FP8 and not loaded.fallbacks:
        raise ValueError('the config asks for quantization fp8 but the model given has no FP8 '
                         'weights: build it with engine.loading.load_model')


def load_tokenizer(config: EngineConfig) -> PaligemmaTokenizer:
    """
    Load the tokenizer of ``config`` (the fetched default when it names none).

    :raises FileNotFoundError: no tokenizer file (the message says how to fetch one).
    """
    return PaligemmaTokenizer(config.tokenizer)


def build_backend(config: EngineConfig, model: Pi05Model, num_blocks: int,
                  reference: Pi05Model | None = None) -> Backend:
    """
    Make the backend of ``config`` on ``model``, with the memory adapter it names.

    :param num_blocks: the KV pool's blocks (``EngineConfig.pool_blocks``).
    :param reference: the float32 weights for the fast path's parity gate
        (``LoadedModel.reference``).
    :raises FileNotFoundError: the adapter file is missing.
    :raises AdapterFormatError: an adapter that is not OxyGen's for this model.
    """
    adapter = None
    if config.memory_adapter:
        adapter = load_oxygen_adapter(config.memory_adapter, model.cfg,
                                      alpha=config.memory_adapter_alpha, dtype=model.dtype,
                                      device=model.device)
    return make_backend_for(config, model, num_blocks, adapter=adapter, reference=reference)


def make_backend_for(config: EngineConfig, model: Pi05Model, num_blocks: int, *,
                     adapter: SuffixLoRA | None = None, **fast_path: Any) -> Backend:
    """
    Return ``factory.make_backend`` of ``config``'s backend and scheduler settings.

    :param adapter: the memory adapter to hold (the caller's; :func:`build_backend` loads
        the config's).
    :param fast_path: options of the fast path (``FastPathBackend.create``).
    """
    return make_backend(config.backend, model, num_blocks, scheduler=config.scheduler,
                        max_decode_tokens=config.text_budget(),
                        max_cameras=len(config.robot().cameras), adapter=adapter, **fast_path)


def check_shared_backend(config: EngineConfig, backend: Backend, model: Pi05Model,
                         num_blocks: int) -> None:
    """
    Refuse a backend built elsewhere that does not fit an engine of ``config`` on ``model``.

    :raises ValueError: another model, block size, fewer than ``num_blocks`` blocks, or a
        memory adapter where the config names none (or none where it names one).
    """
    block_size = config.scheduler.block_size
    if backend.source_model is not model or backend.block_size != block_size or \
            backend.num_blocks < num_blocks or \
            bool(config.memory_adapter) != (backend.adapter is not None):
        raise ValueError(f'the shared backend does not fit: it needs this model, block size '
                         f'{block_size}, {num_blocks} blocks and '
                         f'{"a" if config.memory_adapter else "no"} memory adapter (it has '
                         f'{backend.block_size}, {backend.num_blocks} and '
                         f'{"an" if backend.adapter is not None else "no"} adapter)')
