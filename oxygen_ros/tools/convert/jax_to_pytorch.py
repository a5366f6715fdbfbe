"""
openpi JAX checkpoint folder → oxygen_ros checkpoint folder, one tensor at a time.

Input: an openpi checkpoint (``params/`` orbax + ``assets/<asset_id>/norm_stats.json``), as
released (``gs://openpi-assets/checkpoints/pi05_*``) or saved by openpi training
(``<run>/<step>/``). Output: ``model.safetensors`` in the openpi-PyTorch layout (what openpi's
``examples/convert_jax_model_to_pytorch.py`` writes, loadable by ``weights.load_checkpoint``),
``assets/`` copied from the checkpoint's own folder (openpi's converter takes the parent's,
Physical-Intelligence/openpi#638), ``config.json`` as openpi's converter writes it and a manifest
``oxygen_convert.json`` (source, preset, precision, date).

Memory: each JAX array is read whole, converted layer by layer and written before the next is
read (peak ≈ twice the largest array: the 18-layer Gemma MLP kernel, 4.8 GB in float32).
"""

from __future__ import annotations

from dataclasses import dataclass
import datetime
import json
import logging
from pathlib import Path
import shutil

from oxygen_ros.checkpoint.keys import config_dims, key_map
from oxygen_ros.checkpoint.weights import CONFIG_FILE, openpi_config, WEIGHTS_FILE
from oxygen_ros.config import get_preset, ModelConfig, preset_names
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.tools.convert.jax_layout import jax_dims, PI0_MARKERS, sources
from oxygen_ros.tools.convert.orbax_reader import ConvertError, OrbaxParams, params_dir
from oxygen_ros.tools.convert.safetensors_stream import SafetensorsStreamWriter
from oxygen_ros.transforms.norm_stats import known_asset_ids
import torch
from tqdm import tqdm

_LOG = logging.getLogger(__name__)

MANIFEST_FILE = 'oxygen_convert.json'
PRECISIONS = {'bfloat16': torch.bfloat16, 'float32': torch.float32}


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What :func:`convert_checkpoint` wrote."""

    out_dir: Path
    preset: str
    precision: str
    num_tensors: int
    nbytes: int
    asset_ids: tuple[str, ...]


def _name(path: tuple[str, ...]) -> str:
    return '/'.join(path)


def choose_preset(dims: dict[str, int], preset: str | ModelConfig | None,
                  asset_ids: list[str]) -> ModelConfig:
    """
    Return the preset named (checked against the checkpoint's dims) or the one that fits.

    Without a name: the presets whose dims all agree, narrowed to those whose asset id the
    checkpoint holds; exactly one must remain.

    :raises ConvertError: unknown preset, a preset that does not fit (the disagreeing dims
        and the presets that fit), or no / several candidates.
    """
    fitting = [n for n in preset_names()
               if all(config_dims(get_preset(n).model).get(k) == v for k, v in dims.items())]
    if preset is not None:
        try:
            cfg = preset if isinstance(preset, ModelConfig) else get_preset(preset).model
        except ValueError as exc:
            raise ConvertError(str(exc)) from None
        ours = config_dims(cfg)
        diff = [f'{k}: checkpoint {v}, preset {ours[k]}' for k, v in dims.items()
                if ours.get(k) != v]
        if diff:
            fits = ', '.join(repr(n) for n in fitting) or 'no registered preset'
            raise ConvertError(f'preset {cfg.name!r} does not fit the checkpoint: '
                               f'{"; ".join(diff)} (fits: {fits})')
        return cfg
    if not fitting:
        raise ConvertError(f'no registered preset fits the checkpoint dims {dims}')
    by_asset = [n for n in fitting if get_preset(n).asset_id in asset_ids]
    chosen = by_asset if by_asset else fitting
    if len(chosen) > 1:
        raise ConvertError(f'several presets fit the checkpoint ({", ".join(chosen)}; its '
                           f'assets: {", ".join(asset_ids) or "none"}): pass --preset')
    return get_preset(chosen[0]).model


def convert_checkpoint(source: str | Path, out_dir: str | Path, *,
                       preset: str | ModelConfig | None = None,
                       precision: str = 'bfloat16', overwrite: bool = False,
                       progress: bool = True) -> ConvertResult:
    """
    Convert an openpi JAX π0.5 checkpoint into an oxygen_ros checkpoint folder.

    :param source: the checkpoint folder (holding ``params/`` and ``assets/``) or its
        ``params/``.
    :param out_dir: the folder to write (created).
    :param preset: the preset (name or config) the weights must fit (default: the one that
        fits; see :func:`choose_preset`).
    :param precision: ``bfloat16`` (openpi's converter default; norms, embeddings and the
        four heads of ``Pi05Model.float32_parameters`` stay float32) or ``float32``.
    :param overwrite: replace an existing ``model.safetensors`` (and ``assets/``).
    :param progress: show a tqdm bar (bytes written).
    :returns: what was written.
    :raises ConvertError: not an orbax checkpoint, a π0 tree, missing arrays (all listed), a
        preset that does not fit, an existing output, tensorstore not installed.
    """
    if precision not in PRECISIONS:
        raise ConvertError(f'precision must be one of {sorted(PRECISIONS)}, got {precision!r}')
    source, out_dir = Path(source).expanduser(), Path(out_dir).expanduser()
    folder = params_dir(source)
    ckpt = folder.parent if folder != source else source
    reader = OrbaxParams(folder)
    shapes = {p: reader.shape(p) for p in reader.paths}
    pi0 = [_name(p) for p in PI0_MARKERS if p in shapes]
    if pi0:
        raise ConvertError(f'{ckpt} is a π0 checkpoint, not π0.5 (it has {", ".join(pi0)}; '
                           'π0.5 has adaRMS Dense_0 norms in the action expert and no '
                           'state_proj): oxygen_ros runs π0.5 only')
    asset_ids = known_asset_ids(ckpt)
    cfg = choose_preset(jax_dims(shapes), preset, asset_ids)
    plan = sources(cfg)
    needed = list(dict.fromkeys(s.path for s in plan.values()))
    missing = [_name(p) for p in needed if p not in shapes]
    if missing:
        raise ConvertError(f'{folder}: {len(missing)} arrays missing for preset {cfg.name!r}: '
                           + ', '.join(missing))
    extra = sorted(_name(p) for p in set(shapes) - set(needed))
    if extra:
        _LOG.warning('%s: %d arrays not converted (no π0.5 parameter): %s', folder,
                     len(extra), ', '.join(extra))
    weights = out_dir / WEIGHTS_FILE
    if weights.exists() and not overwrite:
        raise ConvertError(f'{weights} exists (pass --overwrite to replace it)')
    out_dir.mkdir(parents=True, exist_ok=True)

    dtype = PRECISIONS[precision]
    with torch.device('meta'):
        dtypes = Pi05Model(cfg).parameter_dtypes(dtype)
    target = {name: (dtypes[e.ours], shape) for e in key_map(cfg)
              for name, shape in zip(e.theirs, e.shapes)}
    groups = {path: [n for n, s in plan.items() if s.path == path] for path in needed}
    layout = [(name, *target[name]) for path in needed for name in groups[path]]
    writer = SafetensorsStreamWriter(weights, layout, {'format': 'pt', 'source': str(ckpt),
                                                       'preset': cfg.name})
    try:
        with tqdm(total=writer.nbytes, unit='B', unit_scale=True, desc='oxygen_convert',
                  disable=not progress) as bar:
            for path in needed:
                array = reader.read(path)
                for name in groups[path]:
                    tensor = torch.from_numpy(plan[name].take(array))
                    writer.write(name, tensor)
                    bar.update(tensor.numel() * target[name][0].itemsize)
                del array
        writer.close()
    except BaseException as exc:
        writer.abort()
        if isinstance(exc, ValueError) and not isinstance(exc, ConvertError):
            raise ConvertError(f'{folder}: {exc}') from None
        raise
    _copy_assets(ckpt, out_dir, cfg, asset_ids, overwrite)
    _write_config(out_dir, ckpt, cfg, precision, len(layout), asset_ids)
    return ConvertResult(out_dir, cfg.name, precision, len(layout), writer.nbytes,
                         tuple(asset_ids))


def _copy_assets(ckpt: Path, out_dir: Path, cfg: ModelConfig, asset_ids: list[str],
                 overwrite: bool) -> None:
    src = ckpt / 'assets'
    if not src.is_dir():
        _LOG.warning('%s has no assets/: the converted folder has no norm stats; give the '
                     'node norm_stats:=/path/to/norm_stats.json', ckpt)
        return
    shutil.copytree(src, out_dir / 'assets', dirs_exist_ok=overwrite)
    asset_id = get_preset(cfg.name).asset_id if cfg.name in preset_names() else None
    if asset_id is not None and asset_id not in asset_ids:
        _LOG.warning("%s: no norm stats for preset %s's asset id %r (it has: %s); pass "
                     'norm_stats:= or choose the preset of these assets', src, cfg.name,
                     asset_id, ', '.join(asset_ids) or 'none')


def _write_config(out_dir: Path, ckpt: Path, cfg: ModelConfig, precision: str,
                  num_tensors: int, asset_ids: list[str]) -> None:
    config = openpi_config(cfg, precision)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
    manifest = {
        'tool': 'oxygen_convert', 'source': str(ckpt.resolve()), 'preset': cfg.name,
        'precision': precision,
        'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        'tensors': num_tensors, 'assets': asset_ids,
    }
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + '\n')


__all__ = ['ConvertResult', 'MANIFEST_FILE', 'choose_preset', 'convert_checkpoint']
