"""The simulated engine core: admission by KV blocks, the timing model, aborts, accounting.

A request becomes a `Job`: its whole output is planned up front (`textgen.plan_output`), its
KV blocks are reserved at admission (it waits in FIFO order when they are not there), and its
tokens are released on the clock of the timing model. In `--fast` mode nothing sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from simengine.injection import Faults
from simengine.kvcache import Allocation, BlockPool
from simengine.openai_api import ApiError, GenRequest
from simengine.options import EngineOptions
from simengine.prompt import PromptInfo, analyze
from simengine.textgen import Plan, natural_length, plan_output
from simengine.vllm_metrics import EngineMetrics


class Job:
    """One generation request inside the engine."""

    __slots__ = (
        "aborted",
        "alloc",
        "arrival",
        "cached_tokens",
        "digest",
        "g",
        "hashes",
        "on_abort",
        "plan",
        "prompt_len",
        "registered",
        "remote_kv",
        "sent",
        "tokens",
        "waker",
    )

    def __init__(self, g: GenRequest, info: PromptInfo, plan: Plan, arrival: float) -> None:
        self.g = g
        self.digest = info.digest
        self.hashes = info.hashes
        self.tokens = info.tokens
        self.plan = plan
        self.arrival = arrival
        self.prompt_len = info.length
        self.alloc: Allocation | None = None
        self.cached_tokens = 0
        self.sent = 0  # tokens emitted so far
        self.aborted = False
        self.registered = False
        self.remote_kv = False  # KV came from a prefill engine: no local prefill compute
        self.waker: asyncio.Future[None] | None = None
        self.on_abort: list[Callable[[], None]] = []


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Engine:
    """Admission, timing and accounting for every request of one engine process."""

    def __init__(self, settings: EngineOptions, faults: Faults) -> None:
        self.settings = settings
        self.faults = faults
        self.pool = BlockPool(settings.num_blocks, settings.block_size)
        self.running = 0
        self.waiting: deque[Job] = deque()
        self.jobs: dict[str, Job] = {}
        self.suspended = False
        # Fleet operations (`simengine.admin_api`): asleep refuses generation with 503; while
        # `unpaused` is clear new requests wait for it; a weights reload bumps the version.
        self.asleep = False
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.weights_version = 1
        self.metrics = EngineMetrics(settings.model, self.gauges)
        self._prefill_free_at = 0.0

    # ------------------------------------------------------------------ planning

    def prepare(self, g: GenRequest, cap: int | None = None) -> Job:
        """Check the request against the context and the cache, and plan its output.

        `cap` limits the tokens generated (an SGLang prefill emits only the first one).
        """
        s = self.settings
        info = analyze(g.prompt_text, g.prompt_ids, s.block_size)
        n = info.length
        max_tokens = g.max_tokens if g.max_tokens is not None else s.max_model_len - n
        if n + max_tokens > s.max_model_len or max_tokens < 1:
            raise ApiError(
                400,
                f"This model's maximum context length is {s.max_model_len} tokens. However, you requested "
                f"{n + max(max_tokens, 1)} tokens ({n} in the messages, {max(max_tokens, 1)} in the completion). "
                "Please reduce the length of the messages or completion.",
                param=g.max_tokens_field if g.max_tokens is not None else "messages",
            )
        if g.sampling.min_tokens > max_tokens:
            raise ApiError(
                400, f"min_tokens must be less than or equal to max_tokens={max_tokens}", param="min_tokens"
            )
        if cap is not None:
            max_tokens = min(max_tokens, cap)
        natural = max_tokens
        # A natural end (EOS) only without max_tokens: with it, output length is predictable
        # and a continuation (prompt + partial text, remaining budget) ends where the original would.
        if not g.sampling.ignore_eos and g.max_tokens is None:
            natural = natural_length(info.digest, g.sampling, s.natural_min_tokens, s.natural_max_tokens)
        plan = plan_output(info.ctx, g.sampling, max_tokens, natural, self.faults.spec.precision)
        if self.pool.blocks_for(n + plan.completion_tokens) > s.num_blocks:
            raise ApiError(
                400,
                f"request needs {n + plan.completion_tokens} tokens of KV cache but the engine holds "
                f"{s.num_blocks * s.block_size}",
                param="max_tokens",
            )
        return Job(g, info, plan, time.monotonic())

    # ------------------------------------------------------------------ admission

    def try_admit(self, job: Job) -> bool:
        """Admit now if nobody waits ahead and the blocks are there."""
        if self.waiting or self.running >= self.settings.max_num_seqs:
            return False
        return self._admit(job)

    def _admit(self, job: Job) -> bool:
        alloc = self.pool.allocate(job.hashes, job.prompt_len + job.plan.completion_tokens, job.tokens)
        if alloc is None:
            return False
        bs = self.settings.block_size
        cached = alloc.cached_blocks * bs
        while cached >= job.prompt_len and cached > 0:
            cached -= bs  # like vLLM, the last prompt token is always computed
        job.alloc = alloc
        job.cached_tokens = cached
        self.running += 1
        m = self.metrics
        m.prefix_queries += job.prompt_len
        m.prefix_hits += cached
        m.prompt_tokens += job.prompt_len
        return True

    async def admit(self, job: Job) -> None:
        """Wait (FIFO) until the job holds its blocks; returns early if it is aborted."""
        if self.try_admit(job):
            return
        self.waiting.append(job)
        fut = asyncio.get_running_loop().create_future()
        job.waker = fut
        try:
            await fut
        finally:
            job.waker = None
            if job.alloc is None:
                # Aborted or cancelled while waiting.
                try:
                    self.waiting.remove(job)
                except ValueError:
                    pass

    def _wake_waiters(self) -> None:
        while self.waiting and self.running < self.settings.max_num_seqs:
            job = self.waiting[0]
            if not self._admit(job):
                return
            self.waiting.popleft()
            if job.waker is not None:
                _wake(job.waker)

    def release(self, alloc: Allocation) -> None:
        """Give blocks back (also used by P/D stores that held them) and admit waiters."""
        self.pool.free(alloc)
        self._wake_waiters()

    def finish(self, job: Job, reason: str) -> None:
        """Account a job that is done for good and free what it still holds."""
        if job.registered and self.jobs.get(job.g.rid) is job:
            del self.jobs[job.g.rid]
        job.registered = False
        m = self.metrics
        m.generation_tokens += job.sent
        m.finished[reason] = m.finished.get(reason, 0) + 1
        m.e2e.observe(time.monotonic() - job.arrival)
        if job.alloc is not None:
            self.running -= 1
            alloc, job.alloc = job.alloc, None
            self.release(alloc)

    def take_blocks(self, job: Job) -> Allocation:
        """Hand the job's blocks to a P/D store; the job stops counting as running."""
        assert job.alloc is not None
        alloc, job.alloc = job.alloc, None
        self.running -= 1
        self._wake_waiters()
        return alloc

    # ------------------------------------------------------------------ aborts

    def register(self, job: Job) -> None:
        """Make the job abortable by its request id."""
        self.jobs[job.g.rid] = job
        job.registered = True

    def abort(self, rid: str) -> bool:
        """Abort a request by id; True if it was found."""
        job = self.jobs.get(rid)
        if job is None:
            return False
        self.abort_job(job)
        return True

    def abort_all(self) -> int:
        """Abort every registered request; returns how many."""
        jobs = list(self.jobs.values())
        for job in jobs:
            self.abort_job(job)
        return len(jobs)

    def abort_job(self, job: Job) -> None:
        if job.aborted:
            return
        job.aborted = True
        if job.waker is not None:
            _wake(job.waker)
        for cb in job.on_abort:
            cb()

    # ------------------------------------------------------------------ timing

    async def pause(self, job: Job, seconds: float) -> None:
        """Sleep `seconds` unless the job is aborted first."""
        if seconds <= 0 or job.aborted:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        handle = loop.call_later(seconds, _wake, fut)
        job.waker = fut
        try:
            await fut
        finally:
            handle.cancel()
            job.waker = None

    def prefill_seconds(self, job: Job) -> float:
        """Compute time of the job's prefill: the uncached prompt tokens."""
        if self.settings.fast:
            return 0.0
        sp = self.settings.speeds
        if job.remote_kv:
            return sp.kv_transfer_ms_per_block * len(job.hashes) / 1000
        return (
            sp.ttft_base_ms + (job.prompt_len - job.cached_tokens) * 1000 / sp.prefill_tokens_per_s
        ) / 1000

    async def prefill(self, job: Job) -> None:
        """Run the prefill; prefills share one compute stream, so they queue behind each other."""
        seconds = self.prefill_seconds(job)
        if seconds <= 0:
            return
        now = time.monotonic()
        start = max(now, self._prefill_free_at)
        self._prefill_free_at = start + seconds
        await self.pause(job, self._prefill_free_at - now)

    def itl_seconds(self) -> float:
        """The gap before the next token, given how many requests share the batch."""
        slow = self.faults.spec.slow_tokens_ms
        if self.settings.fast:
            return slow / 1000
        sp = self.settings.speeds
        return (sp.itl_ms + sp.itl_per_running_ms * max(0, self.running - 1) + slow) / 1000

    # ------------------------------------------------------------------ observation

    def gauges(self) -> tuple[int, int, float]:
        """(running, waiting, KV usage) for /metrics."""
        return self.running, len(self.waiting), self.pool.usage()
