"""
OxyGen's text requests per connection: parsing, the news of each reply, and the driver.

The driver admits a connection's request only onto that connection's own frame (its robot's
prefix), decodes every running request k tokens per served frame, and ends a connection's
requests with it; text and tokens equal the engine's own for the same frame.
"""

import numpy as np
from oxygen_ros.serve.driver import CycleDriver
from oxygen_ros.serve.errors import BadLanguageRequest
from oxygen_ros.serve.language import (
    ConnectionTexts, LanguageRequest, MAX_PER_MESSAGE, parse_language_requests)
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.transforms.prompt import TextTask
import pytest
from serve_helpers import engine_for, engine_observation, openpi_observation

LAYOUT = Layout.DROID


def parse(value, budget=8):
    return parse_language_requests(value, decode_budget=budget, first_index=3)


def test_requests_parse_with_default_ids():
    got = parse([{'task': 'subtask'}, {'task': 'answer', 'question': 'where?', 'max_tokens': 4},
                 {'task': 'memory', 'request_id': 'note.1'}])
    assert got == [LanguageRequest('subtask-3', TextTask.SUBTASK),
                   LanguageRequest('answer-4', TextTask.ANSWER, 'where?', 4),
                   LanguageRequest('note.1', TextTask.MEMORY)]


@pytest.mark.parametrize('value, match', [
    ({'task': 'answer'}, 'expected a list of maps, got dict'),
    ([{'task': 'subtask'}] * (MAX_PER_MESSAGE + 1), f'at most {MAX_PER_MESSAGE}'),
    (['answer'], r'language_requests\[3\]: expected a map'),
    ([{'task': 'answer', 'question': 'q', 'temperature': 1}], 'with keys among'),
    ([{'task': 'plan'}], "task must be one of \\['subtask', 'answer', 'memory'\\], got 'plan'"),
    ([{'task': 'answer'}], 'an answer needs a non-empty question'),
    ([{'task': 'answer', 'question': '  '}], 'an answer needs a non-empty question'),
    ([{'task': 'subtask', 'question': 'q'}], 'only an answer takes a question, not subtask'),
    ([{'task': 'memory', 'max_tokens': 9}], r'max_tokens must be an integer in 1..8, got 9'),
    ([{'task': 'memory', 'max_tokens': 2.0}], 'max_tokens must be an integer'),
    ([{'task': 'memory', 'request_id': 'a b'}], 'request_id must be 1 to 64 of'),
    ([{'task': 'memory', 'request_id': 'x' * 65}], 'request_id must be 1 to 64 of'),
])
def test_malformed_requests_are_refused(value, match):
    with pytest.raises(BadLanguageRequest, match=match):
        parse(value)


def test_ids_in_use_are_refused_and_the_open_bound_answers_in_the_updates():
    texts = ConnectionTexts('c1', max_open=2)
    a, b, c = (LanguageRequest(i, TextTask.SUBTASK) for i in ('a', 'b', 'c'))
    texts.ask([a, b, c])
    assert texts.pending == [a, b]
    with pytest.raises(BadLanguageRequest, match="request_id 'a' in use"):
        texts.ask([LanguageRequest('a', TextTask.MEMORY)])
    with pytest.raises(BadLanguageRequest, match="'z' in use"):
        texts.ask([LanguageRequest('z', TextTask.MEMORY)] * 2)
    (update,) = texts.take_updates()
    assert update == {'request_id': 'c', 'task': 'subtask', 'tokens': [], 'text': '',
                      'finished': True, 'finish_reason': None,
                      'error': 'TooManyLanguageRequests: 2 open on this connection '
                               '(--max-language-requests 2)'}
    assert texts.take_updates() == [] and texts.engine_id(a) == 'c1/a'


def answer_of(engine, observations, question):
    """Return the engine's TextOutput of ``question`` asked before the first observation."""
    req_id = engine.submit_text(TextTask.ANSWER, question=question)
    for obs in observations:
        for text in engine.step(obs).finished:
            if text.req_id == req_id:
                return text
    raise AssertionError('the reference answer did not finish')


def frame(driver, session, seed, requests=()):
    obs = engine_observation(LAYOUT, openpi_observation(LAYOUT, seed))
    return driver.serve_frame(session, obs, list(requests), 0.0)


def test_a_request_waits_for_its_own_connections_frame(tokenizer):
    """With one decode row, B's question waits; A's frames never admit it; B's frame does."""
    driver = CycleDriver(engine_for(LAYOUT, tokenizer, max_running_requests=1),
                         max_language_requests=4)
    a, b = driver.open_session('a:1'), driver.open_session('b:2')
    q_a = LanguageRequest('qa', TextTask.ANSWER, 'what is on the table?')
    q_b = LanguageRequest('qb', TextTask.ANSWER, 'where is the cup?')
    assert frame(driver, a, 10, [q_a]).language_updates[0]['request_id'] == 'qa'
    assert frame(driver, b, 20, [q_b]).language_updates == []   # the decode batch is full
    assert b.texts.pending == [q_b] and driver.engine.num_waiting == 0
    updates_a = frame(driver, a, 11).language_updates           # A's question finishes
    assert updates_a[-1]['finished'] and b.texts.pending == [q_b]
    frame(driver, a, 12)                                        # A's frame: B's waits on
    assert b.texts.pending == [q_b]
    news = frame(driver, b, 21).language_updates + frame(driver, b, 22).language_updates
    want = answer_of(engine_for(LAYOUT, tokenizer), [
        engine_observation(LAYOUT, openpi_observation(LAYOUT, s)) for s in (21, 22)],
        'where is the cup?')
    assert news[-1]['finished'] and news[-1]['text'] == want.text
    assert sum((u['tokens'] for u in news), []) == list(want.token_ids)
    driver.shutdown()


def test_other_connections_frames_decode_it_and_closing_ends_it(tokenizer):
    driver = CycleDriver(engine_for(LAYOUT, tokenizer, decode_budget=20),
                         max_language_requests=4)
    a, b = driver.open_session('a:1'), driver.open_session('b:2')
    q = LanguageRequest('q', TextTask.ANSWER, 'what is on the table?', max_tokens=20)
    first = frame(driver, b, 30, [q]).language_updates
    assert len(first[0]['tokens']) == 5                 # k = 5 per served frame
    frame(driver, a, 40)
    frame(driver, a, 41)                                # B's request decoded on A's frames
    news = first + frame(driver, b, 31).language_updates
    assert sum(len(u['tokens']) for u in news) == 20 and news[-1]['finished']
    want = answer_of(engine_for(LAYOUT, tokenizer, decode_budget=20),
                     [engine_observation(LAYOUT, openpi_observation(LAYOUT, s))
                      for s in (30, 31, 32, 33)], 'what is on the table?')
    assert news[-1]['text'] == want.text

    frame(driver, b, 32, [LanguageRequest('m', TextTask.MEMORY)])
    assert driver.engine.num_running == 1 and driver.num_open_requests == 1
    assert driver.close_session(b) == 1
    assert driver.engine.num_running == 0 and driver.num_open_requests == 0
    assert np.isfinite(frame(driver, a, 42).actions).all()     # A goes on
    driver.shutdown()
