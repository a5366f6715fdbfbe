"""Prompt strings, state bins and padded prompt ids (transforms/prompt.py; docs/prompts.md)."""

import logging

import numpy as np

from oxygen_ros.config import PromptFormat
from oxygen_ros.transforms import prompt
from oxygen_ros.transforms.prompt import (
    clean_text, discretize_state, format_action_prompt, format_text_prompt, TextTask,
    tokenize_action_prompt, tokenize_text_prompt)
import pytest

NEWLINE_ID = 108  # Gemma's single piece for "\n"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees its own warn-once registry."""
    monkeypatch.setattr(prompt, '_warned', set())


def _warnings(caplog):
    return [r for r in caplog.records
            if r.name == 'oxygen_ros.transforms.prompt' and r.levelno == logging.WARNING]


# --- clean_text / discretize_state ---------------------------------------------------------

@pytest.mark.parametrize('raw,clean', [
    ('  pick_up the cup \n', 'pick up the cup'),
    ('open\nthe drawer', 'open the drawer'),
    ('a_b_c', 'a b c'),
    ('Keep Case!', 'Keep Case!'),
    ('\n_x_\n', ' x '),  # strip first, then replace (openpi order)
])
def test_clean_text(raw, clean):
    assert clean_text(raw) == clean


def test_clean_text_rejects_non_str():
    with pytest.raises(TypeError, match='must be str'):
        clean_text(None)


@pytest.mark.parametrize('x,bin_', [
    (-1.0, 0), (-0.9921875, 1), (-0.99, 1), (0.0, 128), (1 / 256, 128), (0.0078125, 129),
    (np.nextafter(0.0078125, -1.0), 128), (0.5, 192), (0.984375, 254),
    (np.nextafter(0.9921875, -1.0), 254), (0.9921875, 255), (1.0, 255), (3.7, 255),
    (np.nextafter(-1.0, -2.0), -1), (-1.5, -1), (-40.0, -1),
])
def test_discretize_state_hand_computed(x, bin_):
    assert discretize_state(np.array([x])) == [bin_]


def test_discretize_state_matches_openpi_digitize_formulation():
    rng = np.random.default_rng(0)
    edges = np.linspace(-1, 1, 257)
    x = np.concatenate([rng.uniform(-1.2, 1.2, 5000), edges, np.nextafter(edges, -2.0),
                        np.nextafter(edges, 2.0)])
    reference = np.digitize(x, bins=edges[:-1]) - 1
    assert discretize_state(x) == reference.tolist()
    x32 = x.astype(np.float32)
    assert discretize_state(x32) == (np.digitize(x32, bins=edges[:-1]) - 1).tolist()


@pytest.mark.parametrize('bad,message', [
    (np.array([0.1, np.nan]), r'NaN/Inf at dims \[1\]'),
    (np.array([np.inf]), r'NaN/Inf at dims \[0\]'),
    (np.zeros((2, 3)), 'non-empty 1-D'),
    (np.zeros(0), 'non-empty 1-D'),
    (np.array(['a']), 'real-valued'),
])
def test_discretize_state_rejects(bad, message):
    with pytest.raises(ValueError, match=message):
        discretize_state(bad)


# --- action prompt --------------------------------------------------------------------------

def test_pi05_state_prompt_exact(tok):
    state = np.array([-1.0, 0.0, 0.9921875, -1.25, 0.5], dtype=np.float32)
    expected = 'Task: pick up the cup, State: 0 128 255 -1 192;\nAction: '
    assert format_action_prompt(' pick_up the cup\n', state, PromptFormat.PI05_STATE) == expected
    tp = tokenize_action_prompt(tok, ' pick_up the cup\n', state, PromptFormat.PI05_STATE, 200)
    full = [2] + tok.encode(expected, add_bos=False)
    assert tp.ids == full and tp.num_tokens == len(full)
    assert tp.tokens.dtype == np.int64 and tp.tokens.shape == (200,)
    assert tp.mask.dtype == np.bool_ and tp.mask.shape == (200,)
    assert tp.mask[:len(full)].all() and not tp.mask[len(full):].any()
    assert (tp.tokens[len(full):] == 0).all()
    assert not tp.truncated
    assert tok.decode(tp.tokens) == expected
    assert tp.tokens[0] == 2 and tp.max_len == 200


def test_pi05_state_prompt_writes_only_the_given_dims(tok):
    tp = tokenize_action_prompt(tok, 'go', np.zeros(3), PromptFormat.PI05_STATE, 64)
    assert tok.decode(tp.tokens) == 'Task: go, State: 128 128 128;\nAction: '


def test_state_padded_before_binning_as_lerobot_0_4_and_the_no_state_format(tok):
    # LeRobot <= v0.4.4 padded the normalized state to max_state_dim (32) before binning.
    state = np.array([-1.0, 0.5, 0.0])
    padded = format_action_prompt('go', state, PromptFormat.PI05_STATE, state_pad=6)
    assert padded == 'Task: go, State: 0 192 128 128 128 128;\nAction: '
    tp = tokenize_action_prompt(tok, 'go', state, PromptFormat.PI05_STATE, 200, state_pad=32)
    assert tok.decode(tp.tokens) == 'Task: go, State: 0 192 ' + ' '.join(['128'] * 30) + \
        ';\nAction: '
    assert format_action_prompt('go', state, PromptFormat.PI05_STATE, state_pad=2) == \
        format_action_prompt('go', state, PromptFormat.PI05_STATE)   # never cut
    # LeRobot's pi05 with include_state_in_prompt off
    no_state = tokenize_action_prompt(tok, ' go_left', state, PromptFormat.PI05_NO_STATE, 64)
    assert no_state.ids == [2] + tok.encode('Task: go left;\nAction: ', add_bos=False)


def test_pi0_prompt_encodes_newline_separately(tok):
    tp = tokenize_action_prompt(tok, 'put the bowl_on the plate', None, PromptFormat.PI0, 48)
    assert tp.ids == [2] + tok.encode('put the bowl on the plate', add_bos=False) + [NEWLINE_ID]
    assert tok.decode(tp.tokens) == 'put the bowl on the plate\n'
    ignored = tokenize_action_prompt(tok, 'put the bowl_on the plate', np.ones(8),
                                     PromptFormat.PI0, 48)
    assert ignored.ids == tp.ids


def test_action_prompt_errors(tok):
    with pytest.raises(ValueError, match='needs the normalized state'):
        tokenize_action_prompt(tok, 'go', None, PromptFormat.PI05_STATE, 200)
    with pytest.raises(ValueError, match='empty after cleaning'):
        tokenize_action_prompt(tok, ' \n ', np.zeros(2), PromptFormat.PI05_STATE, 200)
    with pytest.raises(ValueError, match='max_len must be >= 1'):
        tokenize_action_prompt(tok, 'go', np.zeros(2), PromptFormat.PI05_STATE, 0)
    with pytest.raises(ValueError, match='NaN'):
        tokenize_action_prompt(tok, 'go', np.array([np.nan]), PromptFormat.PI05_STATE, 200)


def test_action_prompt_truncation_warns_once(tok, caplog):
    state = np.linspace(-1, 1, 14)
    full = tokenize_action_prompt(tok, 'fold the towel', state, PromptFormat.PI05_STATE, 200)
    n = full.num_tokens
    exact = tokenize_action_prompt(tok, 'fold the towel', state, PromptFormat.PI05_STATE, n)
    assert not exact.truncated and exact.mask.all() and not _warnings(caplog)
    with caplog.at_level(logging.WARNING):
        cut = tokenize_action_prompt(tok, 'fold the towel', state, PromptFormat.PI05_STATE,
                                     n - 5)
        again = tokenize_action_prompt(tok, 'fold the towel', state, PromptFormat.PI05_STATE,
                                       n - 5)
    assert cut.truncated and cut.num_tokens == n - 5 and cut.mask.all()
    assert cut.ids == full.ids[:n - 5]
    assert again.ids == cut.ids
    (record,) = _warnings(caplog)
    assert f'{n} tokens, more than max_token_len {n - 5}' in record.getMessage()


# --- text-task prompts ----------------------------------------------------------------------

@pytest.mark.parametrize('kind,question,expected', [
    (TextTask.SUBTASK, None, 'Task: pick up the red cup. Subtask: '),
    (TextTask.MEMORY, None, 'Task: pick up the red cup. Memory: '),
    (TextTask.ANSWER, ' Where is_the cup? ',
     'Task: pick up the red cup. Question: Where is the cup? Answer: '),
])
def test_text_prompts_exact(tok, kind, question, expected):
    task = '  Pick_up the RED cup!\n'
    assert format_text_prompt(task, kind, question=question) == expected
    tp = tokenize_text_prompt(tok, task, kind, question=question, max_len=48)
    assert tp.ids == [2] + tok.encode(expected, add_bos=False)
    assert tok.decode(tp.tokens) == expected
    assert not tp.truncated and (tp.tokens[tp.num_tokens:] == 0).all()
    assert tp.mask.sum() == tp.num_tokens


@pytest.mark.parametrize('task,instr', [
    ('Stop!!', 'stop!'),  # only one trailing punctuation character goes (subtask repo rule)
    ('stack blocks', 'stack blocks'),
    ('stack blocks.', 'stack blocks'),
    ('Open the drawer?', 'open the drawer'),
])
def test_instruction_normalization(task, instr):
    assert format_text_prompt(task, TextTask.SUBTASK) == f'Task: {instr}. Subtask: '


@pytest.mark.parametrize('task,kind,question,message', [
    ('', TextTask.SUBTASK, None, 'empty after cleaning'),
    (' _ \n', TextTask.MEMORY, None, 'empty after cleaning'),
    ('!', TextTask.SUBTASK, None, 'empty after cleaning'),
    ('go', TextTask.ANSWER, None, 'needs a question'),
    ('go', TextTask.ANSWER, '  \n', 'question is empty'),
    ('go', TextTask.SUBTASK, 'why?', 'only used by TextTask.ANSWER'),
])
def test_text_prompt_errors(tok, task, kind, question, message):
    with pytest.raises(ValueError, match=message):
        tokenize_text_prompt(tok, task, kind, question=question, max_len=48)


@pytest.mark.parametrize('kind,question,seed', [
    (TextTask.SUBTASK, None, 'Subtask: '),
    (TextTask.MEMORY, None, 'Memory: '),
    (TextTask.ANSWER, 'what is in the basket?', 'Answer: '),
    (TextTask.ANSWER, 'is the ' + 'very ' * 40 + 'big cup there?', 'Answer: '),
])
def test_text_prompt_truncation_keeps_the_seed(tok, caplog, kind, question, seed):
    task = 'take the ' + 'red and blue ' * 30 + 'cups to the sink'
    with caplog.at_level(logging.WARNING):
        tp = tokenize_text_prompt(tok, task, kind, question=question, max_len=24)
    assert tp.truncated and tp.num_tokens <= 24
    text = tok.decode(tp.tokens)
    assert text.startswith('Task: take the red') and text.endswith(seed)
    assert tp.ids == [2] + tok.encode(text, add_bos=False)  # a well-formed, re-encoded prompt
    (record,) = _warnings(caplog)
    assert 'more than max_len 24' in record.getMessage() and seed in record.getMessage()


def test_text_prompt_truncation_shortens_the_longer_part_first(tok):
    question = 'which of the ' + 'many ' * 30 + 'cups is mine?'
    tp = tokenize_text_prompt(tok, 'pick up the cup', TextTask.ANSWER, question=question,
                              max_len=30)
    text = tok.decode(tp.tokens)
    assert text.startswith('Task: pick up the cup. Question: which of the many')
    assert text.endswith(' Answer: ')
    # Both long: both shrink to about the same length and neither disappears.
    task = 'take the ' + 'red ' * 60 + 'cup'
    tp = tokenize_text_prompt(tok, task, TextTask.ANSWER, question=question, max_len=30)
    instr, q = tok.decode(tp.tokens)[len('Task: '):].split('. Question: ')
    q = q.removesuffix(' Answer: ')
    n_instr, n_q = (len(tok.encode(t, add_bos=False)) for t in (instr, q))
    assert n_instr > 3 and n_q > 3 and abs(n_instr - n_q) <= 2


def test_text_prompt_max_len_too_small(tok):
    with pytest.raises(ValueError, match='cannot hold the ANSWER prompt'):
        tokenize_text_prompt(tok, 'go', TextTask.ANSWER, question='why?', max_len=6)
