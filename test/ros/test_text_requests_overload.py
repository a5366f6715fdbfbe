"""
What the ``~/ask`` flood found in the text requests, fixed; each checked here without DDS.

- One bound, ``max_waiting_requests``, on the engine's one waiting queue: a question is queued
  or refused the moment it arrives (a burst was once accepted, then dropped with 'engine busy'
  or after ``max_wait_cycles``); admission and cancels make room at once.
- A goal whose handle never arrives has its request aborted.
- The control cycle never calls the rclpy logger (1 ms a call); refusals log once a second.
- ``/diagnostics`` shows the requests waiting (and their peak) and the open requests.
- An exception while publishing one event loses nothing else, and its question still gets
  exactly one reply.
"""

from types import SimpleNamespace

from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.outputs import CycleStats, StepOutput, TextOutput
from oxygen_ros.ros.diagnostics import EngineDiagnostics, status_values
from oxygen_ros.ros.text_outputs import TextOutputs
from oxygen_ros.ros.text_requests import RESERVATION_TIMEOUT_S, TextDone, TextRequests
from oxygen_ros.sched.request import FinishReason
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask
import pytest
from std_msgs.msg import String

CAMS = CAMERA_SLOTS[:2]
MODE = PrefixAttention.BIDIRECTIONAL
STATS = CycleStats(0, 0.0, 0.0, {}, 4, 0, 0, 0, 0, 0, 1, 0)


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


@pytest.fixture
def engine(tiny_models, tokenizer):
    cfg = EngineConfig.create(preset='tiny', prefix_attention=MODE, cameras=CAMS,
                              tokens_per_cycle=2, stop_on_eos=False, max_running_requests=2)
    return Engine(cfg, model=tiny_models(MODE, CAMS), tokenizer=tokenizer)


def make_texts(engine, max_waiting=4):
    logger, diag, clock = Logger(), EngineDiagnostics('tiny'), Clock()
    texts = TextRequests(logger, diag, lambda: None, clock=clock)
    engine.set_max_waiting_requests(max_waiting)
    texts.connect(engine)
    return texts, logger, diag, clock


def cycle(texts, engine, frame):
    texts.ask_periodic(0.0, 0.0, 0.0, True)
    out = engine.step(make_observation(frame, CAMS, 8))
    texts.finish(out)
    return out


def step(outputs=()):
    return StepOutput((), tuple(outputs), STATS)


def test_the_queue_holds_requests_until_admitted_and_cancels_free_their_place(engine):
    texts, _, _, _ = make_texts(engine, max_waiting=4)
    jobs = [texts.ask_topic(f'q{i}?', 0.0) for i in range(4)]
    late = texts.ask_topic('one more?', 0.0)
    [refused] = texts.take()
    assert (refused.job, refused.finish_reason) == (late, FinishReason.REFUSED)
    assert refused.reason == 'queue full (4 requests waiting, max_waiting_requests 4)'
    # a cycle admits two (max_running_requests 2): two places free for new questions
    cycle(texts, engine, 1)
    assert (engine.num_running, engine.num_waiting) == (2, 2)
    accepted = [texts.ask_topic(f'again {i}?', 0.0) for i in range(2)]
    assert [e.finish_reason for e in texts.take() if isinstance(e, TextDone)] == []
    assert engine.num_waiting == 4
    # a cancel of a waiting question frees its place at once, without a cycle
    assert texts.cancel(jobs[3].req_id)
    assert engine.num_waiting == 3
    assert [d.finish_reason for d in texts.take()] == [FinishReason.ABORT]
    assert {j.req_id for j in accepted} <= set(texts.live)


def test_the_request_of_a_goal_whose_handle_never_comes_is_aborted(engine):
    texts, logger, _, clock = make_texts(engine, max_waiting=2)
    first, lost = object(), object()
    assert texts.ask_goal(first, 'first?', None, clock.now) is None
    assert texts.ask_goal(lost, 'second?', None, clock.now) is None  # rclpy never accepts it
    assert texts.ask_goal(object(), 'third?', None, clock.now).startswith(
        'queue full (2 requests waiting')
    texts.goal_accepted(SimpleNamespace(request=first))
    clock.now += RESERVATION_TIMEOUT_S / 2
    assert texts.ask_goal(object(), 'fourth?', None, clock.now) is not None  # not yet
    assert engine.num_waiting == 2
    clock.now += RESERVATION_TIMEOUT_S
    assert texts.ask_goal(object(), 'fifth?', None, clock.now) is None  # the lost one aborted
    assert engine.num_waiting == 2 and len(texts.live) == 2
    texts.take()
    assert any(line.startswith('aborted answer-1: its goal never came in 5 s') for _, line in
               logger.lines)


def test_the_control_cycle_queues_its_log_lines_for_the_text_group(engine):
    texts, logger, _, _ = make_texts(engine)
    job = texts.ask_topic('what is on the table?', 0.0)           # a callback
    outputs, frame = [], 1
    while not outputs:                                             # control cycles
        outputs = cycle(texts, engine, frame).finished
        frame += 1
    assert logger.lines == []                                      # nothing logged yet
    events = texts.take()                                          # text group
    assert [type(e) for e in events][-1] is TextDone
    [out] = outputs
    assert logger.lines == [
        ('info', f"question {job.req_id} (topic): 'what is on the table?'"),
        ('info', f'answer {job.req_id} ({out.num_cycles} cycles, length): {out.text!r}')]


def test_diagnostics_show_waiting_requests_their_peak_and_open_requests(engine):
    texts, _, diag, _ = make_texts(engine, max_waiting=4)
    for i in range(2):
        texts.ask_topic(f'q{i}?', 0.0)
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert (values['text requests waiting'], values['text requests waiting peak'],
            values['text requests open']) == ('2', '2', '2')
    for i in range(3):
        texts.ask_topic(f'r{i}?', 0.0)                             # the last one refused
    cycle(texts, engine, 1)                                        # two admitted
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert (values['text requests waiting'], values['text requests waiting peak'],
            values['text requests open']) == ('2', '4', '4')  # peak: since the last status
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert values['text requests waiting peak'] == '2'


class FailingAsk:
    """The action server's side of ``TextOutputs``: ``finish`` fails for one request."""

    def __init__(self, fail_for):
        self.fail_for, self.results = fail_for, []

    def feedback(self, job, piece, text_so_far):
        pass

    def finish(self, done, whole):
        if done.job.req_id == self.fail_for and whole is not None:
            raise RuntimeError('result could not be built')
        self.results.append((done.job.req_id, done.finish_reason, done.reason))


def test_an_exception_publishing_one_event_loses_no_reply(engine):
    texts, _, _, _ = make_texts(engine, max_waiting=8)
    topic = [texts.ask_topic(f'q{i}?', 0.0) for i in range(3)]
    request = object()
    assert texts.ask_goal(request, 'goal?', None, 0.0) is None
    goal = texts.goal_accepted(SimpleNamespace(request=request))
    published, errors = [], []

    def publish(key, msg):
        if isinstance(msg, String) and msg.data == 'boom':
            raise RuntimeError('publisher failed')
        published.append((key, msg))
    ask = FailingAsk(goal.req_id)
    out = TextOutputs(publish, ask, on_error=lambda where, exc, trace: errors.append(where))
    out.frame_id = 'base_link'
    ends = [TextOutput(req_id, TextTask.ANSWER, (), '', 1, 7, FinishReason.STOP, text=text,
                       token_ids=(9,), num_cycles=1)
            for req_id, text in ((topic[0].req_id, 'boom'), (goal.req_id, 'a cup'),
                                 (topic[1].req_id, 'fine'), (topic[2].req_id, 'also'))]
    texts.finish(step(ends))
    out.handle(texts.take())
    answers = [m.data for key, m in published if key == 'answer']
    # the failed String answer is replaced by one 'no answer', the others are published
    assert answers == ['no answer: internal error: RuntimeError: publisher failed', 'fine',
                       'also']
    # the failed goal result still ends the goal: DROPPED with the reason
    assert ask.results == [(goal.req_id, FinishReason.DROPPED,
                            'internal error: RuntimeError: result could not be built')]
    assert errors == [f'publishing {topic[0].req_id}', f'publishing {goal.req_id}']


def test_refusals_are_logged_once_a_second_with_how_many_they_stand_for(engine):
    texts, logger, diag, clock = make_texts(engine, max_waiting=1)
    texts.ask_topic('fills the queue', 0.0)
    for _ in range(5):
        texts.ask_topic('refused?', 0.0)
    assert texts.ask_goal(object(), 'refused too?', None, 0.0).startswith('queue full')
    clock.now += 1.1
    texts.ask_topic('refused again?', 0.0)
    assert [line for _, line in logger.lines] == [
        'question refused: queue full (1 requests waiting, max_waiting_requests 1)',
        'question refused: queue full (1 requests waiting, max_waiting_requests 1) '
        '(5 more refused since the last such line)']
    assert status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected'] == '7'
