"""
One engine serving several robots equals each robot served alone (actions and texts).

Each robot has its own observations, control period, text requests, RTC history and noise
(``robots.noise_seed``: the engine's seed, the robot's name, its own frame index); the
weights, the KV pool and the decode batch are shared. Per robot, the chunks of the shared
engine equal those of an engine serving that robot alone (float32, 1e-5, as OxyGen against
isolated execution) and its texts are the same ids; a robot whose input is stale gets no
chunk while the others keep theirs, and its text requests wait for its own frames.
"""

from dataclasses import dataclass, field

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.control.rtc import RtcRequest
from oxygen_ros.engine import (
    Engine, EngineConfig, FinishReason, Observation, QueueFullError, TextTask)
from oxygen_ros.engine.robots import noise_seed
from oxygen_ros.sched.scheduler import Policy
import pytest

CAMERAS = CAMERA_SLOTS[:2]
DT_NS = 66_000_000
BUDGETS = (3, 6, 1, 5, 4)


@dataclass
class Robot:
    """A robot's script: when it is due, when its input is stale, what it asks."""

    name: str
    period: int                    # due every `period` cycles
    phase: int = 0
    stale: tuple[int, ...] = ()    # cycles it is due with no valid observation
    instruction: str = 'pick up the red block'
    rng_seed: int = 0
    guided: bool = False
    frames: dict = field(default_factory=dict)

    def due(self, cycle: int) -> bool:
        return cycle % self.period == self.phase

    def observation(self, cycle: int) -> Observation | None:
        """Return its observation of ``cycle`` (drawn once), None when stale."""
        if cycle in self.stale:
            return None
        if cycle not in self.frames:
            rng = np.random.default_rng((self.rng_seed, cycle))
            images = {slot: rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
                      for slot in CAMERAS}
            self.frames[cycle] = Observation(
                images=images, state=rng.uniform(-1, 1, 8).astype(np.float32),
                prompt=self.instruction, stamp_ns=(cycle + 1) * DT_NS)
        return self.frames[cycle]

    def asks(self, cycle: int) -> list[tuple[TextTask, str | None, int, str]]:
        """Return the text requests it submits before ``cycle``: (task, question, budget, id)."""
        out = []
        if cycle % 3 == self.phase % 3:
            out.append((TextTask.SUBTASK, None, BUDGETS[cycle % 5], f'{self.name}-sub{cycle}'))
        if cycle % 4 == 1:
            out.append((TextTask.ANSWER, f'where is block {cycle} of {self.name}?',
                        BUDGETS[(cycle + 2) % 5], f'{self.name}-ask{cycle}'))
        if cycle == 2:
            out.append((TextTask.MEMORY, None, 4, f'{self.name}-mem{cycle}'))
        return out


def engine_for(names, model, tokenizer, mode, policy=Policy.OXYGEN):
    cfg = EngineConfig.create(preset='tiny', policy=policy, prefix_attention=mode,
                              cameras=CAMERAS, tokens_per_cycle=2, seed=11,
                              max_robots=max(len(names), 1))
    return Engine(cfg, model=model, tokenizer=tokenizer, robots=tuple(names))


def serve(engine, robots, cycles=10):
    """Run ``cycles`` cycles of ``robots`` on ``engine``; return chunks and texts by robot."""
    chunks = {r.name: [] for r in robots}
    texts = {r.name: {} for r in robots}
    rtc = RtcRequest(1, DT_NS)

    def book(out):
        for chunk in out.actions:
            chunks[chunk.robot].append((chunk.stamp_ns, chunk.actions, chunk.guided))
        for text in out.finished:
            texts[text.robot][text.req_id] = (text.token_ids, text.finish_reason)

    for cycle in range(cycles):
        for robot in robots:
            for task, question, budget, req_id in robot.asks(cycle):
                engine.submit_text(task, question=question, max_tokens=budget, req_id=req_id,
                                   robot=robot.name)
        due = {r.name: r.observation(cycle) for r in robots if r.due(cycle)}
        guided = {r.name: rtc for r in robots if r.guided and due.get(r.name) is not None
                  and engine.chunk_history_of(r.name).previous is not None}
        cycle_run = engine.begin(due, rtc=guided)
        taken = list(cycle_run.actions())
        out = cycle_run.finish()
        assert [c.robot for c in taken] == [c.robot for c in out.actions]
        assert {c.robot for c in out.actions} == {n for n, o in due.items() if o is not None}
        book(out)
    for _ in range(40):
        if not engine.num_running and not engine.num_waiting:
            break
        book(engine.step({}))
    return chunks, texts


def robot_scripts():
    return [Robot('left', 1, rng_seed=1),
            Robot('right', 2, phase=1, stale=(5,), instruction='open the drawer', rng_seed=2),
            Robot('arm3', 3, phase=0, rng_seed=3)]


def assert_same(together, alone):
    (chunks_t, texts_t), (chunks_a, texts_a) = together, alone
    assert [c[0] for c in chunks_t] == [c[0] for c in chunks_a]
    for (_, a, ga), (_, b, gb) in zip(chunks_a, chunks_t):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
        assert ga == gb
    assert texts_t == texts_a


@pytest.mark.parametrize('mode,policy', [(PrefixAttention.BIDIRECTIONAL, Policy.OXYGEN),
                                         (PrefixAttention.CAUSAL_TEXT, Policy.OXYGEN),
                                         (PrefixAttention.BIDIRECTIONAL, Policy.ISOLATED)])
def test_robots_together_equal_each_alone(mode, policy, tiny_models, tokenizer):
    model = tiny_models(mode, CAMERAS)
    scripts = robot_scripts()
    together_chunks, together_texts = serve(
        engine_for([r.name for r in scripts], model, tokenizer, mode, policy), scripts)
    for robot in robot_scripts():
        alone = serve(engine_for([robot.name], model, tokenizer, mode, policy), [robot])
        together = together_chunks[robot.name], together_texts[robot.name]
        assert_same(together, (alone[0][robot.name], alone[1][robot.name]))
    # what the equality is worth: every robot acted and talked, and their outputs differ
    assert all(len(c) >= 3 for c in together_chunks.values())
    assert all(len(t) >= 3 for t in together_texts.values())
    first = [c[0][1] for c in together_chunks.values()]
    assert not np.allclose(first[0], first[1])
    # the right arm was due at cycle 5 with a stale input: no chunk of it then
    assert (6 * DT_NS) not in [c[0] for c in together_chunks['right']]


def test_rtc_histories_stay_apart(tiny_models, tokenizer):
    mode = PrefixAttention.BIDIRECTIONAL
    model = tiny_models(mode, CAMERAS)
    scripts = [Robot('left', 1, rng_seed=1, guided=True),
               Robot('right', 2, phase=1, rng_seed=2, guided=True)]
    engine = engine_for(['left', 'right'], model, tokenizer, mode)
    chunks, _ = serve(engine, scripts, cycles=6)
    for name in ('left', 'right'):
        history = engine.chunk_history_of(name).previous
        assert history.stamp_ns == chunks[name][-1][0]      # its own last chunk
        np.testing.assert_array_equal(history.robot, chunks[name][-1][1])
        assert [g for _, _, g in chunks[name]] == [False] + [True] * (len(chunks[name]) - 1)
    for robot in [Robot('left', 1, rng_seed=1, guided=True),
                  Robot('right', 2, phase=1, rng_seed=2, guided=True)]:
        alone, _ = serve(engine_for([robot.name], model, tokenizer, mode), [robot],
                         cycles=6)
        assert_same((chunks[robot.name], {}), (alone[robot.name], {}))
    engine.reset_chunk_history('left')
    assert engine.chunk_history_of('left').previous is None
    assert engine.chunk_history_of('right').previous is not None


def test_a_stale_robot_does_not_stall_the_others(tiny_models, tokenizer):
    mode = PrefixAttention.BIDIRECTIONAL
    engine = engine_for(['left', 'right'], tiny_models(mode, CAMERAS), tokenizer, mode)
    left, right = Robot('left', 1, rng_seed=1), Robot('right', 1, rng_seed=2)
    engine.submit_text(TextTask.ANSWER, question='what is here?', max_tokens=2,
                       req_id='right-q', robot='right')
    for cycle in range(4):   # the right arm's input is stale: its question waits
        out = engine.step({'left': left.observation(cycle), 'right': None})
        assert [c.robot for c in out.actions] == ['left']
        assert engine.num_waiting == 1 and engine.num_running == 0
    texts = {}
    for cycle in range(4, 8):
        out = engine.step({'left': left.observation(cycle), 'right': right.observation(cycle)})
        assert sorted(c.robot for c in out.actions) == ['left', 'right']
        texts.update({t.req_id: t for t in out.finished})
    answer = texts['right-q']
    assert answer.robot == 'right' and answer.finish_reason is FinishReason.LENGTH
    assert answer.frame_stamp_ns == right.observation(4).stamp_ns   # read its own frame


def test_noise_seeds():
    assert noise_seed(11, '', 7) == 11 * 1_000_003 + 7          # one robot: as always
    seeds = {noise_seed(11, name, i) for name in ('', 'left', 'right') for i in range(100)}
    assert len(seeds) == 300


def test_robot_errors(tiny_models, tokenizer):
    mode = PrefixAttention.BIDIRECTIONAL
    model = tiny_models(mode, CAMERAS)
    engine = engine_for(['left', 'right'], model, tokenizer, mode)
    obs = Robot('left', 1).observation(0)
    with pytest.raises(ValueError, match="unknown robot 'top'"):
        engine.submit_text(TextTask.SUBTASK, robot='top')
    with pytest.raises(ValueError, match='serves 2 robots'):
        engine.step(obs)
    with pytest.raises(ValueError, match="unknown robot 'top'"):
        engine.step({'top': obs})
    with pytest.raises(ValueError, match='rtc for robots not due'):
        engine.step({'left': obs}, rtc={'right': RtcRequest(1, DT_NS)})
    with pytest.raises(ValueError, match='max_robots is 2'):
        engine.add_robot('third')
    with pytest.raises(ValueError, match='not a ROS name token'):
        engine_for(['left', '2nd'], model, tokenizer, mode)
    with pytest.raises(ValueError, match='unnamed robot is served alone'):
        engine_for(['left', ''], model, tokenizer, mode)
    engine.submit_text(TextTask.SUBTASK, req_id='gone', robot='right')
    dropped = engine.remove_robot('right')
    assert [(o.req_id, o.finish_reason, o.error) for o in dropped] == \
        [('gone', FinishReason.DROPPED, 'robot removed')]
    assert engine.robots == ('left',) and engine.num_waiting == 0
    engine.add_robot('third')
    assert engine.step({'third': obs}).actions[0].robot == 'third'


def test_warmup_of_several_robots_leaves_no_trace(tiny_models, tokenizer):
    mode = PrefixAttention.BIDIRECTIONAL
    model = tiny_models(mode, CAMERAS)
    warmed = engine_for(['left', 'right'], model, tokenizer, mode)
    warmed.warmup(Robot('left', 1, rng_seed=9).observation(0))
    assert warmed.num_running == warmed.num_waiting == 0
    assert warmed.scheduler.kv.num_used_blocks == 0
    scripts = [Robot('left', 1, rng_seed=1), Robot('right', 2, phase=1, rng_seed=2)]
    after = serve(warmed, scripts, cycles=5)
    fresh = serve(engine_for(['left', 'right'], model, tokenizer, mode), scripts, cycles=5)
    for name in ('left', 'right'):
        assert_same((after[0][name], after[1][name]), (fresh[0][name], fresh[1][name]))


def test_a_robot_flooding_questions_leaves_the_other_its_share(tiny_models, tokenizer):
    """4 places, 2 robots: left stops at 2, right's question is accepted and answered."""
    mode = PrefixAttention.BIDIRECTIONAL
    cfg = EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=CAMERAS,
                              tokens_per_cycle=2, seed=11, max_robots=2, max_waiting_requests=4)
    engine = Engine(cfg, model=tiny_models(mode, CAMERAS), tokenizer=tokenizer,
                    robots=('left', 'right'))
    left, right = Robot('left', 1, rng_seed=1), Robot('right', 1, rng_seed=2)

    def flood(robot):
        accepted = []
        for i in range(10):
            try:
                accepted.append(engine.submit_text(TextTask.ANSWER, question=f'block {i}?',
                                                   max_tokens=2, robot=robot))
            except QueueFullError as exc:
                return accepted, str(exc)
        raise AssertionError('never refused')

    lefts, refused = flood('left')
    assert len(lefts) == 2 and refused == (
        "queue full for robot 'left' (2 requests waiting, 2 of them its own; 2 places kept "
        'for the other robots, max_waiting_requests 4)')
    engine.submit_text(TextTask.ANSWER, question='what is here?', max_tokens=2,
                       req_id='right-q', robot='right')
    texts = {}
    for cycle in range(3):           # left's input is stale: its questions wait
        out = engine.step({'left': None, 'right': right.observation(cycle)})
        texts.update({t.req_id: t for t in out.finished})
    assert texts['right-q'].robot == 'right' and texts['right-q'].finish_reason is \
        FinishReason.LENGTH and len(texts['right-q'].token_ids) == 2
    assert sorted(r.req_id for r in engine.scheduler.waiting) == sorted(lefts)
    assert flood('left') == ([], refused)                 # right's places stay kept
    engine.remove_robot('right')                          # the share follows: all 4 left's
    more, refused = flood('left')
    assert len(more) == 2 and refused == 'queue full (4 requests waiting, max_waiting_requests 4)'
    for cycle in range(3, 8):
        texts.update({t.req_id: t for t in engine.step({'left': left.observation(cycle)})
                      .finished})
    assert set(lefts + more) <= set(texts) and engine.num_waiting == engine.num_running == 0
