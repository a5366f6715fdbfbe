"""Bad input, shutdown, full pool: clear errors, nothing lost, the engine keeps serving."""

from dataclasses import replace
import threading

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention, PromptFormat
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine, EngineClosedError
from oxygen_ros.observation import ObservationError, RefusalReason
from oxygen_ros.sched.request import FinishReason
from oxygen_ros.sched.request_queue import QueueFullError
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.norm_stats import identity_norm_stats
from oxygen_ros.transforms.prompt import action_prompt_ids, TextTask
import pytest

CAMS = CAMERA_SLOTS[:2]


@pytest.fixture
def engine(tiny_models, tokenizer):
    cfg = EngineConfig.create(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT,
                              cameras=CAMS, tokens_per_cycle=2, stop_on_eos=False)
    return Engine(cfg, model=tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS),
                  tokenizer=tokenizer)


def obs(frame=0, **changes):
    return replace(make_observation(frame, CAMS, 8), **changes)


BAD = [
    ('missing camera', {'images': {'base_0_rgb': make_observation(0, CAMS, 8).images[
        'base_0_rgb']}}, RefusalReason.MISSING_CAMERA,
     r"missing camera\(s\) \['left_wrist_0_rgb'\]"),
    ('NaN state', {'state': np.array([0, 1, np.nan, 0, 0, 0, np.inf, 0], np.float32)},
     RefusalReason.BAD_STATE, r'NaN/Inf at dims \[2, 6\]'),
    ('short state', {'state': np.zeros(5, np.float32)}, RefusalReason.BAD_STATE,
     r'state must have shape \(8,\), got \(5,\)'),
    ('gray image', {'images': {s: np.zeros((30, 40), np.uint8) for s in CAMS}},
     RefusalReason.BAD_IMAGE, 'camera base_0_rgb'),
    ('RGBA image', {'images': {s: np.zeros((30, 40, 4), np.uint8) for s in CAMS}},
     RefusalReason.BAD_IMAGE, '4'),
    ('empty prompt', {'prompt': '   '}, RefusalReason.BAD_PROMPT, 'empty task prompt'),
]


@pytest.mark.parametrize('name,changes,cause,match', BAD, ids=[b[0] for b in BAD])
def test_bad_observation_is_refused_and_nothing_is_lost(engine, name, changes, cause, match):
    engine.submit_text(TextTask.SUBTASK, max_tokens=6, req_id='running')
    first = engine.step(obs(0))
    assert first.action is not None
    used = engine.scheduler.kv.num_used_blocks
    with pytest.raises(ObservationError, match=match) as err:
        engine.step(obs(1, **changes))
    assert err.value.reason is cause
    assert engine.scheduler.kv.num_used_blocks == used       # nothing changed
    # no valid observation: no action, but running text keeps decoding
    out = engine.step(None)
    assert out.action is None and out.stats.decode_batch == 1
    out = engine.step(obs(2))                                 # valid input: actions resume
    assert out.action is not None and out.action.stamp_ns == obs(2).stamp_ns
    done = list(out.finished) + [t for _ in range(3) for t in engine.step(obs(3)).finished]
    assert [t.req_id for t in done] == ['running'] and len(done[0].token_ids) == 6


def test_an_instruction_over_the_token_budget_is_refused_with_its_reason(engine, tokenizer):
    cfg, fmt = engine.model_cfg, engine.robot.prompt_format
    assert fmt is PromptFormat.PI05_STATE
    words = 'grasp the blue mug carefully'
    fits = max((' '.join([words] * k) for k in range(1, 40)
                if len(action_prompt_ids(tokenizer, ' '.join([words] * k), obs().state,
                                         fmt)) <= cfg.max_token_len), key=len)
    long = fits + ' ' + words
    num_ids = len(action_prompt_ids(tokenizer, long, obs().state, fmt))
    engine.submit_text(TextTask.SUBTASK, max_tokens=6, req_id='running')
    engine.step(obs(0))
    used = engine.scheduler.kv.num_used_blocks
    with pytest.raises(ObservationError) as err:
        engine.step(obs(1, prompt=long))
    assert err.value.reason is RefusalReason.BAD_PROMPT
    assert str(err.value) == (
        f'instruction too long: its action prompt (pi05_state, with BOS and the state) is '
        f'{num_ids} tokens, the model takes {cfg.max_token_len} (max_token_len of preset tiny); '
        f'shorten it by at least {num_ids - cfg.max_token_len} token(s)')
    assert engine.scheduler.kv.num_used_blocks == used      # nothing changed
    prepared = engine.prepare(obs(2, prompt=fits))          # the longest that fits is taken
    assert len(prepared.action_prompt_ids) <= cfg.max_token_len
    assert engine.step(prepared).action is not None


def test_requests_after_shutdown_are_refused(engine):
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='live')
    engine.submit_text(TextTask.MEMORY, max_tokens=8, req_id='queued')
    engine.step(obs(0))
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='late')
    aborted = engine.shutdown()
    assert {t.req_id for t in aborted} == {'live', 'queued', 'late'}
    assert all(t.error == 'engine shut down' for t in aborted)
    assert all(t.finish_reason is FinishReason.DROPPED for t in aborted)
    with pytest.raises(EngineClosedError, match='shut down'):
        engine.submit_text(TextTask.SUBTASK)
    with pytest.raises(EngineClosedError, match='shut down'):
        engine.step(obs(1))
    assert engine.shutdown() == []


def test_submit_errors(tiny_models, tokenizer):
    cfg = EngineConfig.create(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT,
                              cameras=CAMS, max_waiting_requests=2)
    engine = Engine(cfg, model=tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS),
                    tokenizer=tokenizer)
    with pytest.raises(ValueError, match='needs a non-empty question'):
        engine.submit_text(TextTask.ANSWER, question='  ')
    with pytest.raises(ValueError, match='only used by ANSWER'):
        engine.submit_text(TextTask.SUBTASK, question='why?')
    with pytest.raises(ValueError, match='max_tokens must be >= 1'):
        engine.submit_text(TextTask.SUBTASK, max_tokens=0)
    engine.submit_text(TextTask.SUBTASK, req_id='a')
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        engine.submit_text(TextTask.SUBTASK, req_id='a')
    engine.submit_text(TextTask.SUBTASK)
    with pytest.raises(QueueFullError, match=r'^queue full \(2 requests waiting, '
                                             r'max_waiting_requests 2\)$'):
        engine.submit_text(TextTask.SUBTASK)
    engine.set_max_waiting_requests(3)  # the node's dynamic parameter
    engine.submit_text(TextTask.SUBTASK)
    assert engine.num_waiting == 3
    with pytest.raises(ValueError, match='max_waiting_requests must be >= 1'):
        engine.set_max_waiting_requests(0)


def test_the_bound_holds_for_submits_from_many_threads(engine):
    engine.set_max_waiting_requests(8)
    accepted, refused = [], []

    def ask(t):
        for i in range(10):
            try:
                accepted.append(engine.submit_text(TextTask.SUBTASK, req_id=f'{t}-{i}'))
            except QueueFullError:
                refused.append(f'{t}-{i}')
    threads = [threading.Thread(target=ask, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == engine.num_waiting == 8 and len(refused) == 32
    assert [r.req_id for r in engine.scheduler.waiting] == accepted


def test_a_request_the_pool_could_never_hold_is_refused_at_submit(tiny_models, tokenizer):
    # room for two action prefixes and little more: a long request could never fit
    cfg = EngineConfig.create(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT,
                              cameras=CAMS, kv_cache_mb=0.06, block_size=16)
    engine = Engine(cfg, model=tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS),
                    tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r'huge: needs up to \d+ KV blocks \(its prefix and a '
                       r'budget of 400 tokens\), the pool has \d+ beside the action path: it '
                       r'could never be admitted'):
        engine.submit_text(TextTask.SUBTASK, max_tokens=400, req_id='huge')
    assert engine.num_waiting == 0
    for f in range(2):
        assert engine.step(obs(f)).action is not None


def test_text_waits_in_order_for_a_decode_slot_while_actions_flow(tiny_models, tokenizer):
    # one decode slot: the others wait (no timeout) and are admitted in arrival order as the
    # running one ends, and every cycle publishes its chunk
    cfg = EngineConfig.create(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT,
                              cameras=CAMS, tokens_per_cycle=2, stop_on_eos=False,
                              max_running_requests=1)
    engine = Engine(cfg, model=tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS),
                    tokenizer=tokenizer)
    for i in range(3):
        engine.submit_text(TextTask.SUBTASK, max_tokens=6, req_id=f't{i}')
    started, done, cycles = [], [], 0
    while len(done) < 3 and cycles < 20:
        out = engine.step(obs(cycles))
        assert out.action is not None and engine.num_running <= 1
        started += [d.req_id for d in out.outputs if d.req_id not in started]
        done += [t.req_id for t in out.finished]
        cycles += 1
    assert started == done == ['t0', 't1', 't2']
    assert cycles == 3 * 3  # one after another, 6 tokens at k = 2 each


def test_kv_use_grows_with_live_requests_not_steps(engine):
    k_ptr = engine.backend.cache.k.data_ptr()
    used = []
    for f in range(4):
        engine.submit_text(TextTask.SUBTASK, max_tokens=30, req_id=f't{f}')
        out = engine.step(obs(f))
        used.append((out.stats.num_running, out.stats.kv_used_bytes))
    assert [n for n, _ in used] == [1, 2, 3, 4]
    assert all(b2 > b1 for (_, b1), (_, b2) in zip(used, used[1:]))
    # decoding more steps adds no memory: each request got its budget at admission
    before = engine.scheduler.kv.num_used_blocks
    engine.step(None)
    assert engine.scheduler.kv.num_used_blocks == before
    assert engine.backend.cache.k.data_ptr() == k_ptr        # the pool is never reallocated


def test_action_is_handed_out_before_the_cycle_decodes_text(engine):
    engine.submit_text(TextTask.SUBTASK, max_tokens=8, req_id='t')
    cycle = engine.begin(obs(0))
    chunk, rows_at_publish = cycle.action(), engine.backend.num_live_rows
    out = cycle.finish()
    assert chunk is out.action and rows_at_publish == 0    # text not even seeded yet
    assert 0 < out.stats.action_latency_s < out.stats.total_s
    cycle = engine.begin(None)
    assert cycle.action() is None
    out = cycle.finish()
    assert out.action is None


def test_text_output_counts_the_cycles_it_took(engine):
    engine.submit_text(TextTask.SUBTASK, max_tokens=5, req_id='t')   # k = 2: ceil(5/2) = 3
    steps, done = 0, []
    while not done:
        steps += 1
        done = engine.step(obs(steps)).finished
    text, = done
    assert steps == 3 and text.num_cycles == 3 and len(text.token_ids) == 5


def test_norm_stats_too_short_for_the_preset_are_refused(tiny_models, tokenizer):
    cfg = EngineConfig(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT, cameras=CAMS)
    stats = {'state': identity_norm_stats(5), 'actions': identity_norm_stats(7)}
    with pytest.raises(ValueError, match='state norm stats have 5 dims, the robot state has 8'):
        Engine(cfg, model=tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS), tokenizer=tokenizer,
               norm_stats=stats)


def test_state_bins_come_from_the_float64_state(engine):
    # Identity stats: in float64 this value lies in bin 100, its float32 rounding in bin 99.
    # openpi normalizes the client's float64 state in float64 (normalize.py): bin 100.
    def prompt(x0, dtype=np.float64):
        state = np.zeros(8, dtype)
        state[0] = x0
        return engine.prepare(obs(state=state)).action_prompt_ids

    edge = -0.218749609375
    assert prompt(edge) == prompt(-0.215)                 # well inside bin 100
    assert prompt(edge, np.float32) == prompt(-0.222)     # well inside bin 99
    assert prompt(-0.215) != prompt(-0.222)
