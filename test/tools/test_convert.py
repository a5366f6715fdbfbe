"""oxygen_convert: openpi's JAX tree written by orbax → model.safetensors, and its refusals."""

import json
from pathlib import Path
import shutil
import subprocess
import sys

import numpy as np
from openpi_jax_tree import jax_tree, with_value_leaves, write_orbax
from oxygen_ros.checkpoint.weights import load_checkpoint, save_checkpoint
from oxygen_ros.config import GemmaConfig, get_preset, VisionConfig
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.tools.convert import main
from oxygen_ros.tools.convert.jax_to_pytorch import convert_checkpoint
from oxygen_ros.tools.convert.orbax_reader import ConvertError
from oxygen_ros.transforms.norm_stats import identity_norm_stats, save_norm_stats
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file
import torch

# Heads x head dim != width everywhere, so a transposed einsum cannot pass unnoticed.
CFG = get_preset('tiny').model.with_overrides(
    name='convert_test', vocab_size=1000,
    vision=VisionConfig(patch_size=28, width=24, depth=2, num_heads=2, mlp_dim=40),
    vlm=GemmaConfig(width=24, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=40),
    expert=GemmaConfig(width=12, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=20))


@pytest.fixture(scope='module')
def direct(tmp_path_factory):
    """Return the reference: random weights saved in the openpi-PyTorch layout (fp32)."""
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp('direct')
    save_checkpoint(build_model(CFG), folder)
    return folder


def _orbax(folder, direct, change=None, value_leaves=False, assets=('tiny',)):
    tree = jax_tree(load_file(str(direct / 'model.safetensors')), CFG)
    if change is not None:
        change(tree)
    write_orbax(folder, with_value_leaves(tree) if value_leaves else tree)
    for asset in assets:
        save_norm_stats(folder, {'state': identity_norm_stats(8),
                                 'actions': identity_norm_stats(7)}, asset_id=asset)
    return folder


@pytest.fixture(scope='module')
def orbax_ckpt(direct, tmp_path_factory):
    return _orbax(tmp_path_factory.mktemp('openpi') / 'pi05_test', direct)


def test_orbax_writes_what_the_reader_expects(orbax_ckpt):
    params = orbax_ckpt / 'params'
    for name in ('_METADATA', '_CHECKPOINT_METADATA', '_sharding', 'manifest.ocdbt'):
        assert (params / name).is_file(), name
    assert list(params.glob('ocdbt.process_*/d/*'))
    meta = json.loads((params / '_METADATA').read_text())
    assert meta['use_ocdbt'] is True
    assert "('params', 'PaliGemma', 'llm', 'layers', 'attn', 'q_einsum', 'w')" in \
        meta['tree_metadata']


def _actions_and_logits(model):
    torch.manual_seed(0)
    images = torch.rand(1, 3, 3, 224, 224) * 2 - 1
    tokens, mask = torch.randint(3, 1000, (1, 9)), torch.ones(1, 9, dtype=torch.bool)
    prefix = model.prefill(tokens, mask, image_embeds=model.encode_images(images))
    noise = torch.randn(1, CFG.action_horizon, CFG.action_dim)
    return model.denoise(prefix, noise), model.lm_logits(prefix.last_hidden)


@pytest.mark.parametrize('value_leaves', [False, True])
def test_round_trip_equals_the_direct_openpi_pytorch_weights(direct, tmp_path, value_leaves):
    src = _orbax(tmp_path / 'ckpt', direct, value_leaves=value_leaves)
    result = convert_checkpoint(src, tmp_path / 'out', preset=CFG, precision='float32',
                                progress=False)
    assert result.num_tensors == len(load_file(str(direct / 'model.safetensors')))
    want, got = load_file(str(direct / 'model.safetensors')), \
        load_file(str(tmp_path / 'out/model.safetensors'))
    assert got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key   # transposes only: bit-exact
    ref, conv = load_checkpoint(direct, CFG), load_checkpoint(tmp_path / 'out', CFG)
    for a, b in zip(_actions_and_logits(ref), _actions_and_logits(conv)):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert (tmp_path / 'out/assets/tiny/norm_stats.json').is_file()   # the checkpoint's own
    manifest = json.loads((tmp_path / 'out/oxygen_convert.json').read_text())
    assert manifest['source'] == str(src.resolve()) and manifest['preset'] == 'convert_test'
    assert manifest['precision'] == 'float32' and manifest['date'][:2] == '20'
    assert json.loads((tmp_path / 'out/config.json').read_text())['layout'] == 'openpi'


def test_bfloat16_output_is_what_save_checkpoint_writes(direct, orbax_ckpt, tmp_path):
    convert_checkpoint(orbax_ckpt / 'params', tmp_path / 'out', preset=CFG, progress=False)
    save_checkpoint(load_checkpoint(direct, CFG), tmp_path / 'saved', dtype=torch.bfloat16)
    with safe_open(str(tmp_path / 'out/model.safetensors'), 'pt') as got, \
            safe_open(str(tmp_path / 'saved/model.safetensors'), 'pt') as want:
        assert set(got.keys()) == set(want.keys())
        for key in want.keys():
            a, b = got.get_tensor(key), want.get_tensor(key)
            assert a.dtype == b.dtype and torch.equal(a, b), key
        assert got.get_tensor('time_mlp_in.weight').dtype == torch.float32
        assert got.metadata()['preset'] == 'convert_test'


def test_the_cli_converts_a_registered_preset(tmp_path, capsys):
    torch.manual_seed(6)
    tiny = get_preset('tiny').model
    save_checkpoint(build_model(tiny), tmp_path / 'direct')
    tree = jax_tree(load_file(str(tmp_path / 'direct/model.safetensors')), tiny)
    write_orbax(tmp_path / 'ckpt', tree)
    save_norm_stats(tmp_path / 'ckpt', {'state': identity_norm_stats(8),
                                        'actions': identity_norm_stats(7)}, asset_id='tiny')
    assert main([str(tmp_path / 'ckpt'), str(tmp_path / 'out'), '--no-progress']) == 0
    out = capsys.readouterr().out
    assert 'preset tiny, bfloat16' in out and 'assets: tiny' in out
    assert f'preset:=tiny checkpoint:={tmp_path / "out"}' in out
    model = load_checkpoint(tmp_path / 'out', tiny)
    assert model.dtype == torch.bfloat16
    assert main([str(tmp_path / 'ckpt'), str(tmp_path / 'out'), '--no-progress']) == 2
    assert capsys.readouterr().err == (f'oxygen_convert: error: {tmp_path}/out/'
                                       'model.safetensors exists (pass --overwrite to replace '
                                       'it)\n')
    with pytest.raises(SystemExit) as info:
        main(['--help'])
    assert info.value.code == 0 and 'tensorstore' in capsys.readouterr().out


def _refusal(*args, **kwargs):
    with pytest.raises(ConvertError) as info:
        convert_checkpoint(*args, progress=False, **kwargs)
    return str(info.value)


def test_refuses_a_folder_that_is_not_an_orbax_checkpoint(direct, tmp_path):
    assert _refusal(direct, tmp_path / 'out') == (
        f'not an orbax checkpoint: {direct} holds neither params/_METADATA nor '
        'params/manifest.ocdbt (expected an openpi JAX checkpoint folder with params/ and '
        'assets/, e.g. gs://openpi-assets/checkpoints/pi05_droid; a PyTorch model.safetensors '
        'needs no conversion)')
    assert _refusal(tmp_path / 'nowhere', tmp_path / 'out') == \
        f'no such checkpoint folder: {tmp_path}/nowhere'


def test_refuses_a_pi0_tree(direct, tmp_path):
    def pi0(tree):
        tree['state_proj'] = {'kernel': np.zeros((32, 12), np.float32),
                              'bias': np.zeros(12, np.float32)}
        layers = tree['PaliGemma']['llm']['layers']
        layers['pre_attention_norm_1'] = {'scale': np.zeros((2, 12), np.float32)}
    src = _orbax(tmp_path / 'pi0', direct, pi0)
    assert _refusal(src, tmp_path / 'out', preset=CFG) == (
        f'{src} is a π0 checkpoint, not π0.5 (it has state_proj/kernel, '
        'PaliGemma/llm/layers/pre_attention_norm_1/scale; π0.5 has adaRMS Dense_0 norms in '
        'the action expert and no state_proj): oxygen_ros runs π0.5 only')


def test_refuses_missing_arrays_and_lists_them(direct, tmp_path):
    def drop(tree):
        del tree['time_mlp_out']['bias']
        del tree['PaliGemma']['llm']['layers']['mlp_1']['linear']
    src = _orbax(tmp_path / 'holes', direct, drop)
    assert _refusal(src, tmp_path / 'out', preset=CFG) == (
        f"{src}/params: 2 arrays missing for preset 'convert_test': "
        'PaliGemma/llm/layers/mlp_1/linear, time_mlp_out/bias')
    assert not (tmp_path / 'out').exists()


def test_refuses_a_preset_that_does_not_fit(orbax_ckpt, tmp_path):
    assert _refusal(orbax_ckpt, tmp_path / 'out', preset='demo') == (
        "preset 'demo' does not fit the checkpoint: vision.width: checkpoint 24, preset 128; "
        'vision.depth: checkpoint 2, preset 4; vision.mlp_dim: checkpoint 40, preset 512; '
        'vocab_size: checkpoint 1000, preset 257152; vlm.depth: checkpoint 2, preset 4; '
        'vlm.width: checkpoint 24, preset 64; vlm.num_heads*head_dim: checkpoint 16, preset '
        '128; vlm.num_kv_heads*head_dim: checkpoint 8, preset 32; vlm.mlp_dim: checkpoint 40, '
        'preset 256; expert.depth: checkpoint 2, preset 4; expert.width: checkpoint 12, '
        'preset 64; expert.num_heads*head_dim: checkpoint 16, preset 128; '
        'expert.num_kv_heads*head_dim: checkpoint 8, preset 32; expert.mlp_dim: checkpoint '
        '20, preset 256 (fits: no registered preset)')
    assert _refusal(orbax_ckpt, tmp_path / 'out') == (
        "no registered preset fits the checkpoint dims {'vision.width': 24, "
        "'vision.patch_size': 28, 'vision.num_tokens': 64, 'vision.depth': 2, "
        "'vision.mlp_dim': 40, 'vocab_size': 1000, 'vlm.depth': 2, 'vlm.width': 24, "
        "'vlm.num_heads*head_dim': 16, 'vlm.num_kv_heads*head_dim': 8, 'vlm.mlp_dim': 40, "
        "'expert.depth': 2, 'expert.width': 12, 'expert.num_heads*head_dim': 16, "
        "'expert.num_kv_heads*head_dim': 8, 'expert.mlp_dim': 20, 'action_dim': 32}")


def test_refuses_without_tensorstore(orbax_ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'tensorstore', None)
    assert _refusal(orbax_ckpt, tmp_path / 'out', preset=CFG) == (
        'oxygen_convert reads orbax checkpoints with tensorstore, which is not installed: '
        "pip install '.[convert]' in the oxygen_ros checkout (or pip install -r "
        'requirements/convert.txt)')


def test_a_checkpoint_without_assets_converts_with_a_warning(direct, tmp_path, caplog):
    src = _orbax(tmp_path / 'bare', direct, assets=())
    convert_checkpoint(src, tmp_path / 'out', preset=CFG, progress=False)
    assert not (tmp_path / 'out/assets').exists()
    assert f'{src} has no assets/: the converted folder has no norm stats' in caplog.text
    shutil.rmtree(tmp_path / 'out')


def test_the_installed_console_script_answers_help():
    exe = Path(sys.executable).with_name('oxygen_convert')
    proc = subprocess.run([str(exe), '--help'], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('usage: oxygen_convert ') and '--precision' in proc.stdout
