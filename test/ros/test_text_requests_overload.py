"""
What the ``~/ask`` flood found in the text requests, fixed; each checked here without DDS.

- ``max_queued_questions`` bounds every question not decoding yet, the ones handed to the
  engine included (a burst was accepted and then dropped with 'engine busy').
- A goal's question slot is released when its goal never arrives.
- The control cycle never calls the rclpy logger (1 ms a call); refusals log once a second.
- ``/diagnostics`` shows the questions waiting (and their peak) and the open requests.
- An exception while publishing one event loses nothing else, and its question still gets
  exactly one reply.
"""

from oxygen_ros.engine.config import CycleStats, StepOutput, TextDelta, TextOutput
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.model.tokenizer import default_tokenizer_path, PaligemmaTokenizer
from oxygen_ros.ros.diagnostics import EngineDiagnostics, status_values
from oxygen_ros.ros.text_outputs import TextOutputs
from oxygen_ros.ros.text_requests import (
    RESERVATION_TIMEOUT_S, TextDone, TextRequests, TextStatus)
from oxygen_ros.sched.request import FinishReason
from std_msgs.msg import String

STATS = CycleStats(0, 0.0, 0.0, {}, 4, 0, 0, 0, 0, 0, 1, 0)


class FakeEngine:
    """``submit_text`` / ``abort`` of ``Engine``, recording."""

    def __init__(self):
        self.submitted = []

    def submit_text(self, task, *, question=None, max_tokens=None, req_id=None):
        self.submitted.append(req_id)
        return req_id

    def abort(self, req_id):
        return req_id in self.submitted


class Logger:
    """Records what the text requests log (the rclpy logger's methods)."""

    def __init__(self):
        self.lines = []

    def info(self, line, **kwargs):
        self.lines.append(('info', line))

    def warning(self, line, **kwargs):
        self.lines.append(('warning', line))

    def error(self, line, **kwargs):
        self.lines.append(('error', line))


class Clock:

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make_texts(max_queued=4):
    logger, diag, clock = Logger(), EngineDiagnostics('tiny'), Clock()
    texts = TextRequests(logger, diag, lambda: None, clock=clock)
    texts.max_queued_questions, texts.max_tokens = max_queued, 8
    return texts, logger, diag, clock


def delta(req_id, ids, num_tokens, final=False):
    return TextDelta(req_id, TextTask.ANSWER, tuple(ids), num_tokens, 7, final)


def step(deltas=(), texts=()):
    return StepOutput(None, tuple(texts), STATS, tuple(deltas))


def test_questions_handed_to_the_engine_count_until_they_decode():
    texts, _, _, _ = make_texts(max_queued=4)
    jobs = [texts.ask_topic(f'q{i}?', 0.0) for i in range(4)]
    engine = FakeEngine()
    texts.submit(engine, 0.0, 0.0, 0.0, True)
    assert engine.submitted == [j.req_id for j in jobs] and texts.num_queued == 0
    # in the engine's pending line (no token yet): still waiting, so the queue is full
    assert texts.num_waiting == 4
    late = texts.ask_topic('one more?', 0.0)
    [refused] = texts.take()
    assert (refused.job, refused.status) == (late, TextStatus.REFUSED)
    assert refused.reason == 'queue full (4 questions waiting, max_queued_questions 4)'
    # two of them decode their first tokens: two slots free; a third ends unanswered
    texts.finish(step(deltas=[delta(jobs[0].req_id, [5], 1), delta(jobs[1].req_id, [6], 1)]))
    assert texts.num_waiting == 2
    texts.finish(step(texts=[TextOutput(jobs[2].req_id, TextTask.ANSWER, '', (), None, 0, 0,
                                        'not admitted for 51 cycles')]))
    assert texts.num_waiting == 1
    texts.take()
    accepted = [texts.ask_topic(f'again {i}?', 0.0) for i in range(3)]
    assert texts.take() == [] and texts.num_waiting == 4
    # a cancel of a question in the engine's line frees its slot when applied
    assert texts.cancel(jobs[3].req_id)
    texts.apply_cancels(engine)
    assert texts.num_waiting == 3 and [d.status for d in texts.take()] == [TextStatus.CANCELED]
    assert {j.req_id for j in accepted} <= set(texts.live)


def test_a_goal_slot_whose_goal_never_comes_is_released():
    texts, logger, _, clock = make_texts(max_queued=2)
    assert texts.reserve('first?', None) is None
    assert texts.reserve('second?', None) is None  # rclpy never accepts this one
    assert texts.reserve('third?', None).startswith('queue full (2 questions waiting')
    texts.enqueue('first?', None, clock.now, goal=object())
    clock.now += RESERVATION_TIMEOUT_S / 2
    assert texts.num_waiting == 2  # not yet: the goal may still come
    clock.now += RESERVATION_TIMEOUT_S
    assert texts.reserve('fourth?', None) is None  # the stale slot was released
    assert texts.num_waiting == 2
    texts.take()
    assert any('released a question slot held 5 s for a goal that never came' in line
               for _, line in logger.lines)


def test_the_control_cycle_queues_its_log_lines_for_the_text_group():
    texts, logger, _, _ = make_texts()
    job = texts.ask_topic('what is on the table?', 0.0)
    engine = FakeEngine()
    texts.submit(engine, 0.0, 0.0, 0.0, True)                      # control cycle
    texts.finish(step(deltas=[delta(job.req_id, [9, 1], 2, final=True)],
                      texts=[TextOutput(job.req_id, TextTask.ANSWER, 'a cup', (9, 1),
                                        FinishReason.STOP, 7, 1)]))
    assert logger.lines == []                                      # nothing logged yet
    events = texts.take()                                          # text group
    assert [type(e) for e in events][-1] is TextDone
    assert logger.lines == [
        ('info', f"question {job.req_id} (topic): 'what is on the table?'"),
        ('info', f"answer {job.req_id} (1 cycles, eos): 'a cup'")]


def test_diagnostics_show_waiting_questions_their_peak_and_open_requests():
    texts, _, diag, _ = make_texts(max_queued=4)
    jobs = [texts.ask_topic(f'q{i}?', 0.0) for i in range(3)]
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert (values['questions waiting'], values['questions waiting peak'],
            values['text requests open']) == ('3', '3', '3')
    texts.submit(FakeEngine(), 0.0, 0.0, 0.0, True)
    texts.finish(step(deltas=[delta(j.req_id, [5], 1) for j in jobs]))  # all decoding
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert (values['questions waiting'], values['questions waiting peak'],
            values['text requests open']) == ('0', '3', '3')  # peak: since the last status
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert values['questions waiting peak'] == '0'


class FailingAsk:
    """The action server's side of ``TextOutputs``: ``finish`` fails for one request."""

    def __init__(self, fail_for):
        self.fail_for, self.results = fail_for, []

    def feedback(self, job, piece, text_so_far):
        pass

    def finish(self, done, whole):
        if done.job.req_id == self.fail_for and whole is not None:
            raise RuntimeError('result could not be built')
        self.results.append((done.job.req_id, done.status, done.reason))


def test_an_exception_publishing_one_event_loses_no_reply():
    tok = PaligemmaTokenizer(default_tokenizer_path())
    texts, _, _, _ = make_texts(max_queued=8)
    topic = [texts.ask_topic(f'q{i}?', 0.0) for i in range(3)]
    assert texts.reserve('goal?', None) is None
    goal = texts.enqueue('goal?', None, 0.0, goal=object())
    published, errors = [], []

    def publish(key, msg):
        if isinstance(msg, String) and msg.data == 'boom':
            raise RuntimeError('publisher failed')
        published.append((key, msg))
    ask = FailingAsk(goal.req_id)
    out = TextOutputs(publish, ask, on_error=lambda where, exc, trace: errors.append(where))
    out.configure(tok, 'base_link')
    texts.submit(FakeEngine(), 0.0, 0.0, 0.0, True)
    ends = [TextOutput(topic[0].req_id, TextTask.ANSWER, 'boom', (9,), FinishReason.STOP, 7, 1),
            TextOutput(goal.req_id, TextTask.ANSWER, 'a cup', (9,), FinishReason.STOP, 7, 1),
            TextOutput(topic[1].req_id, TextTask.ANSWER, 'fine', (9,), FinishReason.STOP, 7, 1),
            TextOutput(topic[2].req_id, TextTask.ANSWER, 'also', (9,), FinishReason.STOP, 7, 1)]
    texts.finish(step(texts=ends))
    out.handle(texts.take())
    answers = [m.data for key, m in published if key == 'answer']
    # the failed String answer is replaced by one 'no answer', the others are published
    assert answers == ['no answer: internal error: RuntimeError: publisher failed', 'fine',
                       'also']
    # the failed goal result still ends the goal: DROPPED with the reason
    assert ask.results == [(goal.req_id, TextStatus.DROPPED,
                            'internal error: RuntimeError: result could not be built')]
    assert errors == [f'publishing {topic[0].req_id}', f'publishing {goal.req_id}']


def test_refusals_are_logged_once_a_second_with_how_many_they_stand_for():
    texts, logger, diag, clock = make_texts(max_queued=1)
    texts.ask_topic('fills the queue', 0.0)
    for _ in range(5):
        texts.ask_topic('refused?', 0.0)
    assert texts.reserve('refused too?', None).startswith('queue full')
    clock.now += 1.1
    texts.ask_topic('refused again?', 0.0)
    assert [line for _, line in logger.lines] == [
        'question refused: queue full (1 questions waiting, max_queued_questions 1)',
        'question refused: queue full (1 questions waiting, max_queued_questions 1) '
        '(5 more refused since the last such line)']
    assert status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected'] == '7'
