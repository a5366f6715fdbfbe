"""
A prompt of its own is built on the admitting frame's instruction, and no queued request edited.

A request with ``TextContext.OWN_PROMPT`` reads ``Task: {instruction}. Subtask: ``; the engine
builds it for each waiting request and hands the prompts in with the frame
(``FrameSpec.own_prompts``), the scheduler gives a request its prompt when it admits it. One
whose prompt cannot be built on a frame's instruction ends with ``FinishReason.DROPPED``.
"""

from dataclasses import replace

from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine import Engine, EngineConfig, FinishReason, TextContext, TextTask
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import tokenize_text_prompt, tokenize_text_suffix

CAMS = CAMERA_SLOTS[:2]
MODE = PrefixAttention.CAUSAL_TEXT


def make_engine(tiny_models, tokenizer):
    cfg = EngineConfig.create(preset='tiny', prefix_attention=MODE, cameras=CAMS,
                              tokens_per_cycle=2, stop_on_eos=False, max_running_requests=1,
                              subtask_context=TextContext.OWN_PROMPT)
    return Engine(cfg, model=tiny_models(MODE, CAMS), tokenizer=tokenizer)


def obs(frame, prompt):
    return replace(make_observation(frame, CAMS, 8), prompt=prompt)


def test_an_own_prompt_is_the_admitting_frames_and_a_waiting_request_is_never_edited(
        tiny_models, tokenizer):
    engine = make_engine(tiny_models, tokenizer)
    max_len = engine.model_cfg.max_token_len
    engine.submit_text(TextTask.SUBTASK, max_tokens=4, req_id='first')   # k = 2: two cycles
    engine.submit_text(TextTask.SUBTASK, max_tokens=4, req_id='second')
    waiting = engine.scheduler.requests['second']
    suffix = tuple(tokenize_text_suffix(tokenizer, TextTask.SUBTASK, max_len=max_len).ids)
    engine.step(obs(0, 'pick up the cup'))             # one decode slot: 'first' only
    assert engine.scheduler.requests['first'].prompt_token_ids == tuple(tokenize_text_prompt(
        tokenizer, 'pick up the cup', TextTask.SUBTASK, max_len=max_len).ids)
    assert waiting.prompt_token_ids == suffix          # the queue is left as it was
    out = engine.step(obs(1, 'put it down'))           # 'first' ends, 'second' waits on
    assert [t.req_id for t in out.finished] == ['first'] and waiting.prompt_token_ids == suffix
    assert engine.num_waiting == 1
    engine.step(obs(2, 'open the drawer'))             # admitted on this frame: its prompt
    assert engine.num_running == 1 and waiting.prompt_token_ids == tuple(tokenize_text_prompt(
        tokenizer, 'open the drawer', TextTask.SUBTASK, max_len=max_len).ids)


def test_a_prompt_that_cannot_be_built_drops_its_request_and_the_action_goes_on(
        tiny_models, tokenizer):
    engine = make_engine(tiny_models, tokenizer)
    engine.submit_text(TextTask.SUBTASK, max_tokens=2, req_id='s')
    out = engine.step(obs(0, '!'))        # an action prompt, but no instruction left for it
    assert out.action is not None
    [dropped] = out.finished
    assert (dropped.req_id, dropped.finish_reason, dropped.text, dropped.token_ids) == (
        's', FinishReason.DROPPED, '', ())
    assert dropped.error == "bad text prompt: task instruction is empty after cleaning: '!'"
    assert engine.num_waiting == engine.num_running == 0
    engine.scheduler.kv.check_consistency()
    engine.submit_text(TextTask.SUBTASK, max_tokens=2, req_id='t')   # the next one is served
    assert [t.req_id for t in engine.step(obs(1, 'pick up the cup')).finished] == ['t']
