"""
The engine's one text stream (``StepOutput.outputs``) and ``Engine.abort`` freeing KV.

Each output holds the tokens a request kept in one cycle and their text, detokenized once in
the engine: the new ids concatenate to the finished output's ``token_ids`` and the pieces to
its ``text`` (= ``tokenizer.decode`` of the ids) in both policies, with EOS and budget cuts,
and the last one says ``finished``. Aborting a running request returns its KV blocks before the
next cycle, and its text so far.
"""

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation
from oxygen_ros.sched.request import FinishReason
from oxygen_ros.sched.scheduler import Policy
from oxygen_ros.transforms.prompt import TextTask
import pytest

CAMERAS = CAMERA_SLOTS[:1]


def observation(frame: int) -> Observation:
    rng = np.random.default_rng(frame)
    return Observation(images={CAMERAS[0]: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)},
                       state=rng.uniform(-1, 1, 8).astype(np.float32),
                       prompt='pick up the red block', stamp_ns=(frame + 1) * 100_000_000)


def make_engine(tiny_models, tokenizer, policy=Policy.OXYGEN, k=2, stop_on_eos=False):
    mode = PrefixAttention.BIDIRECTIONAL
    cfg = EngineConfig.create(preset='tiny', policy=policy, prefix_attention=mode, cameras=CAMERAS,
                              tokens_per_cycle=k, stop_on_eos=stop_on_eos, seed=11)
    return Engine(cfg, model=tiny_models(mode, CAMERAS), tokenizer=tokenizer)


@pytest.mark.parametrize('policy', list(Policy))
def test_deltas_concatenate_to_the_finished_texts(policy, tiny_models, tokenizer):
    engine = make_engine(tiny_models, tokenizer, policy)
    budgets = {'a0': 5, 's0': 1, 'm0': 4, 'a1': 7}
    streamed: dict[str, list[int]] = {}
    pieces: dict[str, list[str]] = {}
    counts: dict[str, list[int]] = {}
    finished_flags: dict[str, list[bool]] = {}
    outputs = {}
    for frame in range(12):
        if frame == 0:
            engine.submit_text(TextTask.ANSWER, question='what is red?', max_tokens=5,
                               req_id='a0')
            engine.submit_text(TextTask.SUBTASK, max_tokens=1, req_id='s0')
            engine.submit_text(TextTask.MEMORY, max_tokens=4, req_id='m0')
        if frame == 1:
            engine.submit_text(TextTask.ANSWER, question='where?', max_tokens=7, req_id='a1')
        out = engine.step(observation(frame) if frame < 4 else None)
        for d in out.outputs:
            assert d.frame_stamp_ns == (1 if d.req_id != 'a1' else 2) * 100_000_000
            streamed.setdefault(d.req_id, []).extend(d.new_token_ids)
            pieces.setdefault(d.req_id, []).append(d.new_text)
            counts.setdefault(d.req_id, []).append(d.num_tokens)
            finished_flags.setdefault(d.req_id, []).append(d.finished)
        outputs.update({t.req_id: t for t in out.finished})
        # a request's last output holds its last tokens, beside its whole text
        assert all(t.new_token_ids for t in out.finished)
    assert set(outputs) == set(budgets)
    for req_id, out in outputs.items():
        assert tuple(streamed[req_id]) == out.token_ids and len(out.token_ids) == budgets[req_id]
        assert counts[req_id][-1] == len(out.token_ids)
        assert counts[req_id] == sorted(counts[req_id])
        assert finished_flags[req_id][-1] and not any(finished_flags[req_id][:-1])
        assert tokenizer.decode(streamed[req_id]) == out.text == ''.join(pieces[req_id])
    if policy is Policy.OXYGEN:  # k = 2 tokens per cycle: budgets stream over several cycles
        assert len(counts['a1']) == 4


def test_delta_is_cut_after_the_stop_token(tiny_models, tokenizer):
    """The delta keeps what the request keeps: up to and including its stop token."""
    engine = make_engine(tiny_models, tokenizer, k=4)
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='s')
    [free_run] = engine.step(observation(0)).outputs
    assert len(free_run.new_token_ids) == 4 and not free_run.finished
    stop = free_run.new_token_ids[1]  # make the random model's 2nd token the stop token
    engine = make_engine(tiny_models, tokenizer, k=4)
    engine.scheduler.eos_token_id = stop
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='s')
    out = engine.step(observation(0))
    [delta] = out.outputs
    cut = free_run.new_token_ids.index(stop) + 1
    assert delta.new_token_ids == free_run.new_token_ids[:cut] and delta.finished
    assert delta.num_tokens == cut and out.finished[0].token_ids == delta.new_token_ids


def test_abort_frees_kv_blocks_at_once(tiny_models, tokenizer):
    engine = make_engine(tiny_models, tokenizer, k=1)
    engine.submit_text(TextTask.ANSWER, question='what is on the table?', max_tokens=40,
                       req_id='q')
    [delta] = engine.step(observation(0)).outputs
    kv = engine.scheduler.kv
    held = kv.num_used_blocks
    assert engine.num_running == 1 and held > 0
    aborted = engine.abort('q')
    assert (aborted.req_id, aborted.finish_reason, aborted.token_ids) == (
        'q', FinishReason.ABORT, delta.new_token_ids)
    assert aborted.text == tokenizer.decode(delta.new_token_ids) and aborted.text.startswith(
        delta.new_text)
    assert kv.num_used_blocks == 0 and engine.num_running == 0
    assert engine.abort('q') is None
    out = engine.step(None)
    assert out.outputs == () and out.finished == ()


def test_abort_of_a_waiting_request_frees_its_place(tiny_models, tokenizer):
    engine = make_engine(tiny_models, tokenizer)
    engine.submit_text(TextTask.SUBTASK, max_tokens=4, req_id='w')
    aborted = engine.abort('w')
    assert (aborted.text, aborted.token_ids) == ('', ())
    assert aborted.finish_reason is FinishReason.ABORT
    assert engine.num_waiting == 0
    out = engine.step(observation(0))
    assert out.finished == () and out.outputs == ()


def test_abort_while_the_cycle_runs_drops_the_request_from_that_cycle(tiny_models, tokenizer):
    """A cancel from another thread lands between planning and booking: the cycle skips it."""
    engine = make_engine(tiny_models, tokenizer, k=2)
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='a')
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='b')
    cycle = engine.begin(observation(0))
    cycle.action()                                   # the chunk is out, the text not yet
    a = engine.abort('a')
    out = cycle.finish()
    assert a.req_id == 'a' and a.token_ids == ()     # admitted, not decoded yet
    assert [d.req_id for d in out.outputs] == ['b'] and out.finished == ()
    out = engine.step(observation(1))
    assert [d.req_id for d in out.outputs] == ['b'] and engine.num_running == 1
    engine.scheduler.kv.check_consistency()
