"""Batching across requests: the sentences of every request waiting for one
translator are decoded together.

Requests arrive on the server's event loop; one thread decodes. A batch
starts when the thread is free: it takes the waiting sentences, up to a
token budget, after waiting at most `max_wait` for as many as the last
batch had, counted from the later of the first one's arrival and the end
of the last batch. The clients a batch answered send their next sentences
within milliseconds: a batch that started without them would leave them to
wait a whole batch, and batches would alternate large and small. Once
that many wait, a batch still takes those that keep arriving, each within
a gap of the last (clients that start together), up to the same deadline:
`BURST_GAP`, or `BURST_SHARE` of the last batch's decoding time if longer,
since a sentence that misses a batch waits all of it. A lone client's
sentence, after a batch of one, waits that gap alone; a full batch
(`translator.batch_size` sentences) does not wait. The
`Translator` then sorts them by length into its own batches, padded to its
buckets of source lengths and row counts, so that a compiled backend meets
only the shapes `Translator.warm_up` compiled.
"""

import asyncio
import collections
import concurrent.futures
import dataclasses
import time


# A batch that has the sentences it waited for still takes one that
# arrives this soon after the last: a burst goes in one batch, not two.
BURST_GAP = 0.002  # seconds
# ... or this share of the last batch's decoding time, if longer: new
# clients' first sentences come some milliseconds apart, and one that
# misses a batch waits all of it, while the gap costs the batch 1%.
BURST_SHARE = 0.01


class QueueFull(Exception):
    """More sentences are waiting than the server accepts: try again later."""


@dataclasses.dataclass
class _Sentence:
    ids: list  # source token ids, EOS last
    future: asyncio.Future
    arrived: float
    request: object  # shared by the sentences of one request


class Batcher:
    """Decodes the sentences of concurrent requests together.

    Args:
        translator: the `Translator` that decodes.
        max_tokens: the most source tokens a batch takes (a single longer
            sentence still goes, alone).
        max_wait: seconds a batch waits for sentences to join its first.
        max_queue: the most sentences waiting; `translate` raises
            `QueueFull` past it rather than wait without bound.
        metrics: a `Metrics` that counts batches and queue depth, or None.
        executor: the one-thread executor that decodes (shared by the
            batchers of a server), or None for one of its own.
        across_requests: False to decode each request's sentences on their
            own, one request after another (batching off, for comparison).
        burst_gap: seconds within which a sentence still joins a batch that
            has the sentences it waited for (at least; see `BURST_SHARE`).
    """

    def __init__(self, translator, max_tokens=4096, max_wait=0.05, max_queue=1024, metrics=None, executor=None,
                 across_requests=True, burst_gap=BURST_GAP):
        for name, value in (("max_tokens", max_tokens), ("max_queue", max_queue)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1. Received: {name}={value!r}")
        if not isinstance(max_wait, (int, float)) or not 0 <= max_wait < 10:
            raise ValueError(f"max_wait must be seconds in [0, 10). Received: max_wait={max_wait!r}")
        self.translator = translator
        self.max_tokens = max_tokens
        self.max_wait = max_wait
        self.burst_gap = burst_gap
        self.max_queue = max_queue
        self.metrics = metrics
        self.across_requests = across_requests
        self._waiting = collections.deque()
        self._arrived = None  # an asyncio.Event, made on the loop that serves
        self._worker = None
        # One thread decodes: the backend's own threads use every core.
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")

    @property
    def depth(self):
        """Sentences waiting, not yet in a batch."""
        return len(self._waiting)

    def start(self):
        """Starts the decoding loop on the running event loop."""
        self._arrived = asyncio.Event()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self):
        """Decodes what is waiting, then ends the loop and its thread."""
        while self._waiting:
            await asyncio.sleep(self.max_wait or 0.001)
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        if self._own_executor:
            self._executor.shutdown(wait=True)

    async def search(self, sources):
        """`(ids, scores)` of each source (token ids, EOS last), decoded
        with the sentences of other requests. Cancelling the caller cancels
        its sentences that have not started."""
        if self.depth + len(sources) > self.max_queue:
            raise QueueFull(
                f"{self.depth} sentences are waiting and this request adds {len(sources)}; "
                f"the server accepts {self.max_queue}"
            )
        loop = asyncio.get_running_loop()
        request, arrived = object(), time.perf_counter()
        sentences = [_Sentence(list(ids), loop.create_future(), arrived, request) for ids in sources]
        self._waiting.extend(sentences)
        self._arrived.set()
        try:
            return await asyncio.gather(*(sentence.future for sentence in sentences))
        except asyncio.CancelledError:
            for sentence in sentences:
                sentence.future.cancel()  # those not decoded yet are skipped
            raise

    def _take_batch(self):
        """The waiting sentences up to the token budget, oldest first;
        cancelled ones are dropped."""
        batch, tokens = [], 0
        while self._waiting:
            sentence = self._waiting[0]
            if sentence.future.done():  # its request was cancelled
                self._waiting.popleft()
                continue
            if batch and (tokens + len(sentence.ids) > self.max_tokens
                          or not self.across_requests and sentence.request is not batch[0].request):
                break
            batch.append(self._waiting.popleft())
            tokens += len(sentence.ids)
        return batch

    def _full(self):
        """Whether a whole batch waits: the translator's rows, or the token
        budget."""
        rows = getattr(self.translator, "batch_size", None)
        return (rows is not None and len(self._waiting) >= rows
                or sum(len(sentence.ids) for sentence in self._waiting) >= self.max_tokens)

    async def _gather(self, free_since, expected, gap):
        """Waits up to `max_wait` from the later of the first waiting
        sentence's arrival and `free_since` for more to join, until
        `expected` sentences wait and no more arrive within `gap`, or a
        whole batch waits."""
        deadline = max(self._waiting[0].arrived, free_since) + self.max_wait
        while not self._full() and (left := deadline - time.perf_counter()) > 0:
            if len(self._waiting) >= expected:
                left = min(left, gap)  # a burst still arriving
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return
            self._arrived.clear()

    async def _run(self):
        loop = asyncio.get_running_loop()
        free_since, expected, gap = time.perf_counter(), 1, self.burst_gap
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            if self.max_wait and self.across_requests and self._waiting:
                await self._gather(free_since, expected, gap)
            batch = self._take_batch()
            if self._waiting:
                self._arrived.set()  # more than a batch: go round again
            if not batch:
                continue
            started = time.perf_counter()
            try:
                found = await loop.run_in_executor(
                    self._executor, self.translator.search_ids, [sentence.ids for sentence in batch]
                )
            except Exception as error:  # noqa: BLE001 - each request gets the error
                for sentence in batch:
                    if not sentence.future.done():
                        sentence.future.set_exception(error)
                continue
            for sentence, result in zip(batch, found):
                if not sentence.future.done():
                    sentence.future.set_result(result)
            # Its clients, answered, will likely send as many again.
            free_since, expected = time.perf_counter(), len(batch)
            gap = max(self.burst_gap, BURST_SHARE * (free_since - started))
            if self.metrics is not None:
                self.metrics.batch(len(batch), free_since - started)
