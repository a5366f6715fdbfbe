"""Checkpoint round trips (openpi / LeRobot layouts), damaged files, parameter counts."""

import json
import logging

from oxygen_ros.checkpoint.weights import (CheckpointError, CheckpointLayout, load_checkpoint,
                                           save_checkpoint)
from oxygen_ros.config import get_preset, preset_names
from oxygen_ros.model.pi05 import Pi05Model
import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file
import torch

EMBED = 'paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
LM_HEAD = 'paligemma_with_expert.paligemma.lm_head.weight'
Q0 = 'paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight'
TIME_IN = 'time_mlp_in.weight'


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return Pi05Model(get_preset('tiny').model).eval()


def _assert_same(a, b, dtype=None):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    dtypes = a.parameter_dtypes(dtype) if dtype is not None else {}
    for key, value in sa.items():
        want = value.to(dtypes[key]) if key in dtypes else value
        assert sb[key].dtype == want.dtype and torch.equal(sb[key], want), key


@pytest.mark.parametrize('layout', list(CheckpointLayout))
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(model, tmp_path, layout, dtype):
    save_checkpoint(model, tmp_path, layout=layout, dtype=dtype)
    loaded = load_checkpoint(tmp_path, model.cfg)
    _assert_same(model, loaded, dtype)
    assert loaded.dtype == dtype
    with safe_open(str(tmp_path / 'model.safetensors'), framework='pt') as reader:
        keys = set(reader.keys())
    prefix = 'model.' if layout is CheckpointLayout.LEROBOT else ''
    assert all(k.startswith(prefix + 'paligemma_with_expert.') or
               k.removeprefix(prefix).split('.')[0] in ('action_in_proj', 'action_out_proj',
                                                        'time_mlp_in', 'time_mlp_out')
               for k in keys)
    assert prefix + EMBED in keys and prefix + LM_HEAD not in keys  # tied head stored once
    assert prefix + Q0 in keys and prefix + TIME_IN in keys
    config = json.loads((tmp_path / 'config.json').read_text())
    assert config == {'action_dim': 32, 'action_horizon': 4, 'paligemma_variant': 'tiny_vlm',
                      'action_expert_variant': 'tiny_expert',
                      'precision': str(dtype).removeprefix('torch.'), 'preset': 'tiny',
                      'layout': layout.value}


def test_load_dtype_override_and_file_path(model, tmp_path):
    path = save_checkpoint(model, tmp_path, dtype=torch.bfloat16)
    loaded = load_checkpoint(path, model.cfg, dtype=torch.float32)
    on_disk = model.parameter_dtypes(torch.bfloat16)
    for key, value in model.state_dict().items():
        assert loaded.state_dict()[key].dtype == torch.float32
        assert torch.equal(loaded.state_dict()[key], value.to(on_disk[key]).float()), key


# openpi models_pytorch/gemma_pytorch.py, to_bfloat16_for_selected_params: substrings of the
# checkpoint keys whose tensors stay float32 in a bfloat16 model; pi0_pytorch.py builds the
# four heads outside paligemma_with_expert and never casts them.
OPENPI_FLOAT32_SELECTORS = (
    'vision_tower.vision_model.embeddings.patch_embedding.weight',
    'vision_tower.vision_model.embeddings.patch_embedding.bias',
    'vision_tower.vision_model.embeddings.position_embedding.weight',
    'input_layernorm', 'post_attention_layernorm', 'model.norm')
OPENPI_FLOAT32_HEADS = ('action_in_proj.', 'action_out_proj.', 'time_mlp_in.', 'time_mlp_out.')


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_16_bit_models_keep_openpis_float32_parameters(model, tmp_path, dtype):
    save_checkpoint(model, tmp_path, dtype=dtype)
    with safe_open(str(tmp_path / 'model.safetensors'), framework='pt') as reader:
        on_disk = {k: reader.get_slice(k).get_dtype() for k in reader.keys()}
    want = {k: 'F32' if any(sel in k for sel in OPENPI_FLOAT32_SELECTORS) or
            k.startswith(OPENPI_FLOAT32_HEADS)
            else {torch.bfloat16: 'BF16', torch.float16: 'F16'}[dtype] for k in on_disk}
    assert on_disk == want
    assert sum(v == 'F32' for v in want.values()) == 3 + 2 * 2 + 1 + 2 * 2 * 2 + 2 + 4 * 2
    loaded = load_checkpoint(tmp_path, model.cfg)
    assert loaded.dtype == dtype
    assert {n for n, p in loaded.named_parameters() if p.dtype == torch.float32} == \
        loaded.float32_parameters()
    # float32 models stay float32 throughout.
    assert set(model.parameter_dtypes(torch.float32).values()) == {torch.float32}


def test_split_projections_are_the_checkpoint_tensors(model, tmp_path):
    path = save_checkpoint(model, tmp_path)
    tensors = load_file(str(path))
    qkv = model.vlm.layers[0].qkv.weight  # [(H + 2 Hkv) D, W] = [16 + 8 + 8, 16]
    assert torch.equal(tensors[Q0], qkv[:16])
    assert torch.equal(tensors[Q0.replace('q_proj', 'k_proj')], qkv[16:24])
    assert torch.equal(tensors[Q0.replace('q_proj', 'v_proj')], qkv[24:])
    gate = Q0.replace('self_attn.q_proj', 'mlp.gate_proj')
    assert torch.equal(tensors[gate], model.vlm.layers[0].mlp.gate_up.weight[:32])


def _rewrite(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_tied_head_under_either_name_and_unused_expert_head(model, tmp_path):
    path = save_checkpoint(model, tmp_path)

    def rename(tensors):
        tensors[LM_HEAD] = tensors.pop(EMBED)
        tensors['paligemma_with_expert.gemma_expert.lm_head.weight'] = torch.zeros(257152, 16)
    _rewrite(path, rename)
    _assert_same(model, load_checkpoint(path, model.cfg))
    _rewrite(path, lambda t: t.update({EMBED: t[LM_HEAD].clone()}))  # both names present
    _assert_same(model, load_checkpoint(path, model.cfg))


def test_lerobot_renames_and_drops(model, tmp_path):
    path = save_checkpoint(model, tmp_path, layout=CheckpointLayout.LEROBOT)
    expert = 'model.paligemma_with_expert.gemma_expert.model.'

    def lerobot_extras(tensors):
        for name in ('in', 'out'):
            for part in ('weight', 'bias'):
                tensors[f'model.action_time_mlp_{name}.{part}'] = tensors.pop(
                    f'model.time_mlp_{name}.{part}')
        tensors['model.state_proj.weight'] = torch.zeros(16, 32)
        tensors[expert + 'layers.1.input_layernorm.weight'] = torch.zeros(16)
        tensors[expert + 'layers.0.post_attention_layernorm.weight'] = torch.zeros(16)
        tensors[expert + 'norm.weight'] = torch.zeros(16)
        tensors['model.paligemma_with_expert.paligemma.lm_head.weight'] = tensors[
            'model.' + EMBED].clone()
    _rewrite(path, lerobot_extras)
    _assert_same(model, load_checkpoint(path, model.cfg))


def test_missing_unexpected_and_misshapen_keys_in_one_error(model, tmp_path):
    path = save_checkpoint(model, tmp_path)

    def damage(tensors):
        del tensors[TIME_IN]
        tensors['paligemma_with_expert.extra.weight'] = torch.zeros(3)
        tensors[Q0] = torch.zeros(16, 15)
    _rewrite(path, damage)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, model.cfg)
    message = str(info.value)
    assert str(path) in message and 'openpi layout' in message
    assert f'missing keys (1): {TIME_IN}' in message
    assert 'unexpected keys (1): paligemma_with_expert.extra.weight' in message
    assert f'misshapen keys (1): {Q0} checkpoint [16, 15] expected [16, 16]' in message
    assert 'wrong preset? vlm.width: checkpoint 15' in message
    assert isinstance(info.value, ValueError)


def test_wrong_preset_names_the_dims_and_the_matching_preset(model, tmp_path):
    save_checkpoint(model, tmp_path, layout=CheckpointLayout.LEROBOT)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path, get_preset('demo').model)
    message = str(info.value)
    assert "does not fit preset 'demo'" in message and 'lerobot layout' in message
    assert "vlm.width: checkpoint 16, preset 'demo' 64" in message
    assert 'vision.patch_size' not in message  # both use 28-pixel patches
    assert "the checkpoint matches preset 'tiny'" in message
    assert 'missing keys' in message and 'misshapen keys' in message


def test_truncated_corrupt_and_absent_files(model, tmp_path):
    path = save_checkpoint(model, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='model.safetensors: not a readable safetensors'):
        load_checkpoint(tmp_path, model.cfg)
    path.write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{"a":1}x')
    with pytest.raises(CheckpointError, match='not a readable safetensors file'):
        load_checkpoint(path, model.cfg)
    with pytest.raises(CheckpointError, match='no checkpoint file at .*nowhere'):
        load_checkpoint(tmp_path / 'nowhere', model.cfg)
    save_file({'weight': torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError, match='unknown key layout .*found weight'):
        load_checkpoint(path, model.cfg)


def test_loading_never_unpickles(model, tmp_path, monkeypatch):
    save_checkpoint(model, tmp_path)

    def forbidden(*args, **kwargs):
        raise AssertionError('torch.load called')
    monkeypatch.setattr(torch, 'load', forbidden)
    _assert_same(model, load_checkpoint(tmp_path, model.cfg))


def test_parameter_counts():
    counts = {}
    for name in preset_names():
        with torch.device('meta'):
            meta = Pi05Model(get_preset(name).model)
        assert all(p.is_meta for p in meta.parameters())
        counts[name] = meta.count_parameters()
    assert counts['tiny'] < 5_000_000
    assert 50_000_000 <= counts['small'] <= 150_000_000
    for name in ('pi05_droid', 'pi05_libero', 'pi05_base'):
        assert counts[name] == 3_353_433_872  # docs/model.md#sizes-and-costs


def test_an_untied_head_is_loaded_as_the_head_with_an_info_line(model, tmp_path, caplog):
    path = save_checkpoint(model, tmp_path)
    head = torch.randn(257152, 16)
    _rewrite(path, lambda t: t.update({LM_HEAD: head}))
    with caplog.at_level(logging.INFO, logger='oxygen_ros.checkpoint.weights'):
        loaded = load_checkpoint(path, model.cfg)
    assert f'{path} holds an LM head ({LM_HEAD}) that differs from the token embedding: ' \
        'loaded as an untied head, text decoding uses it' in caplog.text
    assert torch.equal(loaded.lm_head, head) and torch.equal(loaded.embedding, model.embedding)
    hidden = torch.randn(2, 16)
    y, _ = loaded.vlm.final_norm(hidden)
    torch.testing.assert_close(loaded.lm_logits(hidden), y @ head.T)
    # the untied head survives a save / load round trip under its own key
    save_checkpoint(loaded, tmp_path / 'again')
    with safe_open(str(tmp_path / 'again/model.safetensors'), framework='pt') as reader:
        assert LM_HEAD in reader.keys() and EMBED in reader.keys()
    assert torch.equal(load_checkpoint(tmp_path / 'again', model.cfg).lm_head, head)
    assert load_checkpoint(tmp_path / 'again', model.cfg).count_parameters() == \
        model.count_parameters() + 257152 * 16


def test_a_siglip_tree_without_vision_model_is_renamed_with_a_warning(model, tmp_path, caplog):
    path = save_checkpoint(model, tmp_path, layout=CheckpointLayout.LEROBOT)
    tower = 'model.paligemma_with_expert.paligemma.model.vision_tower.'

    def drop_vision_model(tensors):
        for key in [k for k in tensors if k.startswith(tower + 'vision_model.')]:
            tensors[tower + key.removeprefix(tower + 'vision_model.')] = tensors.pop(key)
    _rewrite(path, drop_vision_model)
    with caplog.at_level(logging.WARNING):
        _assert_same(model, load_checkpoint(path, model.cfg))
    n = 3 + 2 * (4 + 2 + 6 + 4) + 2   # embeddings, per layer: norms, out, qkv, mlp; final norm
    assert f'{path}: {n} SigLIP keys lack "vision_model." ' \
        '(paligemma_with_expert.paligemma.model.vision_tower.…, as some third-party LeRobot ' \
        'exports write them): renamed to ' \
        'paligemma_with_expert.paligemma.model.vision_tower.vision_model.…' in caplog.text
