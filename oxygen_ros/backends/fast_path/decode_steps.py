"""
A decode job's k greedy steps on the fast path: one graph replay for all k, or none.

``FastPathModel`` takes :meth:`DecodeSteps.decode_greedy_steps` from here. Its graphs
(``Step.DECODE_STEPS``, ``static_calls.DecodeLoopCall``) hold k decode steps: the
per-step index math of ``TorchBackend._decode`` (position, write slot, context mask), the
K/V writes and the argmax that feeds the next step, keyed by (batch bucket, context bucket,
k), the context bucket covering every row's context plus its new tokens. k is the
configured ``tokens_per_cycle``; a job of another k (the end of a budget, k shrunk for a
deadline) has no graph: the caller decodes it step by step (the decode graphs), as it does
where this step's warm-up failed (recorded in ``fallbacks``).
"""

from __future__ import annotations

import logging

from oxygen_ros.backends.config import Step
from oxygen_ros.backends.fast_path.buckets import bucket_for
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.lora import AdapterRows
import torch

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')


class DecodeSteps:
    """The k-step decode of ``FastPathModel`` (its ``_graphs``, ``_pool``, ``shapes``...)."""

    @torch.inference_mode()
    def decode_greedy_steps(self, tokens: torch.Tensor, base: torch.Tensor,
                            steps: torch.Tensor, all_slots: torch.Tensor, null_slot: int,
                            cache: KVCache, num_steps: int,
                            adapter: AdapterRows | None = None) -> torch.Tensor | None:
        """
        Run ``num_steps`` greedy decode steps in one graph replay; None where none fits.

        Row ``b``'s step ``s`` feeds the previous step's id (``tokens`` first) at position
        ``base[b] + s`` on the context ``all_slots[b, :base[b] + s]`` and writes its K/V to
        ``all_slots[b, base[b] + s]`` while ``s < steps[b]``, else to ``null_slot``:
        ``static_calls.DecodeLoopCall``, the same steps as ``num_steps`` calls of
        ``decode_greedy``.

        :param tokens: ``int64 [B]`` the rows' last ids; ``base``, ``steps``: ``int64 [B]``.
        :param all_slots: ``int64 [B, W]`` each row's context slots, then its new tokens'.
        :returns: ``int64 [B, num_steps]`` (the ids past a row's steps are meaningless), or
            None: no graph of this batch, width and ``num_steps`` (another k, the step fell
            back, another pool; a batch or width beyond the buckets: a warning once); nothing
            ran.
        """
        graphs = self._graphs.get(Step.DECODE_STEPS) if cache is self._pool else None
        if graphs is None or num_steps not in self.shapes.tokens_per_cycle:
            return None                      # by design (module docstring): no warning
        (b, w), batch = all_slots.shape, self.shapes.batch
        key = (bucket_for(b, batch), bucket_for(w, self.shapes.ctx), num_steps)
        graph = graphs.get(key)
        if graph is None:
            if 'decode_steps' not in self._warned:
                self._warned.add('decode_steps')
                _LOG.warning('decode of %d steps, batch %d, context %d has no k-step graph '
                             '(compiled: %s): step by step', num_steps, b, w, list(graphs))
            return None
        null = torch.full((), null_slot, dtype=torch.int64, device=all_slots.device)
        ids = graph(tokens, base, steps, all_slots, null, *self._rows(adapter),
                    pad=(0, 0, 0, null_slot, None, False))
        return ids[:b].clone()


__all__ = ['DecodeSteps']
