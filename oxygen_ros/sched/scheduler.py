"""
The per-cycle scheduler: OxyGen and the isolated baseline as two policies (stdlib only).

Contract (vLLM v1 ``sched/interface.py``): ``add_request`` → ``schedule`` → a backend runs the
plan → ``update_from_output``. One call of ``schedule`` plans one control cycle; the prefix
chain each request reads and the jobs that compute it come from ``plan.py``. Not thread-safe:
the engine makes every call under its lock (engine/engine.py).

**Admission** (vLLM v1 ``Scheduler``): text requests wait in one bounded queue
(``request_queue.py``); ``schedule`` admits from its head and stops at the first request that
does not fit now (KV pool, decode batch, or the time before the action deadline), as vLLM's
``schedule`` stops where ``allocate_slots`` fails: first come first served, nobody overtakes.
``add_request`` refuses a request the KV pool could never hold. Only a request on the action
prefix of a frame without one is passed over (it keeps its place). A request with a prompt of
its own reads the one the frame that admits it brings (``FrameSpec.own_prompts``, built on
the frame's instruction); the scheduler sets it on the request as it admits it.

**Several robots** (``docs/design.md#several-robots``): one cycle plans the frames of every
robot due (``schedule`` takes one ``FrameSpec`` per robot); their action paths come stage by
stage (the backend batches each stage), each frame's text requests are admitted onto it only,
first come first served per robot (``admission.py``: a robot not due holds up nobody), and
one decode job serves every robot's running requests, k shrinking for the tightest deadline.
The action reserve holds an action prefix for each of ``max_robots`` robots; the waiting
queue is shared among the robots the caller names (``request_queue.queue_share``).

``OXYGEN`` (arXiv 2603.14371; ``docs/design.md#scheduler-oxygen_rossched``), per cycle:
  1. the frame's action prefix is prefilled once (vision once per frame) and denoised first,
     always: text can never take the blocks the action needs (``action_reserve_blocks``);
  2. new text/memory requests share that frame's K/V and prefill only what they lack: a
     request on the action prefix (``TextContext.ACTION_PREFIX``, OxyGen's root + language
     suffix) holds the action's prefix and prefills only its causal suffix, the suffixes of
     all of the cycle's new requests in one batched ``SuffixJob``; a request with a prompt
     of its own shares the whole prefix when its prompt is the action's, the image segment
     in causal-prompt mode. The seed token comes from the last hidden state of the request's
     chain; beyond the first of a cycle, a request is admitted only while the measured
     times leave a decode step before the action deadline (the others wait);
  3. one decode job runs k steps for every live text request of every frame, in one batch;
     k shrinks when the measured times say the full k would miss the action deadline, and
     the job carries that deadline: the backend stops between steps once the clock says the
     next one would miss it (the estimate was low: a busy CPU, a batch size not seen yet);
  4. requests that hit EOS or their budget are retired and their blocks freed.

``ISOLATED`` (openpi-style; OxyGen's ``blocking_baseline``, "separate prefixes for action and
language"): every job its own vision pass and its own full prefill (a request on the action
prefix prefills a copy of it, then its suffix), one after another; each text request decodes
to completion in its frame.
"""

from __future__ import annotations

import itertools
from typing import Collection, Sequence

from oxygen_ros.config import PrefixAttention
from oxygen_ros.kv.manager import KVCacheManager, SegmentSpec
from oxygen_ros.sched.admission import QueueWalk
from oxygen_ros.sched.cost import CostModel
from oxygen_ros.sched.output import (
    DecodeJob, NewRequestData, RunnerOutput, SchedulerOutput, SeedJob, SegmentKind)
from oxygen_ros.sched.plan import (
    ActionAlloc, cycle_deadline, cycle_frames, CyclePlan, request_chain)
from oxygen_ros.sched.request import (
    FrameSpec, Request, RequestKind, RequestStatus, TextContext)
from oxygen_ros.sched.request_queue import RequestQueue
from oxygen_ros.sched.scheduler_config import Policy, SchedulerConfig


class Scheduler:
    """
    Plans control cycles over one ``KVCacheManager``.

    :param config: the settings (read where they live: ``config`` may be replaced, as the
        engine does when the waiting bound changes).
    :param num_blocks: KV pool size in blocks (null block included).
    :param max_prefix_tokens: image tokens of all cameras + prompt slots: sizes the action
        reserve, the blocks kept free for the next cycle's action prefixes.
    :param prefix_attention: the model's prefix attention (what a frame's requests share).
    :param eos_token_id: the tokenizer's EOS id; it ends a text request when
        ``config.stop_on_eos``.
    :ivar prefix_blocks: the blocks of one action prefix at its largest.
    :ivar action_reserve_blocks: blocks every text admission keeps free for the next cycle's
        action prefixes: ``prefix_blocks`` for each of ``config.max_robots`` robots.
    :raises ValueError: the pool cannot hold two action prefixes per robot (one in use, one
        reserved).
    """

    def __init__(self, config: SchedulerConfig, *, num_blocks: int, max_prefix_tokens: int,
                 prefix_attention: PrefixAttention, eos_token_id: int,
                 cost: CostModel | None = None) -> None:
        if max_prefix_tokens < 1:
            raise ValueError(f'max_prefix_tokens must be >= 1, got {max_prefix_tokens}')
        self.config = config
        self.prefix_attention = PrefixAttention(prefix_attention)
        self.eos_token_id = eos_token_id if config.stop_on_eos else None
        """Ends a text request; None decodes every request to its budget."""
        self.cost = cost if cost is not None else CostModel()
        self.kv = KVCacheManager(num_blocks, config.block_size)
        self.prefix_blocks = self._action_blocks(max_prefix_tokens)
        self.action_reserve_blocks = config.max_robots * self.prefix_blocks
        if 2 * self.action_reserve_blocks > self.kv.capacity_blocks:
            held = 'two action prefixes' if config.max_robots == 1 else \
                f'{2 * config.max_robots} action prefixes (two for each of {config.max_robots} ' \
                f'robots)'
            raise ValueError(
                f'KV pool of {self.kv.capacity_blocks} blocks x {config.block_size} tokens '
                f'cannot hold {held} of {max_prefix_tokens} tokens '
                f'({self.prefix_blocks} blocks each); give it more memory')
        self.requests: dict[str, Request] = {}
        self.waiting = RequestQueue()
        self.running: list[Request] = []
        self._cycle = itertools.count(1)
        self._emb_ids = itertools.count()
        self._action_req_ids: list[str] = []
        self._claims: set[str] = set()
        """Waiting requests the pool refused: room is kept for them (``admission.py``)."""
        self._finished_since: set[str] = set()
        self._freed_since: set[int] = set()

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request: Request, robots: Collection[str] | None = None) -> None:
        """
        Queue a TEXT or MEMORY request at the tail; it waits until ``schedule`` admits it.

        :param robots: the robots sharing the waiting queue (the engine's), the request's
            among them; None: its robot alone (``RequestQueue.check_room``).
        :raises ValueError: an ACTION request (pass it in ``FrameSpec``), a duplicate id, a
            request the KV pool could never hold (``max_blocks_needed``), or a robot not among
            ``robots``.
        :raises QueueFullError: no place for it: ``max_waiting_requests`` requests wait, or
            its robot's share is taken (``request_queue.queue_share``).
        """
        if request.kind is RequestKind.ACTION:
            raise ValueError('ACTION requests come with their frame: FrameSpec(action=...)')
        if request.req_id in self.requests:
            raise ValueError(f'duplicate request id {request.req_id!r}')
        need = self.max_blocks_needed(request)
        room = self.kv.capacity_blocks - 2 * self.action_reserve_blocks
        if need > room:
            raise ValueError(
                f'{request.req_id}: needs up to {need} KV blocks (its prefix and a budget of '
                f'{request.max_tokens} tokens), the pool has {room} beside the action path: it '
                f'could never be admitted (lower max_tokens or give the KV pool more memory)')
        self.waiting.add(request, self.config.max_waiting_requests, robots)
        request.status = RequestStatus.WAITING
        self.requests[request.req_id] = request

    def check_room(self, robot: str = '', robots: Collection[str] | None = None) -> None:
        """Raise ``QueueFullError`` where ``add_request`` would for a request of ``robot``."""
        self.waiting.check_room(self.config.max_waiting_requests, robot, robots)

    def max_blocks_needed(self, request: Request) -> int:
        """
        Return the most KV blocks ``request`` can need at admission beside its frame's action.

        Its decode budget (the last token is never fed back), its suffix on the action
        prefix, and a prefix of its own: none under OXYGEN on the action prefix (the root is
        the action's), else at most an action prefix (images + ``max_prefix_tokens``' prompt
        slots: ``prefix_blocks``). Admission keeps the reserve free while the cycle's
        actions hold up to as much again, so a request needing at most
        ``capacity_blocks - 2 * action_reserve_blocks`` is admitted once the running ones end.
        """
        shares_root = request.context is TextContext.ACTION_PREFIX
        own = 0 if shares_root and self.config.policy is Policy.OXYGEN \
            else self.prefix_blocks
        suffix = self.kv.blocks_for(len(request.prompt_token_ids)) if shares_root else 0
        return own + suffix + self.kv.blocks_for(request.max_tokens - 1)

    def abort_request(self, req_id: str) -> Request | None:
        """
        Cancel a waiting or running request and free its blocks; return it (None: unknown).

        A request aborted between ``schedule`` and ``update_from_output`` runs in that plan;
        its tokens are ignored and the next plan lists it in ``finished_req_ids``.
        """
        return self.finish_request(req_id, RequestStatus.FINISHED_ABORTED)

    def finish_request(self, req_id: str, status: RequestStatus,
                       error: str = '') -> Request | None:
        """
        End a waiting or running request with ``status``, free its blocks; return it.

        As vLLM's ``finish_requests``; None for an unknown request.

        :param status: ``FINISHED_ABORTED`` (its owner cancelled it) or ``FINISHED_DROPPED``
            (``error`` says why).
        """
        req = self.requests.pop(req_id, None)
        if req is None:
            return None
        self.waiting.remove(req)
        self._claims.discard(req_id)
        if req in self.running:
            self.running.remove(req)
            self._free(req.req_id)
            self._finished_since.add(req_id)
        req.status, req.error = status, error
        return req

    def drop_all(self, error: str) -> list[Request]:
        """End every waiting and running request (``FINISHED_DROPPED``: engine shutdown)."""
        return [r for r in (self.finish_request(i, RequestStatus.FINISHED_DROPPED, error)
                            for i in list(self.requests)) if r]

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- planning ------------------------------------------------------------------------
    def schedule(self, frames: FrameSpec | Sequence[FrameSpec] | None, now: float = 0.0, *,
                 deadline: float | None = None) -> SchedulerOutput:
        """
        Plan one cycle on the frames of the robots due now; running text decodes in any case.

        :param frames: one frame per robot due (a ``FrameSpec`` alone: one robot); None or
            empty: no valid observation. Their action jobs come in deadline order, the
            tightest first (frames without a deadline last, in the order given).
        :param now: monotonic seconds at the start of the cycle (for the action deadline).
        :param deadline: monotonic seconds by which the cycle's text work must be done beside
            the frames' action deadlines, the earliest counting (e.g. the next control tick
            of a robot not due now); None: the frames' alone.
        :raises ValueError: two frames of one robot or with one id, or frames of more robots
            than ``max_robots`` (nothing has changed then).
        """
        assert not self._action_req_ids, 'update_from_output() of the last plan missing'
        frames = cycle_frames(frames, self.config.max_robots)
        cycle_id = next(self._cycle)
        isolated = self.config.policy is Policy.ISOLATED
        plan = CyclePlan(self._emb_ids, isolated=isolated)
        plan.add_actions([self._allocate_action(f) for f in frames if f.action is not None])
        deadline = cycle_deadline(frames, deadline)
        new_requests = self._admit_waiting(frames, plan, cycle_id, deadline, now)
        k = self.config.tokens_per_cycle
        if not isolated:
            plan.flush_suffixes()
            if new_requests:
                plan.jobs.append(SeedJob(tuple(d.req_id for d in new_requests)))
            k = self._tokens_this_cycle(plan, len(new_requests), deadline, now)
            decode = self._decode_job(k, {d.req_id for d in new_requests}, deadline)
            if decode is not None:
                plan.jobs.append(decode)
        out = SchedulerOutput(
            cycle_id=cycle_id, frame_ids=tuple(f.frame_id for f in frames),
            jobs=tuple(plan.jobs), new_requests=tuple(new_requests),
            finished_req_ids=frozenset(self._finished_since),
            freed_seg_ids=frozenset(self._freed_since),
            tokens_per_cycle=k, block_size=self.config.block_size)
        self._finished_since.clear()
        self._freed_since.clear()
        return out

    def _admit_waiting(self, frames: list[FrameSpec], plan: CyclePlan, cycle_id: int,
                       deadline: float | None, now: float) -> list[NewRequestData]:
        """Admit waiting text requests onto their robots' frames (``admission.py``)."""
        new_requests: list[NewRequestData] = []
        if not frames:
            return new_requests
        walk = QueueWalk({f.robot: f for f in frames}, self._claims, self.max_blocks_needed,
                         self.action_reserve_blocks)
        for req, frame in walk.candidates(self.waiting):
            if req.context is TextContext.ACTION_PREFIX and not frame.root_prompt:
                continue  # no root: keeps its place
            if not self._fits(req, frame, plan, len(new_requests), deadline, now):
                walk.close(req, claim=False)
                continue
            data = self._admit(req, frame, plan, cycle_id, *walk.reserved(req.robot))
            if data is None:
                walk.close(req, claim=True)  # first come first served: nobody overtakes
                continue
            walk.admitted(req)
            self.waiting.remove(req)
            new_requests.append(data)
            if plan.isolated:
                plan.decode_to_completion(req, self.eos_token_id)
        return new_requests

    def _action_blocks(self, prefix_tokens: int) -> int:
        if self.prefix_attention is PrefixAttention.CAUSAL_TEXT:
            # image and prompt are separate segments, each rounded up to whole blocks
            return self.kv.blocks_for(prefix_tokens) + 1
        return self.kv.blocks_for(prefix_tokens)

    def _chain(self, frame: FrameSpec, req: Request) -> list[SegmentSpec] | None:
        return request_chain(frame, req, isolated=self.config.policy is Policy.ISOLATED,
                             prefix_attention=self.prefix_attention)

    def _allocate_action(self, frame: FrameSpec) -> ActionAlloc:
        req = frame.action
        assert req is not None
        chain = self._chain(frame, req)
        assert chain is not None  # an action reads its own prompt
        alloc = self.kv.allocate(req.req_id, chain)
        # the reserve kept free by every text admission guarantees this (never starved)
        assert alloc is not None, 'action reserve violated'
        req.frame_id = frame.frame_id
        req.robot = frame.robot
        req.status = RequestStatus.RUNNING
        req.num_prefix_tokens = req.num_computed_tokens = alloc.num_prefix_tokens
        self._action_req_ids.append(req.req_id)
        self.requests[req.req_id] = req
        return ActionAlloc(frame, req, alloc.segments, alloc.new_segments)

    def _admit(self, req: Request, frame: FrameSpec, plan: CyclePlan, cycle_id: int,
               claim_blocks: int = 0, claim_rows: int = 0) -> NewRequestData | None:
        """
        Allocate ``req`` on ``frame`` and plan its prefix; None where the pool refuses it.

        :param claim_blocks: KV blocks to leave free for claims (``admission.QueueWalk``).
        :param claim_rows: decode rows to leave free for them.
        """
        if self.config.policy is Policy.OXYGEN and \
                len(self.running) + claim_rows >= self.config.max_running_requests:
            return None
        chain = self._chain(frame, req)
        assert chain is not None  # schedule passes over a request without a root
        # the last generated token is never fed back, so it needs no slot
        alloc = self.kv.allocate(req.req_id, chain, req.max_tokens - 1,
                                 keep_free=self.action_reserve_blocks + claim_blocks)
        if alloc is None:
            return None
        req.prompt_token_ids = frame.prompt_of(req)   # what its chain was built on
        req.frame_id = frame.frame_id
        req.status = RequestStatus.RUNNING
        req.first_cycle = cycle_id
        req.num_prefix_tokens = req.num_computed_tokens = alloc.num_prefix_tokens
        self.running.append(req)
        plan.add_segments(frame, req, alloc.new_segments)
        return NewRequestData(req.req_id, req.kind, frame.frame_id,
                              tuple(s.seg_id for s in alloc.segments), alloc.block_ids,
                              alloc.num_prefix_tokens, req.max_tokens, req.use_adapter)

    def _fits(self, req: Request, frame: FrameSpec, plan: CyclePlan, num_new: int,
              deadline: float | None, now: float) -> bool:
        """
        Return whether admitting ``req`` leaves time for a decode step before the deadline.

        Measured times (the cost model) of what the plan holds, plus the prefill of the
        segments ``req`` would add and its seed row. The first admission of a cycle always
        fits (a waiting request gets in within its turn however late cycles run); so does
        every one without a deadline or without measurements (ISOLATED has no deadline).
        """
        if num_new == 0 or self.config.policy is Policy.ISOLATED or deadline is None:
            return True
        new = [spec for spec in self._chain(frame, req) or ()
               if self.kv.lookup(spec.key) is None]
        suffix = sum(spec.num_tokens for spec in new if spec.key.kind is SegmentKind.SUFFIX)
        prefill = sum(spec.num_tokens for spec in new) - suffix
        left = deadline - now - self.cost.action_path(
            plan.num_images, plan.num_prefill_tokens + prefill, num_new + 1,
            plan.num_suffix_tokens + suffix, plan.num_chunks)
        step = self.cost.decode_step(len(self.running) + 1) or 0.0
        return left >= step * self.config.min_tokens_per_cycle

    def _tokens_this_cycle(self, plan: CyclePlan, num_new: int, deadline: float | None,
                           now: float) -> int:
        cfg = self.config
        if deadline is None:
            return cfg.tokens_per_cycle
        left = deadline - now - self.cost.action_path(
            plan.num_images, plan.num_prefill_tokens, num_new, plan.num_suffix_tokens,
            plan.num_chunks)
        return self.cost.tokens_within(left, len(self.running), cfg.tokens_per_cycle,
                                       cfg.min_tokens_per_cycle)

    def _decode_job(self, k: int, new_ids: set[str],
                    deadline: float | None = None) -> DecodeJob | None:
        rows: list[str] = []
        steps: list[int] = []
        for req in self.running:
            # the seed token of a new request is one of its k tokens this cycle
            n = min(k, req.num_tokens_left) - (1 if req.req_id in new_ids else 0)
            if n > 0:
                rows.append(req.req_id)
                steps.append(n)
        if not rows:
            return None
        return DecodeJob(tuple(rows), tuple(steps), self.eos_token_id, deadline)

    # -- results -------------------------------------------------------------------------
    def update_from_output(self, sched_out: SchedulerOutput,
                           runner_out: RunnerOutput) -> list[Request]:
        """
        Append sampled tokens, retire finished requests, free their blocks, learn timings.

        :returns: the text requests that finished this cycle.
        :raises ValueError: the runner output belongs to another plan.
        """
        if runner_out.cycle_id != sched_out.cycle_id:
            raise ValueError(f'runner output of cycle {runner_out.cycle_id} given for plan '
                             f'{sched_out.cycle_id}')
        for timing in runner_out.timings:
            self.cost.observe(timing)
        for req_id in self._action_req_ids:
            action = self.requests.pop(req_id)
            action.status = RequestStatus.FINISHED_STOPPED
            self._free(action.req_id)
        self._action_req_ids.clear()
        eos = self.eos_token_id
        finished: list[Request] = []
        for req_id, tokens in runner_out.sampled_token_ids.items():
            req = self.requests.get(req_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted while its plan ran
            for tok in tokens:
                req.output_token_ids.append(tok)
                if eos is not None and tok == eos:
                    req.status = RequestStatus.FINISHED_STOPPED
                    break
                if req.num_tokens_left <= 0:
                    req.status = RequestStatus.FINISHED_LENGTH
                    break
            req.num_computed_tokens = req.num_prefix_tokens + max(req.num_output_tokens - 1, 0)
            if req.is_finished:
                req.finish_cycle = sched_out.cycle_id
                finished.append(req)
        if finished:
            done = {r.req_id for r in finished}
            self.running = [r for r in self.running if r.req_id not in done]
            for req in finished:
                del self.requests[req.req_id]
                self._free(req.req_id)
                self._finished_since.add(req.req_id)
        return finished

    def _free(self, owner: str) -> None:
        for seg in self.kv.free(owner):
            self._freed_since.add(seg.seg_id)
