"""
``Engine.step(deadline=...)``: text decoding stops at the cycle's deadline, the text is the same.

The node passes its next control tick as the deadline. On the CPU the torch backend checks the
clock between decode steps (``DecodeJob.deadline``): a cycle that is already late runs one
step per request and leaves the rest to later cycles; the tokens, and so the text, are those
of a cycle without time pressure, only spread over more cycles. The action is never cut.
"""

import time

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation
from oxygen_ros.transforms.prompt import TextTask

CAMERAS = CAMERA_SLOTS[:1]
K = 4


def observation(frame: int) -> Observation:
    rng = np.random.default_rng(frame)
    return Observation(images={CAMERAS[0]: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)},
                       state=rng.uniform(-1, 1, 8).astype(np.float32),
                       prompt='pick up the red block', stamp_ns=(frame + 1) * 100_000_000)


def decode(tiny_models, tokenizer, deadline_s):
    """Decode one 9-token answer; return its tokens per cycle and the chunks published."""
    mode = PrefixAttention.BIDIRECTIONAL
    # min k = k: the scheduler always plans K tokens, so any cut is the backend's
    cfg = EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=CAMERAS,
                              tokens_per_cycle=K, min_tokens_per_cycle=K, stop_on_eos=False,
                              seed=11)
    engine = Engine(cfg, model=tiny_models(mode, CAMERAS), tokenizer=tokenizer)
    engine.submit_text(TextTask.ANSWER, question='what is red?', max_tokens=9, req_id='q')
    per_cycle, chunks, text = [], 0, None
    for frame in range(12):
        out = engine.step(observation(frame), deadline=time.monotonic() + deadline_s)
        chunks += out.action is not None
        per_cycle += [d.new_token_ids for d in out.outputs]
        if out.finished:
            [text] = out.finished
            break
    return per_cycle, chunks, text


def test_a_missed_deadline_decodes_one_step_a_cycle_and_the_same_text(tiny_models, tokenizer):
    relaxed, relaxed_chunks, whole = decode(tiny_models, tokenizer, 3600.0)
    late, late_chunks, late_whole = decode(tiny_models, tokenizer, -1.0)
    # without time pressure: the seed token and K-1 steps, then K a cycle
    assert [len(ids) for ids in relaxed] == [K, K, 1]
    # past the deadline: the seed token and the one step the backend always runs, then one
    assert [len(ids) for ids in late] == [2] + [1] * 7
    assert sum(late, ()) == sum(relaxed, ()) == whole.token_ids == late_whole.token_ids
    assert late_whole.text == whole.text
    # every cycle published its action chunk
    assert (relaxed_chunks, late_chunks) == (len(relaxed), len(late))
