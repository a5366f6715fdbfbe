"""
The node's text requests (ros/text_requests.py) and text outputs (text_stream, text_outputs).

Driven with a real tiny engine and recorded publishers, no DDS: questions of the ``~/ask``
topic and action go into the engine's one waiting queue or are refused at once, exactly one
reply per question, cancels of waiting and decoding requests, periodic requests, and pieces
(detokenized once, by the engine) that concatenate to the whole text.
"""

from types import SimpleNamespace

from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.outputs import CycleStats, StepOutput, TextOutput
from oxygen_ros.ros.diagnostics import EngineDiagnostics, status_values
from oxygen_ros.ros.input_limits import MAX_QUESTION_BYTES
from oxygen_ros.ros.text_outputs import TextOutputs
from oxygen_ros.ros.text_requests import Origin, TextDone, TextPiece, TextRequests
from oxygen_ros.sched.request import FinishReason
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.detokenizer import IncrementalDetokenizer
from oxygen_ros.transforms.prompt import TextTask
from oxygen_ros_interfaces.msg import DecodedText
import pytest
from rclpy.logging import get_logger

CAMS = CAMERA_SLOTS[:2]
MODE = PrefixAttention.BIDIRECTIONAL
STATS = CycleStats(0, 0.0, 0.0, {}, 4, 0, 0, 0, 0, 0, 1, 0)
BUDGET = 8  # the tiny preset's decode_budget


@pytest.fixture
def make_engine(tiny_models, tokenizer):
    def make(**changes):
        cfg = EngineConfig.create(preset='tiny', prefix_attention=MODE, cameras=CAMS,
                                  tokens_per_cycle=2, stop_on_eos=False, **changes)
        return Engine(cfg, model=tiny_models(MODE, CAMS), tokenizer=tokenizer)
    return make


def make_texts(engine, max_waiting=4):
    notified = []
    diag = EngineDiagnostics('tiny')
    texts = TextRequests(get_logger('test_text_requests'), diag, lambda: notified.append(1))
    if engine is not None:
        engine.set_max_waiting_requests(max_waiting)
    texts.connect(engine)
    return texts, diag, notified


def obs(frame):
    return make_observation(frame, CAMS, 8)


def run_cycles(texts, engine, n, first=1):
    """Run ``n`` control cycles the way the node does; return the events they made."""
    events = []
    for f in range(first, first + n):
        texts.finish(engine.step(obs(f)))
        events += texts.take()
    return events


def step(outputs=()):
    return StepOutput((), tuple(outputs), STATS)


def finished(req_id, task, text, ids, reason=FinishReason.STOP, error=''):
    """Return the last output of a request the engine ended (no new piece: its whole text)."""
    return TextOutput(req_id, task, (), '', len(ids), 7, reason, text=text, token_ids=tuple(ids),
                      num_cycles=2, error=error)


def test_a_full_queue_refuses_at_once_and_every_question_gets_one_reply(make_engine):
    engine = make_engine()
    texts, diag, notified = make_texts(engine, max_waiting=4)
    jobs = [texts.ask_topic(f'question {i}?', 0.0) for i in range(10)]
    jobs.append(texts.ask_topic('   ', 0.0))
    refused = texts.take()
    assert [d.job for d in refused] == jobs[4:]
    assert {d.finish_reason for d in refused} == {FinishReason.REFUSED}
    assert refused[0].reason == 'queue full (4 requests waiting, max_waiting_requests 4)'
    assert refused[-1].reason == 'empty question' and notified
    assert engine.num_waiting == 4 and set(texts.live) == {j.req_id for j in jobs[:4]}
    assert len({j.req_id for j in jobs}) == 11
    # the control cycles admit and decode them: one reply each, its pieces its whole text
    events = run_cycles(texts, engine, 8)
    done = [e for e in events if isinstance(e, TextDone)]
    assert [d.job for d in done] == jobs[:4]
    for d in done:
        pieces = [e.text for e in events if isinstance(e, TextPiece) and e.job is d.job]
        assert d.finish_reason is FinishReason.LENGTH and d.num_tokens == BUDGET
        assert d.text == ''.join(pieces) and d.frame_stamp_ns > 0
    assert texts.live == {} and engine.num_waiting == engine.num_running == 0
    assert status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected'] == '7'


def test_how_a_request_ends_sets_its_reply(make_engine):
    texts, diag, _ = make_texts(make_engine(), max_waiting=4)
    jobs = [texts.ask_topic(f'question {i}?', 0.0) for i in range(4)]
    ends = [finished(jobs[0].req_id, TextTask.ANSWER, 'a cup', [9, 1]),
            finished(jobs[1].req_id, TextTask.ANSWER, '', [], FinishReason.DROPPED,
                     'bad text prompt: x'),
            finished(jobs[2].req_id, TextTask.ANSWER, 'two', [5, 6], FinishReason.LENGTH),
            finished(jobs[3].req_id, TextTask.ANSWER, 'par', [4], FinishReason.ABORT)]
    texts.finish(step(ends))
    assert [(d.finish_reason, d.text, d.reason) for d in texts.take()] == [
        (FinishReason.STOP, 'a cup', ''), (FinishReason.DROPPED, '', 'bad text prompt: x'),
        (FinishReason.LENGTH, 'two', ''), (FinishReason.DROPPED, 'par', 'request aborted')]
    assert texts.live == {}
    assert status_values(diag.status(0.0, 10.0, 0.5))['last text rejection'] == \
        f'{jobs[3].req_id}: request aborted'


def test_a_question_over_the_byte_bound_is_refused_with_the_reason(make_engine):
    texts, diag, _ = make_texts(make_engine())
    reason = (f'question of {MAX_QUESTION_BYTES + 2} bytes is longer than the '
              f'{MAX_QUESTION_BYTES}-byte limit')
    long = 'a' * (MAX_QUESTION_BYTES - 1) + '€'                      # € is 3 bytes
    job = texts.ask_topic(long, 0.0)
    [done] = texts.take()
    assert (done.job, done.finish_reason, done.reason) == (job, FinishReason.REFUSED, reason)
    assert texts.ask_goal(object(), long, None, 0.0) == reason       # the action: rejected
    assert status_values(diag.status(0.0, 10.0, 0.5))['last text rejection'] == \
        f'question refused: {reason}'
    assert texts.ask_goal(object(), 'a' * MAX_QUESTION_BYTES, None, 0.0) is None  # the bound


def test_a_question_the_kv_pool_could_never_hold_is_refused_with_the_reason(make_engine):
    # a pool with room for two action prefixes and little more: an answer with a prompt of
    # its own could never fit (it used to wait and be dropped after max_wait_cycles)
    engine = make_engine(kv_cache_mb=0.06, answer_context='own_prompt')
    texts, _, _ = make_texts(engine)
    job = texts.ask_topic('what is on the table?', 0.0)
    [done] = texts.take()
    assert (done.job, done.finish_reason) == (job, FinishReason.REFUSED)
    assert done.reason.startswith(f'{job.req_id}: needs up to ')
    assert done.reason.endswith('it could never be admitted (lower max_tokens or give the KV '
                                'pool more memory)')
    assert texts.live == {} and engine.num_waiting == 0


def test_goals_are_queued_in_the_goal_callback_and_budgets_checked(make_engine):
    engine = make_engine()
    texts, _, _ = make_texts(engine, max_waiting=2)
    first, second = object(), object()
    assert texts.ask_goal(first, 'where?', None, 1.5) is None
    assert texts.ask_goal(object(), 'where?', BUDGET + 1, 0.0) == \
        f'max_tokens {BUDGET + 1} outside [1, {BUDGET}] (decode_budget)'
    assert texts.ask_goal(object(), '', None, 0.0) == 'empty question'
    assert texts.ask_goal(second, 'and?', BUDGET, 0.0) is None
    assert engine.num_waiting == 2          # queued before rclpy accepts them: bound exact
    texts.ask_topic('one more', 0.0)
    [refused] = texts.take()
    assert refused.reason == 'queue full (2 requests waiting, max_waiting_requests 2)'
    handle = SimpleNamespace(request=first)  # rclpy hands the goal request back on the handle
    job = texts.goal_accepted(handle)
    assert (job.origin, job.goal, job.arrival_s, job.question) == (Origin.ACTION, handle, 1.5,
                                                                   'where?')
    with pytest.raises(RuntimeError, match='the goal came more than 5 s after its request'):
        texts.goal_accepted(SimpleNamespace(request=object()))
    texts.connect(None)  # cleaned up: nothing is taken
    assert texts.ask_goal(object(), 'where?', None, 0.0) == 'the node is not configured'


def test_events_of_a_goal_wait_for_its_handle(make_engine):
    engine = make_engine()
    texts, _, _ = make_texts(engine)
    goal = object()
    assert texts.ask_goal(goal, 'where?', 2, 0.0) is None
    events = run_cycles(texts, engine, 1)     # decoded and finished before rclpy handed it
    assert events == [] and texts.live == {}
    job = texts.goal_accepted(SimpleNamespace(request=goal))
    piece, done = texts.take()
    assert (piece.job, done.job, done.finish_reason) == (job, job, FinishReason.LENGTH)
    assert piece.final and piece.text == done.text


def test_cancel_while_waiting_and_while_decoding(make_engine):
    engine = make_engine()
    texts, _, _ = make_texts(engine)
    waiting = texts.ask_topic('first?', 0.0)
    assert texts.cancel(waiting.req_id)
    [done] = texts.take()
    assert (done.job, done.finish_reason, done.text) == (waiting, FinishReason.ABORT, '')
    assert engine.num_waiting == 0 and texts.live == {}
    running = texts.ask_topic('second?', 0.0)
    pieces = [e.text for e in run_cycles(texts, engine, 1)]
    assert engine.num_running == 1 and engine.scheduler.kv.num_used_blocks > 0
    assert texts.cancel(running.req_id)     # at once, no control cycle needed
    [done] = texts.take()
    assert (done.job, done.finish_reason, done.num_tokens) == (running, FinishReason.ABORT, 2)
    assert done.text.startswith(''.join(pieces))
    assert engine.num_running == 0 and engine.scheduler.kv.num_used_blocks == 0
    assert not texts.cancel(running.req_id) and texts.live == {}


def test_periodic_requests_wait_for_valid_input_and_the_previous_one(make_engine):
    engine = make_engine()
    texts, diag, _ = make_texts(engine)
    texts.start(10.0)
    texts.ask_periodic(10.0, 2.0, 0.0, valid_observation=False)
    assert texts.live == {}
    texts.ask_periodic(10.1, 2.0, 0.0, valid_observation=True)
    [(first, task)] = texts.live.items()  # memory_period 0: never
    assert task is TextTask.SUBTASK and engine.num_waiting == 1
    texts.ask_periodic(12.5, 2.0, 0.0, True)  # due, but the first one is still open
    assert list(texts.live) == [first]
    texts.finish(step([finished(first, TextTask.SUBTASK, 'grasp the cup', [3, 1])]))
    texts.ask_periodic(12.6, 2.0, 0.0, True)
    [second] = texts.live
    texts.finish(step([finished(second, TextTask.SUBTASK, '', [], FinishReason.DROPPED,
                                'bad text prompt')]))
    assert [(d.job.origin, d.finish_reason) for d in texts.take()] == [
        (Origin.PERIODIC, FinishReason.STOP), (Origin.PERIODIC, FinishReason.DROPPED)]
    texts.ask_periodic(13.0, 2.0, 0.0, True)  # next due at 14.6
    assert texts.live == {}
    # a full queue: the due request is asked again every cycle, not refused
    for i in range(4):
        texts.ask_topic(f'q{i}?', 0.0)
    rejected = status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected']
    texts.ask_periodic(14.6, 2.0, 0.0, True)
    assert TextTask.SUBTASK not in texts.live.values()
    assert texts.cancel(next(iter(texts.live)))
    texts.ask_periodic(14.7, 2.0, 0.0, True)
    assert TextTask.SUBTASK in texts.live.values()
    assert status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected'] == rejected


def test_drop_all_ends_every_open_request(make_engine):
    engine = make_engine()
    texts, _, _ = make_texts(engine)
    running = texts.ask_topic('running?', 0.0)
    pieces = [e.text for e in run_cycles(texts, engine, 1)]
    goal = object()
    assert texts.ask_goal(goal, 'waiting?', None, 0.0) is None
    texts.drop_all(engine.shutdown(), 'engine shut down (node cleanup)')
    [done] = texts.take()
    assert (done.job, done.finish_reason, done.reason) == (running, FinishReason.DROPPED,
                                                           'engine shut down')
    assert done.text.startswith(''.join(pieces)) and done.num_tokens == 2
    job = texts.goal_accepted(SimpleNamespace(request=goal))  # its result was waiting for it
    [done] = texts.take()
    assert (done.job, done.finish_reason, done.reason) == (job, FinishReason.DROPPED,
                                                           'engine shut down')
    assert texts.live == {}


def test_a_question_racing_the_cleanup_gets_one_reply(make_engine):
    """Cleanup ends the request between its registration and the engine's refusal."""
    engine = make_engine()
    texts, _, _ = make_texts(engine)
    submit = engine.submit_text

    def cleanup_first(*args, **kwargs):  # the node's cleanup runs in between
        texts.connect(None)
        texts.drop_all(engine.shutdown(), 'engine shut down (node cleanup)')
        return submit(*args, **kwargs)     # EngineClosedError
    engine.submit_text = cleanup_first
    job = texts.ask_topic('just in time?', 0.0)
    assert [(d.job, d.finish_reason, d.reason) for d in texts.take()] == [
        (job, FinishReason.DROPPED, 'engine shut down (node cleanup)')]
    assert texts.live == {}


# ------------------------------------------------------------------------- text outputs


class FakeAsk:

    def __init__(self):
        self.feedback_calls, self.results = [], []

    def feedback(self, job, piece, text_so_far):
        self.feedback_calls.append((job.req_id, piece.text, text_so_far))

    def finish(self, done, whole):
        self.results.append((done.job.req_id, done.finish_reason, whole))


def outputs():
    published, ask = [], FakeAsk()
    out = TextOutputs(lambda key, msg: published.append((key, msg)), ask)
    out.frame_id = 'base_link'
    return out, published, ask


def cycle_outputs(tok, req_id, chunks, stamp):
    """Return the engine's output of each chunk of ids (the last one ends it: EOS)."""
    detok, out, num = IncrementalDetokenizer(tok), [], 0
    ids = tuple(i for chunk in chunks for i in chunk)
    for i, chunk in enumerate(chunks):
        last, num = i == len(chunks) - 1, num + len(chunk)
        piece = detok.push(chunk, final=last)
        out.append(TextOutput(req_id, TextTask.ANSWER, tuple(chunk), piece, num, stamp,
                              FinishReason.STOP if last else None,
                              text=detok.text if last else '', token_ids=ids if last else (),
                              num_cycles=len(chunks) if last else 0))
    return out


def test_pieces_stream_and_concatenate_to_the_whole_text(tok, make_engine):
    texts, _, _ = make_texts(make_engine())
    out, published, ask = outputs()
    job = texts.ask_topic('what is on the table?', 100.0)
    goal = object()
    assert texts.ask_goal(goal, 'and?', None, 100.0) is None
    goal_job = texts.goal_accepted(SimpleNamespace(request=goal))
    euro = [tok.piece_to_id(f'<0x{b:02X}>') for b in '€'.encode()]
    ids = [*tok.encode(' a red', add_bos=False), euro[0], euro[1], euro[2],
           *tok.encode(' cup', add_bos=False), tok.eos_id]
    chunks = [ids[:2], ids[2:4], ids[4:5], ids[5:]]  # '€' split over three cycles
    stamp = 1_700_000_000_123_456_789
    per_request = {r: cycle_outputs(tok, r, chunks, stamp) for r in (job.req_id, goal_job.req_id)}
    for i in range(len(chunks)):
        texts.finish(step([d[i] for d in per_request.values()]))
        out.handle(texts.take())
    stream = [m for key, m in published if key == 'answer/stream' and m.request_id == job.req_id]
    assert ''.join(m.text for m in stream) == tok.decode(ids) == ' a red€ cup'
    assert [m.is_final for m in stream] == [False] * (len(stream) - 1) + [True]
    assert [m.text for m in stream] == [' a red', '€', ' cup']  # no empty piece published
    assert stream[-1].num_tokens == len(ids)
    first = stream[0]
    assert (first.task, first.header.frame_id) == (DecodedText.TASK_ANSWER, 'base_link')
    assert (first.header.stamp.sec, first.header.stamp.nanosec) == (1_700_000_000, 123_456_789)
    assert first.time_from_request.sec > 0  # arrival 100 s, monotonic now is later
    # the topic question is answered on ~/answer, the goal by its result (not on ~/answer)
    assert [m.data for key, m in published if key == 'answer'] == [' a red€ cup']
    [(req_id, status, whole)] = ask.results
    assert (req_id, status, whole.text, whole.is_final) == (goal_job.req_id, FinishReason.STOP,
                                                            ' a red€ cup', True)
    assert [t for _, t, _ in ask.feedback_calls] == [m.text for m in stream]
    assert ask.feedback_calls[-1][2] == ' a red€ cup'


def test_cancelled_goal_gets_its_partial_text_and_a_final_piece(tok, make_engine):
    texts, _, _ = make_texts(make_engine())
    out, published, ask = outputs()
    goal = object()
    assert texts.ask_goal(goal, 'where?', None, 0.0) is None
    job = texts.goal_accepted(SimpleNamespace(request=goal))
    ids = tok.encode(' on the', add_bos=False) + [tok.piece_to_id('<0xE2>')]
    piece = IncrementalDetokenizer(tok).push(ids)             # the byte is held back
    texts.finish(step([TextOutput(job.req_id, TextTask.ANSWER, tuple(ids), piece, len(ids),
                                  5)]))
    out.handle(texts.take())
    # the engine's abort lets the held-back byte out: its text is ' on the\ufffd'
    out.handle([TextDone(job, FinishReason.ABORT, ' on the\ufffd', len(ids), 5,
                         reason='cancelled')])
    stream = [m for key, m in published if key == 'answer/stream']
    assert [(m.text, m.is_final) for m in stream] == [(' on the', False), ('\ufffd', True)]
    [(_, status, whole)] = ask.results
    assert (status, whole.text, whole.num_tokens) == (FinishReason.ABORT, ' on the\ufffd',
                                                      len(ids))
    assert [key for key, _ in published] == ['answer/stream', 'answer/stream']


def test_refused_topic_question_is_answered_no_answer(make_engine):
    texts, _, _ = make_texts(make_engine(), max_waiting=1)
    out, published, ask = outputs()
    texts.ask_topic('one', 0.0)
    texts.ask_topic('two', 0.0)
    out.handle(texts.take())
    assert [(k, m.data) for k, m in published] == [
        ('answer', 'no answer: queue full (1 requests waiting, max_waiting_requests 1)')]
    assert texts.take() == [] and ask.results == []


def test_a_question_before_the_node_is_configured_is_answered_no_answer():
    texts, _, _ = make_texts(None)
    out, published, _ = outputs()
    texts.ask_topic('anyone?', 0.0)
    out.handle(texts.take())
    assert [(k, m.data) for k, m in published] == [
        ('answer', 'no answer: the node is not configured')]


def test_text_done_and_piece_events_carry_the_job(make_engine):
    texts, _, _ = make_texts(make_engine())
    job = texts.ask_topic('q', 0.0)
    texts.finish(step([TextOutput(job.req_id, TextTask.ANSWER, (5,), 'x', 1, 9,
                                  FinishReason.STOP, text='x', token_ids=(5,))]))
    piece, done = texts.take()
    assert isinstance(piece, TextPiece) and isinstance(done, TextDone)
    assert piece.job is done.job is job and piece.final
