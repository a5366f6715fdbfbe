"""
The node's text requests (ros/text_requests.py) and text outputs (text_stream, text_outputs).

Driven with a fake engine and recorded publishers, no DDS: one bounded question queue for the
``~/ask`` topic and action, exactly one reply per question, cancels, periodic requests, and
pieces that concatenate to the whole text.
"""

from oxygen_ros.engine.config import CycleStats, StepOutput, TextDelta, TextOutput
from oxygen_ros.engine.engine import EngineBusyError
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.ros.diagnostics import EngineDiagnostics, status_values
from oxygen_ros.ros.input_limits import MAX_QUESTION_BYTES
from oxygen_ros.ros.text_outputs import TextOutputs
from oxygen_ros.ros.text_requests import (
    Origin, TextDone, TextPiece, TextRequests, TextStatus)
from oxygen_ros.sched.request import FinishReason
from oxygen_ros_interfaces.msg import DecodedText
from rclpy.logging import get_logger

STATS = CycleStats(0, 0.0, 0.0, {}, 4, 0, 0, 0, 0, 0, 1, 0)


class FakeEngine:
    """``submit_text`` / ``abort`` of ``Engine``: refuses like it, records the rest."""

    def __init__(self, busy_after=None):
        self.busy_after, self.submitted, self.aborted = busy_after, [], []

    def submit_text(self, task, *, question=None, max_tokens=None, req_id=None):
        if self.busy_after is not None and len(self.submitted) >= self.busy_after:
            raise EngineBusyError(f'{len(self.submitted)} text requests already wait')
        self.submitted.append((req_id, task, question, max_tokens))
        return req_id

    def abort(self, req_id):
        known = any(r == req_id for r, *_ in self.submitted)
        self.aborted.append(req_id)
        return known


def make_texts(max_queued=4, max_tokens=20):
    notified = []
    diag = EngineDiagnostics('tiny')
    texts = TextRequests(get_logger('test_text_requests'), diag, lambda: notified.append(1))
    texts.max_queued_questions, texts.max_tokens = max_queued, max_tokens
    return texts, diag, notified


def step(deltas=(), texts=()):
    return StepOutput(None, tuple(texts), STATS, tuple(deltas))


def finished(req_id, task, text, ids, reason=FinishReason.STOP, error=''):
    return TextOutput(req_id, task, text, tuple(ids), reason, 7, 2, error)


def test_bounded_queue_refuses_at_once_and_every_question_gets_one_reply():
    texts, diag, notified = make_texts(max_queued=4)
    jobs = [texts.ask_topic(f'question {i}?', 0.0) for i in range(10)]
    jobs.append(texts.ask_topic('   ', 0.0))
    refused = texts.take()
    assert [d.job for d in refused] == jobs[4:]
    assert {d.status for d in refused} == {TextStatus.REFUSED}
    assert refused[0].reason == 'queue full (4 questions waiting, max_queued_questions 4)'
    assert refused[-1].reason == 'empty question' and notified
    engine = FakeEngine()
    texts.submit(engine, 0.0, 0.0, 0.0, valid_observation=False)  # questions need no frame
    assert [r for r, *_ in engine.submitted] == [j.req_id for j in jobs[:4]]
    assert len({j.req_id for j in jobs}) == 11
    ends = [finished(jobs[0].req_id, TextTask.ANSWER, 'a cup', [9, 1]),
            finished(jobs[1].req_id, TextTask.ANSWER, '', [], None, 'not admitted for 51 cycles'),
            finished(jobs[2].req_id, TextTask.ANSWER, 'two', [5, 6], FinishReason.LENGTH),
            finished(jobs[3].req_id, TextTask.ANSWER, '', [], FinishReason.ABORT)]
    texts.finish(step(texts=ends))
    done = texts.take()
    assert [(d.status, d.text, d.reason) for d in done] == [
        (TextStatus.EOS, 'a cup', ''), (TextStatus.DROPPED, '', 'not admitted for 51 cycles'),
        (TextStatus.LENGTH, 'two', ''), (TextStatus.DROPPED, '', 'request aborted')]
    assert texts.live == {} and texts.num_queued == 0
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert values['text requests rejected'] == str(7 + 2)
    assert values['last text rejection'] == f'{jobs[3].req_id}: request aborted'


def test_a_question_over_the_byte_bound_is_refused_with_the_reason():
    texts, diag, _ = make_texts()
    reason = (f'question of {MAX_QUESTION_BYTES + 2} bytes is longer than the '
              f'{MAX_QUESTION_BYTES}-byte limit')
    long = 'a' * (MAX_QUESTION_BYTES - 1) + '€'                      # € is 3 bytes
    job = texts.ask_topic(long, 0.0)
    [done] = texts.take()
    assert (done.job, done.status, done.reason) == (job, TextStatus.REFUSED, reason)
    assert texts.reserve(long, None) == reason                        # the action: rejected
    assert status_values(diag.status(0.0, 10.0, 0.5))['last text rejection'] == \
        f'question refused: {reason}'
    assert texts.reserve('a' * MAX_QUESTION_BYTES, None) is None       # at the bound


def test_engine_busy_drops_the_rest_with_a_reason():
    texts, _, _ = make_texts(max_queued=8)
    jobs = [texts.ask_topic(f'q{i}', 0.0) for i in range(3)]
    texts.submit(FakeEngine(busy_after=1), 0.0, 0.0, 0.0, True)
    [a, b] = texts.take()
    assert (a.job, b.job) == (jobs[1], jobs[2]) and a.status is TextStatus.DROPPED
    assert a.reason == 'engine busy: 1 text requests already wait'
    assert list(texts.live) == [jobs[0].req_id]


def test_goal_slots_are_reserved_and_budgets_checked():
    texts, _, _ = make_texts(max_queued=2, max_tokens=20)
    assert texts.reserve('where?', None) is None
    assert texts.reserve('where?', 21) == 'max_tokens 21 outside [1, 20] (decode_budget)'
    assert texts.reserve('', None) == 'empty question'
    assert texts.reserve('and?', 20) is None
    assert texts.num_queued == 2
    assert texts.ask_topic('one more', 0.0).req_id.startswith('answer-')
    [refused] = texts.take()
    assert refused.reason.startswith('queue full (2 questions waiting')
    goal = object()
    job = texts.enqueue('where?', None, 1.5, goal=goal)
    assert (job.origin, job.goal, job.arrival_s) == (Origin.ACTION, goal, 1.5)
    assert texts.num_queued == 2
    texts.max_tokens = 0  # cleaned up: nothing is taken
    assert texts.reserve('where?', None) == 'the node is not configured'


def test_cancel_while_queued_and_while_decoding():
    texts, _, notified = make_texts()
    queued = texts.ask_topic('first?', 0.0)
    assert texts.cancel(queued.req_id)
    [done] = texts.take()
    assert (done.job, done.status) == (queued, TextStatus.CANCELED)
    running = texts.ask_topic('second?', 0.0)
    engine = FakeEngine()
    texts.submit(engine, 0.0, 0.0, 0.0, True)
    assert texts.cancel(running.req_id) and texts.take() == []  # waits for the engine
    texts.apply_cancels(engine)
    assert engine.aborted == [running.req_id]
    [done] = texts.take()
    assert (done.job, done.status) == (running, TextStatus.CANCELED)
    assert not texts.cancel(running.req_id) and texts.live == {}


def test_periodic_requests_wait_for_valid_input_and_the_previous_one():
    texts, _, _ = make_texts()
    engine = FakeEngine()
    texts.start(10.0)
    texts.submit(engine, 10.0, 2.0, 0.0, valid_observation=False)
    assert engine.submitted == []
    texts.submit(engine, 10.1, 2.0, 0.0, valid_observation=True)
    [(first, task, _, _)] = engine.submitted  # memory_period 0: never
    assert task is TextTask.SUBTASK
    texts.submit(engine, 12.5, 2.0, 0.0, True)  # due, but the first one still decodes
    assert len(engine.submitted) == 1
    texts.finish(step(texts=[finished(first, TextTask.SUBTASK, 'grasp the cup', [3, 1])]))
    texts.submit(engine, 12.6, 2.0, 0.0, True)
    second = engine.submitted[1][0]
    texts.finish(step(texts=[finished(second, TextTask.SUBTASK, '', [], None,
                                      'bad text prompt')]))
    assert [(d.job.origin, d.status) for d in texts.take()] == [
        (Origin.PERIODIC, TextStatus.EOS), (Origin.PERIODIC, TextStatus.DROPPED)]
    texts.submit(engine, 13.0, 2.0, 0.0, True)  # next due at 14.6
    assert len(engine.submitted) == 2


def test_drop_all_ends_every_open_request():
    texts, _, _ = make_texts()
    running = texts.ask_topic('running?', 0.0)
    texts.submit(FakeEngine(), 0.0, 0.0, 0.0, True)
    assert texts.reserve('queued?', None) is None
    queued = texts.enqueue('queued?', None, 0.0, goal=object())
    last_words = [finished(running.req_id, TextTask.ANSWER, '', [4], FinishReason.ABORT,
                           'engine shut down')]
    texts.drop_all(last_words, 'engine shut down (node cleanup)')
    assert [(d.job, d.status, d.reason) for d in texts.take()] == [
        (running, TextStatus.DROPPED, 'engine shut down'),
        (queued, TextStatus.DROPPED, 'engine shut down (node cleanup)')]
    assert texts.live == {}


# ------------------------------------------------------------------------- text outputs


class FakeAsk:

    def __init__(self):
        self.feedback_calls, self.results = [], []

    def feedback(self, job, piece, text_so_far):
        self.feedback_calls.append((job.req_id, piece.text, text_so_far))

    def finish(self, done, whole):
        self.results.append((done.job.req_id, done.status, whole))


def outputs(tok):
    published, ask = [], FakeAsk()
    out = TextOutputs(lambda key, msg: published.append((key, msg)), ask)
    out.configure(tok, 'base_link')
    return out, published, ask


def test_pieces_stream_and_concatenate_to_the_whole_text(tok):
    texts, _, _ = make_texts()
    out, published, ask = outputs(tok)
    job = texts.ask_topic('what is on the table?', 100.0)
    assert texts.reserve('and?', None) is None
    goal_job = texts.enqueue('and?', None, 100.0, goal=object())
    texts.submit(FakeEngine(), 0.0, 0.0, 0.0, True)
    euro = [tok.piece_to_id(f'<0x{b:02X}>') for b in '€'.encode()]
    ids = [*tok.encode(' a red', add_bos=False), euro[0], euro[1], euro[2],
           *tok.encode(' cup', add_bos=False), tok.eos_id]
    chunks = [ids[:2], ids[2:4], ids[4:5], ids[5:]]  # '€' split over three cycles
    stamp = 1_700_000_000_123_456_789
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        deltas = [TextDelta(r, TextTask.ANSWER, tuple(chunk), sum(map(len, chunks[:i + 1])),
                            stamp, last) for r in (job.req_id, goal_job.req_id)]
        ends = [finished(r, TextTask.ANSWER, tok.decode(ids), ids)
                for r in (job.req_id, goal_job.req_id)] if last else []
        texts.finish(step(deltas, ends))
        out.handle(texts.take())
    stream = [m for key, m in published if key == 'answer/stream' and m.request_id == job.req_id]
    assert ''.join(m.text for m in stream) == tok.decode(ids) == ' a red€ cup'
    assert [m.is_final for m in stream] == [False] * (len(stream) - 1) + [True]
    assert all(m.text for m in stream[:-1]) and stream[-1].num_tokens == len(ids)
    first = stream[0]
    assert (first.task, first.header.frame_id) == (DecodedText.TASK_ANSWER, 'base_link')
    assert (first.header.stamp.sec, first.header.stamp.nanosec) == (1_700_000_000, 123_456_789)
    assert first.time_from_request.sec > 0  # arrival 100 s, monotonic now is later
    # the topic question is answered on ~/answer, the goal by its result (not on ~/answer)
    assert [m.data for key, m in published if key == 'answer'] == [' a red€ cup']
    [(req_id, status, whole)] = ask.results
    assert (req_id, status, whole.text, whole.is_final) == (goal_job.req_id, TextStatus.EOS,
                                                            ' a red€ cup', True)
    assert [t for _, t, _ in ask.feedback_calls] == [m.text for m in stream]
    assert ask.feedback_calls[-1][2] == ' a red€ cup'


def test_cancelled_goal_gets_its_partial_text_and_a_final_piece(tok):
    texts, _, _ = make_texts()
    out, published, ask = outputs(tok)
    assert texts.reserve('where?', None) is None
    job = texts.enqueue('where?', None, 0.0, goal=object())
    engine = FakeEngine()
    texts.submit(engine, 0.0, 0.0, 0.0, True)
    ids = tok.encode(' on the', add_bos=False) + [tok.piece_to_id('<0xE2>')]
    texts.finish(step([TextDelta(job.req_id, TextTask.ANSWER, tuple(ids), len(ids), 5, False)]))
    out.handle(texts.take())
    texts.cancel(job.req_id)
    texts.apply_cancels(engine)
    out.handle(texts.take())
    stream = [m for key, m in published if key == 'answer/stream']
    assert [(m.text, m.is_final) for m in stream] == [(' on the', False), ('\ufffd', True)]
    [(_, status, whole)] = ask.results
    assert (status, whole.text, whole.num_tokens) == (TextStatus.CANCELED, ' on the\ufffd',
                                                      len(ids))
    assert [key for key, _ in published] == ['answer/stream', 'answer/stream']


def test_refused_topic_question_is_answered_no_answer(tok):
    texts, _, _ = make_texts(max_queued=1)
    out, published, ask = outputs(tok)
    texts.ask_topic('one', 0.0)
    texts.ask_topic('two', 0.0)
    out.handle(texts.take())
    assert [(k, m.data) for k, m in published] == [
        ('answer', 'no answer: queue full (1 questions waiting, max_queued_questions 1)')]
    assert texts.take() == [] and ask.results == []


def test_text_done_and_piece_events_carry_the_job():
    texts, _, _ = make_texts()
    job = texts.ask_topic('q', 0.0)
    texts.submit(FakeEngine(), 0.0, 0.0, 0.0, True)
    texts.finish(step([TextDelta(job.req_id, TextTask.ANSWER, (5,), 1, 9, True)],
                      [finished(job.req_id, TextTask.ANSWER, 'x', [5])]))
    piece, done = texts.take()
    assert isinstance(piece, TextPiece) and isinstance(done, TextDone)
    assert piece.job is done.job is job and piece.final
