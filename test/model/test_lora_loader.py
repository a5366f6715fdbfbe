"""Loading OxyGen's textual-memory adapter: what loads, and every refusal with its reason."""

import json
import re

import numpy as np
from oxygen_adapter import oxygen_arrays, write_oxygen_adapter
from oxygen_ros.config import get_preset
from oxygen_ros.model.lora import (
    AdapterFormatError, load_oxygen_adapter, OXYGEN_PREFIX, read_oxygen_adapter)
import pytest
import torch

CFG = get_preset('tiny').model


def test_an_adapter_as_oxygen_saves_it_loads_with_its_rank(tmp_path):
    path = write_oxygen_adapter(tmp_path / 'adapter_step_1500.npz', oxygen_arrays(CFG, rank=5))
    lora = load_oxygen_adapter(path, CFG, alpha=16.0, dtype=torch.bfloat16)
    assert lora.rank == 5 and lora.alpha == 16.0 and len(lora.layers) == CFG.vlm.depth
    assert lora.dtype == torch.bfloat16
    groups = CFG.vlm.num_heads + 2 * CFG.vlm.num_kv_heads
    layer = lora.layers[0]
    assert tuple(layer.qkv_a.shape) == (groups * 5, CFG.vlm.width)
    assert tuple(layer.qkv_b.shape) == (groups * CFG.vlm.head_dim, groups * 5)
    assert tuple(layer.down_b.shape) == (CFG.vlm.width, 5)


def test_nnx_value_leaves_and_a_params_root_are_accepted(tmp_path):
    arrays = {f'params/{k}/value': v for k, v in oxygen_arrays(CFG).items()}
    path = write_oxygen_adapter(tmp_path / 'a.npz', arrays)
    assert set(read_oxygen_adapter(path, CFG)) == set(oxygen_arrays(CFG))


def _refused(path, match):
    with pytest.raises(AdapterFormatError, match=match):
        load_oxygen_adapter(path, CFG)


def test_refusals_name_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match='memory adapter .*nope.npz: no such file'):
        load_oxygen_adapter(tmp_path / 'nope.npz', CFG)
    peft = tmp_path / 'peft'
    peft.mkdir()
    (peft / 'adapter_config.json').write_text(json.dumps({'r': 16}))
    _refused(peft, re.escape('is a folder (a Hugging Face PEFT adapter folder: '
                             'adapter_config.json); oxygen_ros loads OxyGen'))
    text = tmp_path / 'adapter.safetensors'
    text.write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{}      ')
    _refused(text, 'is not an .npz archive of arrays')
    good = oxygen_arrays(CFG)
    missing = dict(good)
    del missing[OXYGEN_PREFIX + 'mlp/linear_lora_b']
    _refused(write_oxygen_adapter(tmp_path / 'm.npz', missing),
             re.escape(f'missing 1: {OXYGEN_PREFIX}mlp/linear_lora_b'))
    expert = dict(good)   # a LoRA of the action expert too: not a suffix-only adapter
    expert['PaliGemma/llm/layers/attn/q_einsum_1/lora_a'] = np.zeros((2, 2), np.float32)
    _refused(write_oxygen_adapter(tmp_path / 'e.npz', expert),
             re.escape('unexpected 1: PaliGemma/llm/layers/attn/q_einsum_1/lora_a'))
    other = oxygen_arrays(get_preset('small').model)
    _refused(write_oxygen_adapter(tmp_path / 's.npz', other),
             re.escape(f'{OXYGEN_PREFIX}attn/q_einsum/lora_a has shape'))
    mixed = dict(good)
    mixed[OXYGEN_PREFIX + 'mlp/linear_lora_a'] = np.zeros(
        (CFG.vlm.depth, CFG.vlm.mlp_dim, 7), np.float32)
    _refused(write_oxygen_adapter(tmp_path / 'r.npz', mixed),
             re.escape(f'{OXYGEN_PREFIX}mlp/linear_lora_a has shape '
                       f'({CFG.vlm.depth}, {CFG.vlm.mlp_dim}, 7), expected '
                       f'({CFG.vlm.depth}, {CFG.vlm.mlp_dim}, 4)'))
    nan = dict(good)
    nan[OXYGEN_PREFIX + 'attn/q_einsum/lora_b'] = nan[OXYGEN_PREFIX + 'attn/q_einsum/lora_b'] \
        * np.nan
    _refused(write_oxygen_adapter(tmp_path / 'n.npz', nan), 'holds NaN or Inf')
    pickled = tmp_path / 'p.npz'
    np.savez(pickled, **{k: np.array([object()] * 2) if k.endswith('linear_lora_b') else v
                         for k, v in good.items()})
    _refused(pickled, 'is not an .npz archive of arrays')   # never unpickled
    with pytest.raises(AdapterFormatError, match='alpha must be a positive number'):
        load_oxygen_adapter(write_oxygen_adapter(tmp_path / 'g.npz', good), CFG, alpha=0.0)
