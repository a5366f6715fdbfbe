"""
The exported ONNX graphs, run in onnxruntime on the CPU, equal the torch model.

One scenario drives the model's five backend calls on a torch ``Pi05Model`` and on a
``GraphRunner`` over onnxruntime, each with its own KV pool: two frames (one with a masked
camera and padded prompt), their prefixes (CAUSAL_TEXT: image segment + text segment on it),
10 Euler steps of each action chunk, seed logits, then decode steps over rows of both frames
with different context lengths and tokens already fed. Every output and the whole KV pool
must agree to 1e-4 (fp32).
"""

import json
import shutil

import numpy as np
import onnx
from onnx import numpy_helper
from oxygen_ros.checkpoint.weights import save_checkpoint
from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.tools.export import main as export_main
from oxygen_ros.tools.tensorrt.graph_runner import GraphRunner
from oxygen_ros.tools.tensorrt.onnx_export import export_graphs, WEIGHTS_FILE, WeightStorage
from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName
from oxygen_ros.tools.tensorrt.onnx_manifest import load_manifest, weights_sha256
from oxygen_ros.tools.tensorrt.ort_runtime import OrtExecutor
import pytest
import torch

CAUSAL, BIDIR = PrefixAttention.CAUSAL_TEXT, PrefixAttention.BIDIRECTIONAL
ATOL = 1e-4


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """(model, export dir, manifest, runner) per (preset, prefix attention), built once."""
    cache = {}

    def get(preset, mode, dtype=torch.float32):
        key = (preset, mode, dtype)
        if key not in cache:
            cfg = get_preset(preset).model.with_overrides(prefix_attention=mode)
            torch.manual_seed(1)
            model = build_model(cfg, dtype=dtype)
            out = tmp_path_factory.mktemp(f'{preset}-{mode.value}')
            manifest = export_graphs(model, out)
            runner = None
            if dtype != torch.bfloat16:
                runner = GraphRunner(cfg, dtype, 'cpu', OrtExecutor(out, threads=2))
            cache[key] = (model, out, manifest, runner)
        return cache[key]
    return get


def _scenario(m, cache: KVCache, mode: PrefixAttention) -> dict:
    """Drive the five backend calls of ``m`` (model or runner); return every output."""
    cfg = m.cfg
    gen = torch.Generator().manual_seed(0)
    size, ti = cfg.vision.image_size, cfg.image_tokens_per_camera
    out = {}
    images = [torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1 for _ in range(2)]
    embeds = [m.encode_images(im) for im in images]
    out['embeds'] = torch.cat(embeds)
    tokens = [torch.randint(3, 1000, (1, n), generator=gen) for n in (9, 6)]
    masks = [torch.ones(1, 9, dtype=torch.bool), torch.tensor([[True] * 4 + [False] * 2])]
    image_masks = [None, torch.tensor([[True, False]])]
    prefixes, next_slot = [], 40     # slots deliberately not starting at 0
    for f in range(2):
        n_img = 2 * ti if f == 0 else ti
        if mode is CAUSAL:
            img = m.prefill(torch.zeros(1, 0, dtype=torch.int64),
                            torch.zeros(1, 0, dtype=torch.bool), image_embeds=embeds[f],
                            image_mask=image_masks[f], cache=cache,
                            slots=torch.arange(next_slot, next_slot + n_img)[None])
            next_slot += n_img + 7
            prefix = m.prefill(tokens[f], masks[f], context=img,
                               slots=torch.arange(next_slot, next_slot + 9)[None])
            next_slot += 9 + 5
        else:
            prefix = m.prefill(tokens[f], masks[f], image_embeds=embeds[f],
                               image_mask=image_masks[f], cache=cache,
                               slots=torch.arange(next_slot, next_slot + n_img + 9)[None])
            next_slot += n_img + 9 + 3
        prefixes.append(prefix)
        out[f'num_tokens{f}'] = prefix.num_tokens
        out[f'slots{f}'] = prefix.slots
        out[f'mask{f}'] = prefix.mask
    hidden = torch.cat([p.last_hidden for p in prefixes])
    out['last_hidden'] = hidden
    out['seed_logits'] = m.lm_logits(hidden)
    for f, prefix in enumerate(prefixes):
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen)
        out[f'actions{f}'] = m.denoise(prefix, noise)
    # decode rows: (prefix, decode slots); row 1 runs two steps alone first
    rows = []
    for f in (0, 1, 0):
        p = prefixes[f]
        n = int(p.num_tokens[0])
        own = torch.arange(next_slot, next_slot + 8)
        next_slot += 8
        rows.append({'slots': torch.cat([p.slots[0, :n], own]), 'base': n, 'fed': 0})
    logits = []
    for active in ([1], [1], [0, 1, 2], [0, 1, 2], [0, 1, 2]):
        sel = [rows[i] for i in active]
        pos = torch.tensor([r['base'] + r['fed'] for r in sel])
        width = int(pos.max())
        ctx = torch.stack([torch.nn.functional.pad(r['slots'][:width],
                                                   (0, width - min(width, len(r['slots']))))
                           for r in sel])
        ctx_mask = torch.arange(width)[None] < pos[:, None]
        write = torch.stack([r['slots'][int(q)] for r, q in zip(sel, pos)])
        toks = torch.randint(3, 1000, (len(sel),), generator=gen)
        logits.append(m.decode_step(toks, pos, cache, write, ctx, ctx_mask))
        for r in sel:
            r['fed'] += 1
    out['decode_logits'] = torch.cat(logits)
    out['k'], out['v'] = cache.k.clone(), cache.v.clone()
    return out


@pytest.mark.parametrize('preset,mode', [('tiny', BIDIR), ('tiny', CAUSAL), ('small', CAUSAL)])
def test_graphs_in_onnxruntime_match_the_model(exported, preset, mode):
    model, _, _, runner = exported(preset, mode)
    with torch.inference_mode():
        want = _scenario(model, KVCache(model.cfg.vlm, 2048), mode)
        got = _scenario(runner, KVCache(model.cfg.vlm, 2048), mode)
    assert want.keys() == got.keys()
    for key in want:
        if want[key].dtype in (torch.bool, torch.int64):
            assert torch.equal(got[key], want[key]), key
        else:
            torch.testing.assert_close(got[key], want[key], atol=ATOL, rtol=0, msg=key)
    # the scenario is not degenerate: the frames differ, the pool was written
    assert (want['actions0'] - want['actions1']).abs().max() > 1e-2
    assert want['num_tokens1'].item() < want['num_tokens0'].item()
    assert (want['k'] != 0).any(dim=(0, 2, 3)).sum() > 2 * model.cfg.image_tokens_per_camera


def test_manifest_lists_every_graph_io_as_the_onnx_files_declare(exported):
    model, out, manifest, _ = exported('tiny', CAUSAL)
    doc = json.loads((out / 'manifest.json').read_text())
    assert set(doc['graphs']) == {g.value for g in GraphName}
    assert doc['preset'] == 'tiny' and doc['dtype'] == 'float32'
    assert doc['prefix_attention'] == 'causal_text'
    assert doc['weights_sha256'] == weights_sha256(model)
    assert doc['model_config']['vlm']['width'] == model.cfg.vlm.width
    types = {onnx.TensorProto.FLOAT: 'float32', onnx.TensorProto.INT64: 'int64',
             onnx.TensorProto.BOOL: 'bool'}
    for name, g in doc['graphs'].items():
        proto = onnx.load(str(out / g['file']), load_external_data=False)
        assert proto.ir_version == doc['ir_version'] == 8
        assert {(o.domain, o.version) for o in proto.opset_import} == {('', doc['opset'])}
        assert doc['opset'] == 17
        declared = []
        for values in (proto.graph.input, proto.graph.output):
            declared.append([
                {'name': v.name, 'dtype': types[v.type.tensor_type.elem_type],
                 'shape': [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]}
                for v in values])
        assert declared == [g['inputs'], g['outputs']], name
        dims = {d for t in g['inputs'] + g['outputs'] for d in t['shape'] if isinstance(d, str)}
        assert set(g['dynamic_dims']) == dims and dims
        props = {p.key: p.value for p in proto.metadata_props}
        assert props['oxygen_ros.weights_sha256'] == doc['weights_sha256']
        assert props['oxygen_ros.graph'] == name
    decode = doc['graphs']['decode']
    assert {t['name']: t['shape'] for t in decode['outputs']}['logits'] == [
        'batch', model.cfg.vocab_size]
    assert load_manifest(out) == manifest


def test_manifest_that_disagrees_with_its_onnx_files_is_refused(exported, tmp_path):
    _, out, _, _ = exported('tiny', CAUSAL)
    copy = tmp_path / 'copy'
    shutil.copytree(out, copy)
    doc = json.loads((copy / 'manifest.json').read_text())
    doc['graphs']['decode']['inputs'][2]['shape'] = ['batch', 1]
    doc['graphs']['lm_head']['outputs'][0]['dtype'] = 'float16'
    (copy / 'manifest.json').write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r'(?s)does not match its ONNX files.*decode inputs.*'
                                         r'lm_head outputs'):
        load_manifest(copy)
    (copy / WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match='weights.bin'):
        load_manifest(copy)


def test_weights_file_holds_each_parameter_once_and_the_hash_tracks_it(exported):
    model, out, _, _ = exported('tiny', CAUSAL)
    proto = onnx.load(str(out / 'decode.onnx'))       # external data resolved
    state = model.state_dict()
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer
             if i.name.startswith('model.')}
    assert 'model.embedding' in inits             # tied LM head: one initializer
    for name, value in inits.items():
        np.testing.assert_array_equal(value, state[name[len('model.'):]].numpy())
    assert (out / WEIGHTS_FILE).stat().st_size >= sum(t.nbytes for t in state.values())
    before = weights_sha256(model)
    torch.manual_seed(1)
    twin = build_model(model.cfg)
    assert weights_sha256(twin) == before
    with torch.no_grad():
        twin.time_mlp_in.bias[3] += 1e-6
    assert weights_sha256(twin) != before


def test_float16_graphs_run_and_bfloat16_graphs_pass_the_checker(exported):
    model16, _, manifest16, runner16 = exported('tiny', BIDIR, torch.float16)
    assert manifest16.dtype == 'float16'
    with torch.inference_mode():
        hidden = torch.randn(3, model16.cfg.vlm.width).half()
        torch.testing.assert_close(runner16.lm_logits(hidden), model16.lm_logits(hidden),
                                   atol=2e-2, rtol=2e-2)
        size = model16.cfg.vision.image_size
        images = torch.rand(1, 2, 3, size, size) * 2 - 1
        torch.testing.assert_close(runner16.encode_images(images),
                                   model16.encode_images(images), atol=3e-2, rtol=3e-2)
    # bfloat16: onnx.checker (full check, shape inference) ran inside export_graphs;
    # onnxruntime has no CPU kernels for it (TensorRT runs it)
    model_bf, out_bf, manifest_bf, _ = exported('tiny', CAUSAL, torch.bfloat16)
    spec = manifest_bf.graphs[GraphName.DECODE].spec
    assert {t.name: t.dtype for t in spec.outputs} == {
        'logits': 'float32', 'last_hidden': 'bfloat16', 'k_new': 'bfloat16',
        'v_new': 'bfloat16'}
    emb = next(i for i in onnx.load(str(out_bf / 'lm_head.onnx')).graph.initializer
               if i.name == 'model.embedding')
    assert emb.data_type == onnx.TensorProto.BFLOAT16
    assert torch.equal(torch.frombuffer(bytearray(emb.raw_data), dtype=torch.bfloat16),
                       model_bf.embedding.detach().reshape(-1))


def test_embedded_weights_make_self_contained_files(tmp_path):
    torch.manual_seed(2)
    model = build_model(get_preset('tiny').model)
    export_graphs(model, tmp_path / 'a', graphs=(GraphName.LM_HEAD,),
                  storage=WeightStorage.EMBEDDED)
    assert not (tmp_path / 'a' / WEIGHTS_FILE).exists()
    shutil.move(tmp_path / 'a' / 'lm_head.onnx', tmp_path / 'moved.onnx')
    (tmp_path / 'a' / 'lm_head.onnx').symlink_to(tmp_path / 'moved.onnx')
    runner = GraphRunner(model.cfg, torch.float32, 'cpu',
                         OrtExecutor(tmp_path / 'a', graphs=(GraphName.LM_HEAD,)))
    hidden = torch.randn(2, model.cfg.vlm.width)
    with torch.inference_mode():
        torch.testing.assert_close(runner.lm_logits(hidden), model.lm_logits(hidden),
                                   atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match='at least one graph'):
        export_graphs(model, tmp_path / 'b', graphs=())


def test_export_cli(tmp_path, capsys):
    assert export_main(['--preset', 'tiny', '--out', str(tmp_path / 'x'), '--graphs',
                        'lm_head', 'decode', '--dtype', 'float16']) == 0
    manifest = load_manifest(tmp_path / 'x')
    assert set(manifest.graphs) == {GraphName.LM_HEAD, GraphName.DECODE}
    assert manifest.dtype == 'float16'
    assert 'weights sha256' in capsys.readouterr().out
    assert export_main(['--preset', 'tiny', '--out', str(tmp_path / 'y'), '--graphs',
                        'encoder']) == 2
    assert "'encoder' is not a valid GraphName" in capsys.readouterr().err


def test_export_cli_refuses_a_checkpoint_of_another_preset(tmp_path, capsys):
    torch.manual_seed(0)
    save_checkpoint(build_model(get_preset('tiny').model), tmp_path / 'ckpt')
    rc = export_main(['--preset', 'demo', '--checkpoint', str(tmp_path / 'ckpt'),
                      '--out', str(tmp_path / 'out')])
    err = capsys.readouterr().err
    assert rc == 2
    assert "does not fit preset 'demo'" in err
    assert "matches preset 'tiny'" in err and 'vlm.width: checkpoint 16' in err
    assert not (tmp_path / 'out' / 'manifest.json').exists()
