"""
Real-time chunking's guided denoise on the fast path: the graph of its prefix bucket, or eager.

``FastPathModel`` takes :meth:`GuidedDenoise.guided_denoise` from here: the prefix is padded
to its denoise bucket (as the plain denoise is) and the whole guided Euler loop
(``model.guidance.GuidedDenoiseCall``: the velocity and its vector-Jacobian product per step, or
the error alone past ``RtcGuidance.jacobian_steps``) is one replay. Without a graph (not
compiled because the engine was built without ``rtc``, a failed warm-up, a shape outside the
buckets, other Jacobian steps than compiled) the eager reference runs it
(``model.guidance.guided_denoise``).
"""

from __future__ import annotations

import logging

from oxygen_ros.backends.config import Step
from oxygen_ros.backends.fast_path.buckets import bucket_for
from oxygen_ros.model.guidance import (
    guidance_weights, guided_denoise, jacobian_step_count, RtcGuidance)
from oxygen_ros.model.kv_cache import PrefixKV
import torch
import torch.nn.functional as F  # noqa: N812

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')


class GuidedDenoise:
    """The guided denoise of ``FastPathModel`` (its ``_graph``, ``shapes``, ``guided``...)."""

    @torch.inference_mode()
    def guided_denoise(self, prefix: PrefixKV, noise: torch.Tensor,
                       guidance: RtcGuidance) -> torch.Tensor:
        """
        Return what the eager reference ``rtc.guided_denoise`` returns, from a graph if any.

        :param noise: ``float32 [1, H, A]`` on the device; ``guidance`` too.
        :returns: ``float32 [1, H, A]`` normalized actions (a copy of the graph's output).
        """
        p = prefix.slots.shape[1]
        c = bucket_for(p, self.shapes.denoise)
        k = jacobian_step_count(guidance.jacobian_steps, self.cfg.num_denoise_steps)
        graph = self._graph(Step.GUIDED_DENOISE, (c, k) if c else None, prefix.cache, (p, k))
        if graph is None or prefix.batch_size != 1 or \
                tuple(noise.shape) != tuple(graph.inputs[3].shape):
            if not self.guided and 'guided' not in self._warned:
                self._warned.add('guided')
                _LOG.warning('the guided denoise (real-time chunking) runs EAGERLY: it was '
                             'not compiled (the engine was built without rtc)')
            return guided_denoise(self.model, prefix, noise, guidance)
        steps = guidance_weights(self.cfg.num_denoise_steps, guidance.max_guidance_weight)
        return graph(F.pad(prefix.slots.to(torch.int64), (0, c - p), value=self.null_slot),
                     F.pad(prefix.mask, (0, c - p)), prefix.num_tokens, noise,
                     guidance.target, guidance.soft_mask, steps).clone()


__all__ = ['GuidedDenoise']
