"""
Paged attention in Triton: new tokens attend a context read in place from the KV pool.

What a decode step (and a short causal suffix) computes in ``static_calls.py``'s
``ExtendCall``, and the action expert's attention in ``DenoiseCall`` (``model/
denoise_fused.py``), without gathering the context: each of the B rows has T new tokens whose
queries ``q [B, Tq, Hq, D]`` attend

- the row's context: pool slots ``ctx_slots [B, C]`` where ``ctx_mask [B, C]``, K and V read
  from the pool ``[num_slots, Hkv, D]`` of the layer by slot (``model/kv_cache.py``: slot =
  block id * block size + offset, so a block table is the slots of its blocks), and
- the row's new tokens ``k_new, v_new [B, T, Hkv, D]`` (not in the pool): query token i
  (its index among the new tokens is ``q_index[b, i]``) sees new token j when ``j == i``, or
  when both are valid (``new_valid``) and, with ``causal`` (text), ``j < i``: the causal
  rule of ``ExtendCall`` (``make_attn_mask`` with ``ar = 1`` or'ed with the diagonal);
  without (the action tokens of denoise, ``denoise.denoise_context``'s mask), every valid j.

Given ``cos``/``sin`` (denoise), q and k_new are the Q/K/V projection's output as it is
(views, read in place) and RoPE rotates them as they are loaded (``layers.apply_rope``'s
half-split rotation, float32, cast back): no RoPE kernel, no copy. The pool holds post-RoPE
keys, as always.

The query heads of one kv head (GQA: π0.5 has 8 on 1, head dim 256) are rows of one tile, so
K and V are read once per kv head. Flash-decoding (Tri Dao et al., "Flash-Decoding for
long-context inference", 2023; the split-KV kernels of vLLM and SGLang): the context is cut
into splits of ``SPLIT_LEN`` slots, one program each (stage 1, an online softmax per split
written as float32 partials), so that a batch of one row still spreads over many SMs; stage 2
attends the new tokens and merges the splits' partials by their maxima and sums.

``scale`` is a Python float; each kernel casts it to float32 itself, since Inductor passes a
float argument of a user-defined kernel as an fp64 scalar (pytorch/pytorch#170289), which would
promote the online softmax's state to fp64 and fail to build
(``docs/gpu.md#kernels-built-as-inductor-builds-them``).

Precision as ``layers.matmul_attention`` (openpi; ``docs/model.md#precision``): products of
operands in the query dtype accumulated in float32, scale ``D ** -0.5``, the softmax in float32
and its probabilities cast to the value dtype before ``p @ v``; float32 operands take IEEE
products (no TF32). The result equals softmax attention over the gathered context up to that
rounding.

Exposed as the custom operator ``oxygen_ros::paged_attention`` (``torch.library.triton_op``):
Dynamo and AOTAutograd trace through it, Inductor calls the two kernels from its generated
code, and a CUDA graph captures them (no host sync; every size is a shape, symbolic where the
caller marks it). Under ``TRITON_INTERPRET=1`` (CPU tests) the kernels are Triton's
interpreter's, which a compiler cannot trace on fake tensors: the operator is then opaque to
the compiler, with a shape function.
"""

from __future__ import annotations

from oxygen_ros.backends.fast_path.kernels.registration import (
    is_interpreted, kernel_operator, launch)
import torch
import triton
import triton.language as tl

SPLIT_LEN = 64
"""Context slots per stage-1 program: 16 programs per row and kv head over 1024 slots."""
BLOCK_N = 32
"""Context slots per tile of a stage-1 program (two tiles per split)."""
BLOCK_R = 16
"""Query rows (query tokens x query heads of one kv head) per program; ``tl.dot`` needs 16."""
BLOCK_T = 16
"""New tokens per tile in stage 2."""


@triton.jit
def _attend(q, kt, v, allowed, m, l, acc, scale, IEEE: tl.constexpr):  # noqa: E741, N803
    """Fold one tile of keys ``kt [D, N]`` and values ``v [N, D]`` into an online softmax."""
    if IEEE:
        qk = tl.dot(q, kt, input_precision='ieee')
    else:
        qk = tl.dot(q, kt)
    qk = tl.where(allowed, qk * scale, float('-inf'))
    m_new = tl.maximum(m, tl.max(qk, 1))
    base = tl.where(m_new == float('-inf'), 0.0, m_new)    # rows with nothing allowed yet
    alpha = tl.exp(m - base)
    p = tl.exp(qk - base[:, None])
    if IEEE:
        pv = tl.dot(p, v, input_precision='ieee')
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + pv


@triton.jit
def _rotate(x, x_at, cos_at, sin_at, dims, ok, HEAD_DIM: tl.constexpr):  # noqa: N803
    """
    Return ``x`` rotated by RoPE as ``layers.apply_rope`` (half-split, float32, cast back).

    ``x_at + d`` addresses element ``d`` of the loaded vectors, ``cos_at + i`` / ``sin_at + i``
    their angle ``i < D/2``; ``dims`` (the head dims, broadcast against them) and ``ok`` as
    ``x`` was loaded.
    """
    half: tl.constexpr = HEAD_DIM // 2
    lower = dims < half
    partner = tl.load(x_at + tl.where(lower, dims + half, dims - half), mask=ok, other=0.0)
    angle = tl.where(lower, dims, dims - half)
    c = tl.load(cos_at + angle, mask=ok, other=0.0)
    s = tl.load(sin_at + angle, mask=ok, other=0.0)
    return (x.to(tl.float32) * c + partner.to(tl.float32) * tl.where(lower, -s, s)).to(x.dtype)


@triton.jit
def _queries(q_ptr, index_ptr, cos_ptr, sin_ptr, b, kvh, rows, row_ok, dims, dim_ok,
             stride_qb, stride_qt, stride_cb, stride_ct, num_queries,
             GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROPE: tl.constexpr):  # noqa: N803
    """Load query rows ``[R, D]`` (token ``rows // GROUP``, head ``rows % GROUP`` of ``kvh``)."""
    token = rows // GROUP
    at = b * stride_qb + token * stride_qt + (kvh * GROUP + rows % GROUP) * HEAD_DIM
    ok = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + at[:, None] + dims[None, :], mask=ok, other=0.0)
    if ROPE:
        new = tl.load(index_ptr + b * num_queries + token, mask=row_ok, other=0)
        angle = b * stride_cb + new * stride_ct
        q = _rotate(q, q_ptr + at[:, None], cos_ptr + angle[:, None], sin_ptr + angle[:, None],
                    dims[None, :], ok, HEAD_DIM)
    return q


@triton.jit
def _context_partials(q_ptr, index_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, slots_ptr, keep_ptr,
                      acc_ptr, m_ptr, l_ptr, stride_qb, stride_qt, stride_cb, stride_ct,
                      stride_ks, stride_kh, stride_vs, stride_vh, stride_sb, stride_mb,
                      num_rows, ctx_len, split_len, num_splits, scale,
                      GROUP: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,  # noqa: N803
                      BLOCK_D: tl.constexpr, ROPE: tl.constexpr,  # noqa: N803
                      IEEE: tl.constexpr):  # noqa: N803
    """Stage 1: one (row, kv head, row block) over one split of the context."""
    scale = tl.cast(scale, tl.float32)     # Inductor passes a Python float as fp64
    pid = tl.program_id(0)
    split = tl.program_id(1)
    row_blocks = tl.cdiv(num_rows, BLOCK_R)
    b = pid // (KV_HEADS * row_blocks)
    kvh = (pid // row_blocks) % KV_HEADS
    rows = (pid % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q = _queries(q_ptr, index_ptr, cos_ptr, sin_ptr, b, kvh, rows, row_ok, dims, dim_ok,
                 stride_qb, stride_qt, stride_cb, stride_ct, num_rows // GROUP, GROUP,
                 HEAD_DIM, ROPE)
    m = tl.full([BLOCK_R], float('-inf'), tl.float32)
    l = tl.zeros([BLOCK_R], tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx_len)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        inside = cols < end
        slot = tl.load(slots_ptr + b * stride_sb + cols, mask=inside, other=0).to(tl.int64)
        keep = (tl.load(keep_ptr + b * stride_mb + cols, mask=inside, other=0) != 0) & inside
        kt = tl.load(k_ptr + slot[None, :] * stride_ks + kvh * stride_kh + dims[:, None],
                     mask=keep[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + dims[None, :],
                    mask=keep[:, None] & dim_ok[None, :], other=0.0)
        m, l, acc = _attend(q, kt.to(q.dtype), v.to(q.dtype), keep[None, :], m, l, acc,  # noqa
                            scale, IEEE)
    part = ((b * KV_HEADS + kvh) * num_splits + split) * num_rows + rows
    tl.store(m_ptr + part, m, mask=row_ok)
    tl.store(l_ptr + part, l, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
             mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def _new_tokens_and_merge(q_ptr, index_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, valid_ptr, acc_ptr,
                          m_ptr, l_ptr, out_ptr, stride_qb, stride_qt, stride_cb, stride_ct,
                          stride_kb, stride_kt, stride_vb, stride_vt,
                          num_rows, num_new, num_splits, scale,
                          GROUP: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                          BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,  # noqa: N803
                          BLOCK_D: tl.constexpr, ROPE: tl.constexpr,  # noqa: N803
                          CAUSAL: tl.constexpr, IEEE: tl.constexpr):  # noqa: N803
    """Stage 2: one (row, kv head, row block): the new tokens, then every split's partial."""
    scale = tl.cast(scale, tl.float32)     # Inductor passes a Python float as fp64
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(num_rows, BLOCK_R)
    b = pid // (KV_HEADS * row_blocks)
    kvh = (pid // row_blocks) % KV_HEADS
    rows = (pid % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    num_queries = num_rows // GROUP
    q = _queries(q_ptr, index_ptr, cos_ptr, sin_ptr, b, kvh, rows, row_ok, dims, dim_ok,
                 stride_qb, stride_qt, stride_cb, stride_ct, num_queries, GROUP, HEAD_DIM,
                 ROPE)
    own = tl.load(index_ptr + b * num_queries + rows // GROUP, mask=row_ok, other=0)
    own_valid = tl.load(valid_ptr + b * num_new + own, mask=row_ok, other=0) != 0
    m = tl.full([BLOCK_R], float('-inf'), tl.float32)
    l = tl.zeros([BLOCK_R], tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for j0 in range(0, num_new, BLOCK_T):
        cols = j0 + tl.arange(0, BLOCK_T)
        inside = cols < num_new
        valid = (tl.load(valid_ptr + b * num_new + cols, mask=inside, other=0) != 0) & inside
        k_at = b * stride_kb + cols * stride_kt + kvh * HEAD_DIM
        k_ok = inside[None, :] & dim_ok[:, None]
        kt = tl.load(k_ptr + k_at[None, :] + dims[:, None], mask=k_ok, other=0.0)
        if ROPE:
            angle = b * stride_cb + cols * stride_ct
            kt = _rotate(kt, k_ptr + k_at[None, :], cos_ptr + angle[None, :],
                         sin_ptr + angle[None, :], dims[:, None], k_ok, HEAD_DIM)
        v_at = b * stride_vb + cols * stride_vt + kvh * HEAD_DIM
        v = tl.load(v_ptr + v_at[:, None] + dims[None, :],
                    mask=inside[:, None] & dim_ok[None, :], other=0.0)
        seen = own_valid[:, None] & valid[None, :]
        if CAUSAL:
            seen = seen & (cols[None, :] < own[:, None])
        allowed = (cols[None, :] == own[:, None]) | seen
        m, l, acc = _attend(q, kt.to(q.dtype), v.to(q.dtype), allowed, m, l, acc,  # noqa
                            scale, IEEE)
    for s in range(0, num_splits):
        part = ((b * KV_HEADS + kvh) * num_splits + s) * num_rows + rows
        m_s = tl.load(m_ptr + part, mask=row_ok, other=float('-inf'))
        l_s = tl.load(l_ptr + part, mask=row_ok, other=0.0)
        acc_s = tl.load(acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                        mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        m_new = tl.maximum(m, m_s)
        base = tl.where(m_new == float('-inf'), 0.0, m_new)
        alpha, beta = tl.exp(m - base), tl.exp(m_s - base)
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        l = l * alpha + l_s * beta  # noqa: E741
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    out_rows = (b * num_queries + rows // GROUP) * (KV_HEADS * GROUP) + \
        kvh * GROUP + rows % GROUP
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


INTERPRETED = is_interpreted(_context_partials)
"""The kernels are Triton's CPU interpreter's (``TRITON_INTERPRET=1`` at import)."""


def _check(q: torch.Tensor, q_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           ctx_slots: torch.Tensor, ctx_mask: torch.Tensor, k_new: torch.Tensor,
           v_new: torch.Tensor, new_valid: torch.Tensor, cos: torch.Tensor | None,
           sin: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the first argument whose shape, dtype or device is wrong."""
    if q.dim() != 4 or k_pool.dim() != 3 or k_new.dim() != 4:
        raise ValueError(f'q [B, Tq, Hq, D], k_pool [S, Hkv, D] and k_new [B, T, Hkv, D] '
                         f'expected, got {tuple(q.shape)}, {tuple(k_pool.shape)}, '
                         f'{tuple(k_new.shape)}')
    b, tq, hq, d = q.shape
    hkv = k_pool.shape[1]
    t = k_new.shape[1]
    c = ctx_slots.shape[-1]
    want = {'v_pool': (v_pool, tuple(k_pool.shape)), 'k_new': (k_new, (b, t, hkv, d)),
            'v_new': (v_new, (b, t, hkv, d)), 'q_index': (q_index, (b, tq)),
            'ctx_slots': (ctx_slots, (b, c)), 'ctx_mask': (ctx_mask, (b, c)),
            'new_valid': (new_valid, (b, t))}
    if (cos is None) != (sin is None):
        raise ValueError('cos and sin go together (RoPE on load) or not at all')
    if cos is not None:
        want.update({'cos': (cos, (b, t, d // 2)), 'sin': (sin, (b, t, d // 2))})
    for name, (x, shape) in want.items():
        if tuple(x.shape) != shape:
            raise ValueError(f'{name} must be {list(shape)}, got {list(x.shape)}')
        if x.device != q.device:
            raise ValueError(f'{name} is on {x.device}, q on {q.device}')
    if k_pool.shape[2] != d or hq % hkv or t < 1:
        raise ValueError(f'q heads {hq} x {d} do not fit kv heads {hkv} x {k_pool.shape[2]} '
                         f'with {t} new tokens')
    if ctx_mask.dtype != torch.bool or new_valid.dtype != torch.bool:
        raise ValueError('ctx_mask and new_valid must be bool')
    if ctx_slots.dtype not in (torch.int32, torch.int64) or q_index.dtype != torch.int64:
        raise ValueError('ctx_slots must be int32 or int64, q_index int64')
    if cos is not None and (cos.dtype != torch.float32 or sin.dtype != torch.float32
                            or d % 2):
        raise ValueError('cos and sin must be float32 (and the head dim even)')
    if k_pool.stride(2) != 1 or v_pool.stride(2) != 1:
        raise ValueError('the pool needs its head dim contiguous')


def _packed_heads(x: torch.Tensor) -> torch.Tensor:
    """Return ``x [B, T, H, D]`` with its heads and dims packed (a view of a wider row is)."""
    return x if x.stride(3) == 1 and x.stride(2) == x.shape[3] else x.contiguous()


def _launch(q: torch.Tensor, q_index: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
            ctx_slots: torch.Tensor, ctx_mask: torch.Tensor, k_new: torch.Tensor,
            v_new: torch.Tensor, new_valid: torch.Tensor, cos: torch.Tensor | None = None,
            sin: torch.Tensor | None = None, causal: bool = True) -> torch.Tensor:
    """
    Softmax attention of new tokens over a context in the KV pool and over each other.

    :param q: ``[B, Tq, Hq, D]`` queries (not pre-scaled), the dtype of the operands; a view
        whose heads and dims are packed is read in place (e.g. of a fused Q/K/V projection).
    :param q_index: ``int64 [B, Tq]`` index among the T new tokens of each query token
        (``arange(T)`` for all of them, the last valid one alone after the last layer).
    :param k_pool: ``[num_slots, Hkv, D]`` post-RoPE keys of one layer (``KVCache.k[i]``).
    :param v_pool: ``[num_slots, Hkv, D]`` values of that layer.
    :param ctx_slots: ``int32 or int64 [B, C]`` pool slot of each context entry.
    :param ctx_mask: ``bool [B, C]`` True where the entry is attended (padding: False; its
        slot must still lie in the pool).
    :param k_new: ``[B, T, Hkv, D]`` keys of the new tokens (a view, as ``q``).
    :param v_new: ``[B, T, Hkv, D]`` their values (a view, as ``q``).
    :param new_valid: ``bool [B, T]`` real new tokens (padding: False; a padding query still
        attends the context and itself).
    :param cos: None: ``q`` and ``k_new`` are post-RoPE. Else ``float32 [B, T, D/2]``, the
        RoPE of each new token (``layers.rope_cos_sin``): q and k_new are rotated as they
        are loaded (query token i by new token ``q_index[b, i]``'s angles), in float32 and
        cast back, as ``layers.apply_rope``.
    :param sin: with ``cos``.
    :param causal: new token i sees the valid new tokens before it (text); False: every valid
        new token (the action tokens of denoise). A token always sees itself.
    :returns: ``[B, Tq, Hq, D]`` in ``q.dtype``.
    :raises ValueError: shapes, dtypes or devices that do not fit (``_check``).
    """
    _check(q, q_index, k_pool, v_pool, ctx_slots, ctx_mask, k_new, v_new, new_valid, cos, sin)
    b, tq, hq, d = q.shape
    hkv, t, c = k_pool.shape[1], k_new.shape[1], ctx_slots.shape[1]
    group, rows = hq // hkv, tq * (hq // hkv)
    q, k_new, v_new = _packed_heads(q), _packed_heads(k_new), _packed_heads(v_new)
    q_index, ctx_slots = q_index.contiguous(), ctx_slots.contiguous()
    ctx_mask, new_valid = ctx_mask.contiguous(), new_valid.contiguous()
    rope = cos is not None
    if rope:
        cos, sin = cos.contiguous(), sin.contiguous()
    else:               # never read (ROPE is a constant of the kernels): any tensor will do
        cos = sin = q_index
    splits = (c + SPLIT_LEN - 1) // SPLIT_LEN
    programs = b * hkv * ((rows + BLOCK_R - 1) // BLOCK_R)
    f32 = torch.float32
    acc = torch.empty((b * hkv * splits, rows, d), dtype=f32, device=q.device)
    m = torch.empty((b * hkv * splits, rows), dtype=f32, device=q.device)
    l = torch.empty((b * hkv * splits, rows), dtype=f32, device=q.device)  # noqa: E741
    out = torch.empty((b, tq, hq, d), dtype=q.dtype, device=q.device)
    shape = {'GROUP': group, 'KV_HEADS': hkv, 'HEAD_DIM': d, 'BLOCK_R': BLOCK_R,
             'BLOCK_D': max(16, triton.next_power_of_2(d)), 'ROPE': rope, 'IEEE': q.dtype == f32}
    scale = d ** -0.5
    queries = (q, q_index, cos, sin)
    strides = (q.stride(0), q.stride(1), cos.stride(0) if rope else 0,
               cos.stride(1) if rope else 0)
    context, merge = launch_options(rope)
    launch(_context_partials, (programs, splits),
           *queries, k_pool, v_pool, ctx_slots, ctx_mask, acc, m, l, *strides, k_pool.stride(0),
           k_pool.stride(1), v_pool.stride(0), v_pool.stride(1), ctx_slots.stride(0),
           ctx_mask.stride(0), rows, c, SPLIT_LEN, splits, scale, BLOCK_N=BLOCK_N, **context,
           **shape)
    launch(_new_tokens_and_merge, (programs,),
           *queries, k_new, v_new, new_valid, acc, m, l, out, *strides, k_new.stride(0),
           k_new.stride(1), v_new.stride(0), v_new.stride(1), rows, t, splits, scale,
           BLOCK_T=BLOCK_T, CAUSAL=causal, **merge, **shape)
    return out


def launch_options(rope: bool) -> tuple[dict[str, int], dict[str, int]]:
    """
    Return the warps and pipeline stages of stage 1 and of stage 2.

    Stage 2 with RoPE on load takes 8 warps: with 4 it needs 255 registers per thread at
    head dim 256 on Hopper, the ceiling (``test_paged_attention.py`` builds both for sm_90
    and finds no spill).
    """
    return {'num_warps': 4, 'num_stages': 2}, {'num_warps': 8 if rope else 4, 'num_stages': 1}


def _shape(q, q_index, k_pool, v_pool, ctx_slots, ctx_mask, k_new, v_new, new_valid, cos=None,
           sin=None, causal=True):
    _check(q, q_index, k_pool, v_pool, ctx_slots, ctx_mask, k_new, v_new, new_valid, cos, sin)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


paged_attention = kernel_operator('oxygen_ros::paged_attention', _launch, _shape,
                                  interpreted=INTERPRETED)


__all__ = ['BLOCK_N', 'BLOCK_R', 'BLOCK_T', 'INTERPRETED', 'SPLIT_LEN', 'launch_options',
           'paged_attention']
