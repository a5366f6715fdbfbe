"""
The model calls of a control cycle, timed one by one, and the action path's parity (GPU session).

What ``gpu_phases`` measures for ``oxygen_bench gpu``: on the model (eager) or the fast path
(``FastPathModel``), the median wall time of each call the engine makes (vision, prefill of
the whole prefix, two text requests' causal suffixes on it, the 10-step denoise, RTC's guided
10-step denoise where asked, a decode step at several batch sizes over a long context, the LM
head), the outputs of one untimed pass, and the parity of the fast path's outputs against
eager with eager float32 as the reference (``backends/parity.py``'s rule); the attention of
a decode step, of the prefill's prefix and of SigLIP alone, kernel by kernel. Defaults: the
deployment case (``pi05_droid``, bfloat16, 3 cameras, 50 prompt tokens; docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import statistics
import time
from typing import Any, Callable

DECODE_BATCHES = (1, 8, 32)
K_STEPS, K_STEPS_BATCH = 5, 8
"""The decode of k steps in one replay timed (``decode_k_steps_b8``): the paper's k = 5."""


@dataclass(frozen=True)
class Workload:
    """
    The calls timed and their sizes.

    :ivar decode_ctx: context slots of each decode row (inside the fast path's context
        buckets: a 30-token decode budget on the longest prefix).
    :ivar repeats: timed calls per component (median reported), after one untimed call.
    """

    preset: str = 'pi05_droid'
    dtype: str = 'bfloat16'
    device: str = 'cuda'
    cameras: int = 3
    prompt_tokens: int = 50
    decode_batches: tuple[int, ...] = DECODE_BATCHES
    decode_ctx: int = 900
    repeats: int = 20
    seed: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def prefix_tokens(self) -> int:
        from oxygen_ros.config import get_preset
        return self.cameras * get_preset(self.preset).model.image_tokens_per_camera + \
            self.prompt_tokens

    def model_config(self):
        """Return the preset's network (the workload's ``cameras`` are given apart)."""
        from oxygen_ros.config import get_preset
        return get_preset(self.preset).model

    def num_blocks(self, block_size: int = 16) -> int:
        """Return a KV pool for the probes: the context, every decode row, and room."""
        slots = block_size + max(self.decode_ctx, self.prefix_tokens) + \
            2 * max(self.decode_batches) + 4096
        return -(-slots // block_size) + 1

    def build_model(self):
        """Return random weights of the workload's model (seeded)."""
        import torch

        from oxygen_ros.model.pi05 import build_model
        torch.manual_seed(self.seed)
        return build_model(self.model_config(), dtype=getattr(torch, self.dtype),
                           device=self.device)

    def sync(self) -> Callable[[], None]:
        import torch
        return torch.cuda.synchronize if self.device.startswith('cuda') else (lambda: None)


def timed_ms(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Return the median wall time of ``fn`` in ms (one untimed call first)."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def run_components(model: Any, cache: Any, work: Workload, *, timed: bool = True,
                   guided: bool = False) -> dict:
    """
    Run (and time) the calls the engine makes on ``model`` over ``cache``.

    :param model: ``Pi05Model`` or ``FastPathModel`` (calls with token masks None, as the
        backend makes them; decode through ``greedy_calls``, as the engine decodes).
    :param guided: also RTC's guided denoise (``guided_denoise_10_steps``, output
        ``guided_actions``) on the same prefix and noise, guided as the bench's probe guides
        (``probe.probe_guidance``): the fast path's graph, or the eager reference.
    :returns: ``{'ms': {component: median ms}, 'outputs': {name: tensor}}`` (``ms`` empty
        when not ``timed``).
    """
    import torch

    from oxygen_ros.backends.greedy import greedy_calls
    from oxygen_ros.model.kv_cache import PrefixKV
    from oxygen_ros.tools.bench.probe import guided_call, probe_guidance

    greedy, seed = greedy_calls(model)
    cfg, dev, sync = model.cfg, cache.k.device, work.sync()
    gen = torch.Generator().manual_seed(work.seed)
    size = cfg.vision.image_size
    images = (torch.rand(1, work.cameras, 3, size, size, generator=gen) * 2 - 1).to(
        dev, model.dtype)
    tokens = torch.randint(3, 1000, (1, work.prompt_tokens), generator=gen).to(dev)
    p = work.prefix_tokens
    slots = torch.arange(16, 16 + p, device=dev)[None]     # block 0 is the null block
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(dev)
    out, ms = {}, {}

    def time_it(name: str, fn: Callable[[], object]) -> None:
        if timed:
            ms[name] = timed_ms(fn, work.repeats, sync)
    with torch.inference_mode():
        embeds = model.encode_images(images)
        out['image_embeds'] = embeds
        time_it('vision', lambda: model.encode_images(images))
        prefix = model.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots)
        out['prefix_hidden'] = prefix.last_hidden
        time_it('prefill', lambda: model.prefill(tokens, None, image_embeds=embeds,
                                                 cache=cache, slots=slots))
        # two text requests on the action prefix: a 4-token suffix each (e.g. "Memory: ")
        rows = PrefixKV(cache, prefix.slots.expand(2, -1), prefix.mask.expand(2, -1),
                        prefix.num_tokens.expand(2), prefix.last_hidden.expand(2, -1))
        suffix = torch.randint(3, 1000, (2, 4), generator=gen).to(dev)
        suffix_slots = 16 + p + torch.arange(8, device=dev).view(2, 4)
        out['suffix_hidden'] = model.prefill_suffix(suffix, None, rows,
                                                    slots=suffix_slots).last_hidden
        time_it('suffix', lambda: model.prefill_suffix(suffix, None, rows, slots=suffix_slots))
        out['actions'] = model.denoise(prefix, noise)
        time_it('denoise_10_steps', lambda: model.denoise(prefix, noise))
        if guided:
            call = guided_call(model)
            guidance = probe_guidance(cfg.action_horizon, cfg.action_dim, dev)
            out['guided_actions'] = call(prefix, noise, guidance)
            time_it('guided_denoise_10_steps', lambda: call(prefix, noise, guidance))
        ctx_len = max(work.decode_ctx, p)
        for b in work.decode_batches:
            ctx = torch.cat([slots[0], 16 + p + torch.arange(ctx_len - p, device=dev)])
            ctx = ctx[None].expand(b, ctx_len).contiguous()
            mask = torch.ones(b, ctx_len, dtype=torch.bool, device=dev)
            write = 16 + ctx_len + torch.arange(b, device=dev)
            toks = torch.randint(3, 1000, (b,), generator=gen).to(dev)
            pos = torch.full((b,), ctx_len, dtype=torch.int64, device=dev)

            def step(toks=toks, pos=pos, write=write, ctx=ctx, mask=mask):
                return greedy(toks, pos, cache, write, ctx, mask)
            out[f'decode_logits_b{b}'] = model.decode_step(toks, pos, cache, write, ctx, mask)
            time_it(f'decode_step_b{b}', step)
            if b == K_STEPS_BATCH and getattr(model, 'decode_greedy_steps', None):
                time_k_steps(model, cache, work, toks, ctx, time_it)
        hidden = prefix.last_hidden.expand(max(work.decode_batches), -1).contiguous()
        time_it('lm_head', lambda: seed(hidden))
    return {'ms': ms, 'outputs': out}


def time_k_steps(model: Any, cache: Any, work: Workload, tokens: Any, ctx: Any,
                 time_it: Callable[[str, Callable[[], object]], None]) -> None:
    """
    Time ``decode_k_steps_b<B>``: a decode job's ``K_STEPS`` steps as one graph replay.

    ``model.decode_greedy_steps`` (the fast path's ``Step.DECODE_STEPS``) on the decode rows
    of ``run_components`` (context ``ctx [B, C]``, cut to fit the largest compiled context
    with the new tokens: the tiny preset's dry run), each row writing ``K_STEPS`` new slots;
    compare with ``K_STEPS`` x ``decode_step_b<B>`` (one replay per step).

    :raises RuntimeError: the fast path has no graph for it (its warm-up fell back).
    """
    import torch

    b, c = ctx.shape[0], min(ctx.shape[1], model.shapes.ctx[-1] - K_STEPS)
    ctx, dev = ctx[:, :c], ctx.device
    own = 16 + c + 2 * max(work.decode_batches) + torch.arange(b * K_STEPS, device=dev)
    all_slots = torch.cat([ctx, own.view(b, K_STEPS)], 1)
    base = torch.full((b,), c, dtype=torch.int64, device=dev)
    steps = torch.full((b,), K_STEPS, dtype=torch.int64, device=dev)

    def k_steps() -> object:
        ids = model.decode_greedy_steps(tokens, base, steps, all_slots, 0, cache, K_STEPS)
        if ids is None:
            raise RuntimeError(f'no decode graph of {K_STEPS} steps at batch {b}, context {c}')
        return ids
    k_steps()
    time_it(f'decode_k_steps_b{b}', k_steps)


def time_decode_attention(work: Workload) -> dict:
    """
    Time the attention of one decode step alone, every layer: the paged kernel vs the gather.

    The paged Triton kernel (``backends/fast_path/kernels/paged_decode.py``, the context read in
    place) against what decode did before it (per layer ``index_select`` of the context, ``cat`` of
    the new K/V, matrix-product attention with its float32 K, PyTorch's eager kernels): each as
    ``depth`` calls (one per layer) captured in one CUDA graph, as inside the decode graph, median
    of ``repeats`` replays at each decode batch over ``decode_ctx`` slots.

    :returns: per batch ``b<B>``: ``paged_us``, ``gathered_us``, ``kv_bytes`` (context K and
        V read per step) and ``paged_gb_per_s``; ``{'skipped': why}`` off CUDA.
    """
    import torch

    from oxygen_ros.backends.fast_path.paged_attention import load_kernel, paged_attention
    from oxygen_ros.model.layers import attention, AttentionMask, matmul_short_queries

    if not work.device.startswith('cuda'):
        return {'skipped': 'timed on CUDA only (on the CPU the kernel runs interpreted)'}
    load_kernel()
    vlm, dtype, dev = work.model_config().vlm, getattr(torch, work.dtype), work.device
    hq, hkv, d, depth = vlm.num_heads, vlm.num_kv_heads, vlm.head_dim, vlm.depth
    ctx = max(work.decode_ctx, work.prefix_tokens)
    gen = torch.Generator(device=dev).manual_seed(work.seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=dtype)
    k_pool, v_pool = randn(depth, ctx + 16, hkv, d), randn(depth, ctx + 16, hkv, d)
    out = {}
    for b in work.decode_batches:
        q, k_new, v_new = randn(b, 1, hq, d), randn(b, 1, hkv, d), randn(b, 1, hkv, d)
        slots = (16 + torch.arange(ctx, device=dev)).expand(b, ctx).contiguous()
        mask = torch.ones(b, ctx, dtype=torch.bool, device=dev)
        index = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        valid = torch.ones(b, 1, dtype=torch.bool, device=dev)
        bias = AttentionMask.build(torch.ones(b, 1, ctx + 1, dtype=torch.bool, device=dev),
                                   hq, hkv, dtype)

        def paged() -> None:
            for i in range(depth):
                paged_attention(q, index, k_pool[i], v_pool[i], slots, mask, k_new, v_new,
                                valid)

        def gathered() -> None:
            flat = slots.reshape(-1)
            for i in range(depth):
                kk = torch.cat([k_pool[i].index_select(0, flat).view(b, ctx, hkv, d), k_new], 1)
                vv = torch.cat([v_pool[i].index_select(0, flat).view(b, ctx, hkv, d), v_new], 1)
                attention(q, kk.transpose(1, 2), vv.transpose(1, 2), bias)
        with matmul_short_queries(True):
            times = {name: _graph_replay_us(fn, work.repeats)
                     for name, fn in (('paged_us', paged), ('gathered_us', gathered))}
        kv_bytes = 2 * depth * b * ctx * hkv * d * k_pool.element_size()
        out[f'b{b}'] = {**times, 'kv_bytes': kv_bytes,
                        'paged_gb_per_s': kv_bytes / times['paged_us'] / 1e3}
    return out


def time_prefix_attention(work: Workload, compiler: str = 'inductor') -> dict:
    """
    Time the prefill's and SigLIP's attention alone, kernel by kernel, and compare outputs.

    Prefill: the ``depth - 1`` full-prefix attention calls of one prefill (the workload's
    prefix in its prompt bucket, padding masked; random post-RoPE Q/K/V, one set per layer)
    as ``PrefillCall`` makes them: ``sdpa``, the mask built once as a dense bias
    (``layers.AttentionMask``) and PyTorch's SDPA kernel choice per layer (cuDNN on the H100
    with torch 2.11); ``flex``, the block mask built once from the per-row vectors and
    FlexAttention per layer (``model/flex.py``); ``block_mask``, the block mask alone. Vision:
    SigLIP's ``depth`` unmasked calls ``[cameras, heads, 256, 72]`` (Q/K/V views of one
    projection, as ``SiglipBlock``) with PyTorch's choice (``sdpa``), each SDPA kernel alone
    and FlexAttention. Each is compiled (``compiler``, fullgraph; the SDPA kernels of vision
    run eagerly: Inductor calls the same ATen kernel) and, on CUDA, captured in one CUDA graph
    (median replay, as inside the fast path's graphs); on the CPU timed as called.

    :returns: ``{'prefill': {tokens, valid, layers, sdpa_us, flex_us, block_mask_us,
        max_abs_diff}, 'vision': {sdpa_us, cudnn_us, flash_us, efficient_us, math_us,
        flex_us, max_abs_diff}}``; a kernel that cannot run these calls: ``{kernel: error}``.
    """
    import torch
    from torch.nn.attention import sdpa_kernel, SDPBackend

    from oxygen_ros.backends.fast_path.buckets import bucket_for, prompt_buckets
    from oxygen_ros.model.flex import prefix_attention, prefix_block_mask
    from oxygen_ros.model.layers import attention, AttentionMask
    from oxygen_ros.model.masks import make_attn_mask, text_ar

    cfg, dtype, dev = work.model_config(), getattr(torch, work.dtype), work.device
    vlm, vis = cfg.vlm, cfg.vision
    gen = torch.Generator(device=dev).manual_seed(work.seed)
    cuda = dev.startswith('cuda')

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=dtype)

    def timed_us(fn: Callable[[], object]) -> float:
        if cuda:
            return _graph_replay_us(fn, work.repeats)
        return 1e3 * timed_ms(fn, work.repeats, work.sync())

    def run(name: str, fn: Callable[[], object], out: dict) -> object:
        try:
            result = fn()
            out[f'{name}_us'] = timed_us(fn)
            return result
        except Exception as exc:  # noqa: B902 - a kernel that cannot run these calls
            out[name] = f'{type(exc).__name__}: {exc}'[:300]
            return None

    ti = cfg.image_tokens_per_camera
    count = work.cameras * ti + work.prompt_tokens
    p = work.cameras * ti + bucket_for(work.prompt_tokens, prompt_buckets(cfg.max_token_len))
    layers = vlm.depth - 1
    q = randn(layers, 1, p, vlm.num_heads, vlm.head_dim)
    k, v = (randn(layers, 1, p, vlm.num_kv_heads, vlm.head_dim).transpose(2, 3)
            for _ in range(2))
    valid = (torch.arange(p, device=dev) < count)[None]
    ar = torch.cat([torch.zeros(1, work.cameras * ti, dtype=torch.int64, device=dev),
                    torch.full((1, p - work.cameras * ti), text_ar(cfg.prefix_attention),
                               device=dev)], 1)

    def dense(q, k, v, valid, ar):
        mask = make_attn_mask(valid, ar) | torch.eye(valid.shape[1], dtype=torch.bool,
                                                     device=valid.device)
        bias = AttentionMask.build(mask, vlm.num_heads, vlm.num_kv_heads, q.dtype)
        return tuple(attention(q[i], k[i], v[i], bias) for i in range(layers))

    def flex(q, k, v, valid, ar):
        block = prefix_block_mask(valid, ar)
        return tuple(prefix_attention(q[i], k[i], v[i], block) for i in range(layers))

    def block_mask(valid, ar):
        block = prefix_block_mask(valid, ar)
        return block.kv_num_blocks, block.kv_indices, block.full_kv_num_blocks

    def compiled(fn: Callable, *args: torch.Tensor) -> Callable[[], object]:
        call = torch.compile(fn, backend=compiler, fullgraph=True)
        return lambda: call(*args)
    prefill = {'tokens': p, 'valid': count, 'layers': layers, 'mode': cfg.prefix_attention.value}
    with torch.inference_mode():
        want = run('sdpa', compiled(dense, q, k, v, valid, ar), prefill)
        got = run('flex', compiled(flex, q, k, v, valid, ar), prefill)
        run('block_mask', compiled(block_mask, valid, ar), prefill)
        if want is not None and got is not None:
            prefill['max_abs_diff'] = _max_abs_diff(got, want)

        m, t, h = work.cameras, vis.num_tokens, vis.num_heads
        qkv = randn(vis.depth, m, t, 3 * vis.width).view(vis.depth, m, t, 3, h, -1)
        qkv = qkv.permute(3, 0, 1, 4, 2, 5)             # [3, depth, M, H, T, D] views

        def sdpa_vision() -> tuple[torch.Tensor, ...]:
            return tuple(torch.nn.functional.scaled_dot_product_attention(*qkv[:, i])
                         for i in range(vis.depth))

        def flex_vision(qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
            from torch.nn.attention.flex_attention import flex_attention
            return tuple(flex_attention(*qkv[:, i]) for i in range(vis.depth))

        def restricted(kernel: SDPBackend) -> Callable[[], object]:
            def fn() -> object:
                with sdpa_kernel([kernel]):
                    return sdpa_vision()
            return fn
        vision: dict = {'calls': vis.depth, 'shape': [m, h, t, vis.width // h]}
        want = run('sdpa', sdpa_vision, vision)
        for name, kernel in (('cudnn', SDPBackend.CUDNN_ATTENTION),
                             ('flash', SDPBackend.FLASH_ATTENTION),
                             ('efficient', SDPBackend.EFFICIENT_ATTENTION),
                             ('math', SDPBackend.MATH)):
            run(name, restricted(kernel), vision)
        got = run('flex', compiled(flex_vision, qkv), vision)
        if want is not None and got is not None:
            vision['max_abs_diff'] = _max_abs_diff(got, want)
    return {'prefill': prefill, 'vision': vision}


def _max_abs_diff(got: tuple, want: tuple) -> float:
    """Return the largest ``|got - want|`` over tuples of tensors, in float32."""
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(got, want))


def _graph_replay_us(fn: Callable[[], None], repeats: int) -> float:
    """Return the median time of one replay of a CUDA graph of ``fn``, in microseconds."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times[1:])


def denoise_entry(ms: dict[str, float], cfg: Any, used: str) -> dict:
    """
    Return how the timed denoise ran and its time per layer-step.

    :param ms: ``run_components``' medians (``denoise_10_steps``).
    :param cfg: the model's ``ModelConfig``.
    :param used: ``paged_attention.denoise_attention``: ``'fused'`` (the Triton kernels of
        ``backends/fast_path/denoise_fused.py``) or ``'gathered'``.
    :returns: ``used``, ``layer_steps`` (expert depth x Euler steps) and
        ``us_per_layer_step`` (None where the denoise was not timed).
    """
    steps = cfg.expert.depth * cfg.num_denoise_steps
    total = ms.get('denoise_10_steps')
    return {'used': used, 'layer_steps': steps,
            'us_per_layer_step': None if total is None else 1e3 * total / steps}


def pipeline_parity(fast: dict, eager: dict, reference: dict | None,
                    work: Workload) -> dict:
    """
    Hold the fast path's outputs against eager, eager float32 being the reference.

    :param fast: ``run_components(...)['outputs']`` of the fast path; ``eager`` and
        ``reference`` likewise of the eager model and its float32 copy (None: float32).
    :returns: per output the error, tolerance, eager's own distance to float32 and
        ``passed``; ``passed`` overall; the rule.
    """
    from oxygen_ros.backends.parity import check_parity

    result = {}
    decode = tuple(f'decode_logits_b{b}' for b in work.decode_batches)
    guided = ('guided_actions',) if 'guided_actions' in fast else ()
    for key in ('actions', 'prefix_hidden', 'suffix_hidden') + guided + decode:
        r = check_parity(key, [fast[key]], [eager[key]],
                         None if reference is None else [reference[key]])
        result[key] = {'error': r.error, 'tolerance': r.tolerance,
                       'eager_vs_float32': r.reference_error, 'passed': r.passed}
    return {'passed': all(r['passed'] for r in result.values()), 'outputs': result,
            'rule': 'max|fast - eager| <= max(1e-4 * scale, 3 * max|eager - eager_fp32|)'}


def roofline_entry(ms: dict[str, float], work: Workload, gpu_name: str, *,
                   fp8_weights: bool = False) -> dict:
    """
    Return each component beside its bound on ``gpu_name`` and the paper-workload cycle.

    :param fp8_weights: the bounds of FP8 weights (``call_costs.py``).
    """
    from oxygen_ros.engine.config import DTYPE_BYTES
    from oxygen_ros.tools.bench.gpu_specs import lookup_gpu
    from oxygen_ros.tools.bench.roofline import component_costs, paper_cycle, roofline

    costs = component_costs(work.model_config(), cameras=work.cameras,
                            prompt_tokens=work.prompt_tokens,
                            decode_batches=list(work.decode_batches),
                            decode_ctx=work.decode_ctx,
                            dtype_bytes=DTYPE_BYTES[work.dtype], fp8_weights=fp8_weights)
    rows = roofline(ms, costs, lookup_gpu(gpu_name))
    batch = work.decode_batches[1] if len(work.decode_batches) > 1 else work.decode_batches[0]
    return {'roofline': rows,
            'paper_cycle': paper_cycle(rows, tokens_per_cycle=5,
                                       batch_name=f'decode_step_b{batch}')}


__all__ = ['DECODE_BATCHES', 'K_STEPS', 'K_STEPS_BATCH', 'Workload', 'denoise_entry',
           'pipeline_parity', 'roofline_entry', 'run_components', 'time_decode_attention',
           'time_k_steps', 'time_prefix_attention', 'timed_ms']
