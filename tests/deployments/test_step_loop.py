"""The step loop around an engine, driven by a fake engine (pure logic; the real one runs in tests/e2e)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine.errors import ContextLengthExceededError
from engine.messages import EngineStats, GenerateRequest, RequestOutput, SamplingParams

import pytest

from deployments.messages import Admitted
from deployments.outbox import Outbox
from deployments.step_loop import MAX_STRETCHED_INTERVAL_S, StepLoop


class FakeEngine:
    """Emits one token per running request per step; `step_s` makes steps take wall time."""

    def __init__(self, step_s: float = 0.0, fail_steps: int = 0):
        self.step_s = step_s
        self.fail_steps = fail_steps
        self.remaining: dict[str, int] = {}
        self.aborted: list[str] = []
        self.num_steps = 0
        self.step_threads: set[str] = set()
        self._lock = threading.Lock()

    def add_request(self, request: GenerateRequest) -> None:
        if len(request.prompt_token_ids) > 8:
            raise ContextLengthExceededError("prompt too long", param="prompt")
        with self._lock:
            self.remaining[request.request_id] = request.params.max_tokens or 1

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            if request_id in self.remaining:
                self.aborted.append(request_id)
                self.remaining[request_id] = -1  # finished with "abort" at the next step

    def has_unfinished_requests(self) -> bool:
        return bool(self.remaining)

    def step(self) -> list[RequestOutput]:
        self.step_threads.add(threading.current_thread().name)
        time.sleep(self.step_s)
        self.num_steps += 1
        if self.fail_steps:
            self.fail_steps -= 1
            raise RuntimeError("step exploded")
        with self._lock:
            return [self._advance(rid) for rid in list(self.remaining)]

    def _advance(self, request_id: str) -> RequestOutput:
        left = self.remaining[request_id]
        if left < 0:
            del self.remaining[request_id]
            return RequestOutput(request_id, [], "", finish_reason="abort")
        self.remaining[request_id] = left - 1
        finish = "length" if left == 1 else None
        if finish:
            del self.remaining[request_id]
        return RequestOutput(request_id, [left], f"<{left}>", finish_reason=finish)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.remaining), num_steps=self.num_steps)


def request(request_id: str, max_tokens: int, prompt_len: int = 3) -> GenerateRequest:
    return GenerateRequest(request_id, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens))


async def collect(loop: StepLoop, req: GenerateRequest) -> list:
    return [item async for item in loop.generate(req)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_streams_every_token_in_order_and_ends_with_the_finish():
    engine = FakeEngine()
    items = run(collect(StepLoop(engine, 0.0), request("a", 4)))
    outputs = [out for batch in items for out in batch]
    assert "".join(o.new_text for o in outputs) == "<4><3><2><1>"
    assert outputs[-1].finish_reason == "length" and all(not o.finished for o in outputs[:-1])


def test_fast_steps_coalesce_into_few_batches():
    engine = FakeEngine(step_s=0.002)
    items = run(collect(StepLoop(engine, 0.05), request("a", 40)))
    assert sum(len(batch) for batch in items) == 40
    assert len(items) < 20  # ~80 ms of steps at one batch per 50 ms, not 40 actor messages


def test_many_open_streams_share_a_batch_rate_and_keep_every_token():
    async def batches_per_stream(max_batches_per_s: float | None) -> list[list]:
        loop = StepLoop(FakeEngine(step_s=0.01), 0.0, max_batches_per_s)
        return await asyncio.gather(*(collect(loop, request(f"r{i}", 30)) for i in range(8)))

    capped, uncapped = run(batches_per_stream(40.0)), run(batches_per_stream(None))
    for items in capped:  # 8 streams at 40 batches/s: one batch per stream per 0.2 s
        assert [o.new_token_ids[0] for batch in items for o in batch] == list(range(30, 0, -1))
        assert items[0] == [] and len(items[1]) == 1  # admitted, then the first token is not held back
    assert sum(map(len, capped)) * 3 < sum(map(len, uncapped))  # ~30 per stream uncapped


def test_a_long_interval_never_holds_back_the_end_of_a_stream():
    start_s = time.monotonic()
    items = run(collect(StepLoop(FakeEngine(step_s=0.01), 5.0), request("a", 3)))
    assert [len(batch) for batch in items] == [0, 1, 2]  # admitted, the first token, the rest with the finish
    assert time.monotonic() - start_s < 2.5  # not the 5 s interval


def test_an_admitted_request_says_so_at_once_before_any_step():
    async def main():
        engine = FakeEngine(step_s=0.5)
        stream = StepLoop(engine, 0.0).generate(request("a", 2))
        first = await asyncio.wait_for(anext(stream), 0.2)  # sooner than the first step's output
        await stream.aclose()
        return first

    assert run(main()) == []


def test_a_waiting_request_gets_heartbeats_until_its_outputs_come():
    engine = FakeEngine(step_s=0.35)  # the first output comes after a 0.35 s step: the request "waits"
    items = run(collect(StepLoop(engine, 0.0, heartbeat_s=0.1), request("a", 2)))
    outputs = [out for batch in items for out in batch]
    assert [o.new_token_ids for o in outputs] == [[2], [1]]
    first_output = next(i for i, batch in enumerate(items) if batch)
    assert first_output >= 3 and all(batch == [] for batch in items[:first_output])  # ack + >= 2 heartbeats


def test_the_batch_rate_stretches_the_interval_only_past_it():
    loop = StepLoop(FakeEngine(), 0.05, 100.0)
    assert loop.stream_interval_s() == 0.05
    loop._queues |= {f"r{i}": asyncio.Queue() for i in range(20)}
    assert loop.stream_interval_s() == pytest.approx(0.2)
    loop._queues |= {f"s{i}": asyncio.Queue() for i in range(500)}
    assert loop.stream_interval_s() == MAX_STRETCHED_INTERVAL_S  # not 5.2 s


def test_an_output_channel_counts_as_one_stream_for_the_batch_rate():
    loop = StepLoop(FakeEngine(), 0.05, 100.0)
    outbox = Outbox(loop.stream_interval_s)
    loop._outboxes["c"] = outbox
    loop._queues |= {f"r{i}": asyncio.Queue() for i in range(20)}
    loop._bound |= {f"r{i}": outbox for i in range(20)}  # all 20 on the channel: 1 sender, not 20
    assert loop.stream_interval_s() == 0.05


def test_concurrent_requests_get_only_their_own_outputs():
    async def main():
        loop = StepLoop(FakeEngine(step_s=0.001), 0.0)
        return await asyncio.gather(*(collect(loop, request(f"r{i}", i + 1)) for i in range(8)))

    for i, items in enumerate(run(main())):
        outputs = [out for batch in items for out in batch]
        assert {o.request_id for o in outputs} == {f"r{i}"} and len(outputs) == i + 1


def test_rejected_request_comes_back_as_a_value_and_the_loop_goes_on():
    async def main():
        loop = StepLoop(FakeEngine(), 0.0)
        rejected = await collect(loop, request("bad", 2, prompt_len=50))
        accepted = await collect(loop, request("good", 2))
        return rejected, accepted

    rejected, accepted = run(main())
    assert len(rejected) == 1 and isinstance(rejected[0], ContextLengthExceededError)
    assert rejected[0].param == "prompt"
    assert accepted[-1][-1].finish_reason == "length"


def test_closing_the_stream_early_aborts_the_request():
    engine = FakeEngine(step_s=0.001)

    async def main():
        loop = StepLoop(engine, 0.0)
        stream = loop.generate(request("a", 1000))
        await stream.__anext__()
        await stream.aclose()
        for _ in range(100):  # the abort is applied at the engine's next step
            if not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)

    run(main())
    assert engine.aborted == ["a"] and not engine.has_unfinished_requests()


@pytest.mark.parametrize("stream_interval_s", [0.0, 0.01])
def test_cancelling_the_consumer_aborts_the_request(stream_interval_s):
    # With batches coalescing (an interval), a cancel often lands as a get completes: 5 tries catch
    # a loop that swallows it (asyncio.wait_for on Python 3.11 did, most of the time).
    async def main(engine: FakeEngine):
        loop = StepLoop(engine, stream_interval_s)
        task = asyncio.ensure_future(collect(loop, request("a", 100_000)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    for attempt in range(5):
        engine = FakeEngine(step_s=0.002)
        run(main(engine))
        assert engine.aborted == ["a"], attempt


def test_a_failing_step_fails_requests_in_flight_but_not_the_loop():
    async def main():
        loop = StepLoop(FakeEngine(fail_steps=1), 0.0)
        failed = await collect(loop, request("a", 3))
        later = await collect(loop, request("b", 2))
        return failed, later

    failed, later = run(main())
    assert failed[-1][-1].finish_reason == "error" and "step failed" in failed[-1][-1].error
    assert later[-1][-1].finish_reason == "length"


def test_an_engine_that_raises_outside_a_step_fails_requests_but_not_the_loop():
    class FlakyEngine(FakeEngine):
        raised = False

        def has_unfinished_requests(self) -> bool:
            if self.remaining and not self.raised:
                self.raised = True
                raise RuntimeError("state check exploded")
            return super().has_unfinished_requests()

    async def main():
        loop = StepLoop(FlakyEngine(), 0.0)
        failed = await collect(loop, request("a", 3))
        later = await collect(loop, request("b", 2))
        return failed, later

    failed, later = run(main())
    assert failed[-1][-1].finish_reason == "error"
    assert later[-1][-1].finish_reason == "length"


def test_steps_run_in_one_dedicated_thread_and_stop_when_idle():
    engine = FakeEngine()

    async def main():
        loop = StepLoop(engine, 0.0)
        await asyncio.gather(*(collect(loop, request(f"r{i}", 3)) for i in range(4)))
        steps_when_done = engine.num_steps
        await asyncio.sleep(0.1)
        return steps_when_done, await loop.stats()

    steps_when_done, stats = run(main())
    assert len(engine.step_threads) == 1 and next(iter(engine.step_threads)).startswith("engine-step")
    assert engine.num_steps == steps_when_done  # no stepping (spinning) while idle
    assert stats.num_steps == steps_when_done and stats.num_running == 0


def test_a_loop_that_builds_its_engine_steps_it_on_the_thread_that_built_it():
    # MLX keeps GPU streams per thread: an engine built on one thread and stepped on another failed
    # every step on CUDA ("There is no Stream(gpu, 0) in current thread").
    built_on: list[str] = []

    def build() -> FakeEngine:
        built_on.append(threading.current_thread().name)
        return FakeEngine()

    async def main(loop: StepLoop):
        return await collect(loop, request("a", 3))

    loop = StepLoop.building(build, 0.0)
    items = run(main(loop))
    assert items[-1][-1].finish_reason == "length"
    assert built_on == list(loop.engine.step_threads) and built_on[0].startswith("engine-step")
    assert not loop.stopped
    loop.stop(timeout_s=5)
    assert loop.stopped  # the Scheduler's metrics export ends on it
    assert loop._thread is not None and not loop._thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):
        loop.run_between_steps(lambda: None)


def test_an_engine_that_fails_to_build_fails_the_loop_loudly():
    def build() -> FakeEngine:
        raise ValueError("no such model")

    threads_before = set(threading.enumerate())
    with pytest.raises(ValueError, match="no such model"):
        StepLoop.building(build, 0.0)
    assert not [t for t in threading.enumerate() if t not in threads_before]  # its thread ended


# A process whose step thread used MLX's random key, then stopped. The race that aborted some real
# exits is made certain: the ending thread's exit is held 0.3 s (a thread-exit destructor that sleeps,
# run before MLX's own) while the interpreter's finalization lets go of the GIL for 1 s.
_STOP_THEN_EXIT = """
import ctypes, time
from deployments.step_loop import StepLoop  # imports the engine package, which wants MLX after it
import mlx.core as mx

libc = ctypes.CDLL(None)

class IdleEngine:
    def has_unfinished_requests(self):
        return False

def build():
    mx.eval(mx.random.uniform(shape=(4,)))
    libc.__cxa_thread_atexit_impl(libc.usleep, ctypes.c_void_p(300_000), ctypes.cast(libc.usleep, ctypes.c_void_p))
    return IdleEngine()

class SlowFinalizer:
    def __del__(self):
        time.sleep(1.0)

kept_until_finalization = SlowFinalizer()
StepLoop.building(build, 0.0).stop()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="holds the thread's exit through glibc")
def test_a_stopped_loop_lets_the_process_exit_cleanly():
    # Without the step thread's MLX state freed before it ends, this aborted at interpreter exit:
    # "terminate called without an active exception" (deployments/step_loop.py).
    repo = Path(__file__).resolve().parents[2]
    child = [sys.executable, "-c", _STOP_THEN_EXIT]
    done = subprocess.run(child, cwd=repo, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


class FakeSamplingEngine(FakeEngine):
    """Sample i of a request with n samples emits max_tokens + 10 i tokens, so sample 0 finishes first."""

    def add_request(self, request: GenerateRequest) -> None:
        with self._lock:
            for i in range(request.n):
                self.remaining[f"{request.request_id}#{i}"] = (request.params.max_tokens or 1) + 10 * i

    def abort_request(self, request_id: str) -> None:
        for key in list(self.remaining):
            if key.startswith(f"{request_id}#"):
                super().abort_request(key)

    def _advance(self, request_id: str) -> RequestOutput:
        out = super()._advance(request_id)
        out.request_id, index = request_id.split("#")
        out.index = int(index)
        return out


def sampled(request_id: str, max_tokens: int, n: int) -> GenerateRequest:
    return GenerateRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=max_tokens), n=n)


def test_a_request_with_n_samples_streams_until_every_sample_finished():
    items = run(collect(StepLoop(FakeSamplingEngine(), 0.0), sampled("a", 2, 3)))
    outputs = [out for batch in items for out in batch]
    assert [len([o for o in outputs if o.index == i]) for i in range(3)] == [2, 12, 22]
    assert sorted(o.index for o in outputs if o.finished) == [0, 1, 2]
    assert outputs[-1].finished and outputs[-1].index == 2


def test_a_failing_step_fails_every_sample():
    items = run(collect(StepLoop(FakeSamplingEngine(fail_steps=1), 0.0), sampled("a", 3, 2)))
    finished = [o for batch in items for o in batch if o.finished]
    assert sorted((o.index, o.finish_reason) for o in finished) == [(0, "error"), (1, "error")]


def test_closing_after_the_first_sample_finished_aborts_the_others():
    engine = FakeSamplingEngine(step_s=0.001)

    async def main():
        loop = StepLoop(engine, 0.0)
        stream = loop.generate(sampled("a", 1, 3))
        while not any(o.finished for o in await stream.__anext__()):
            pass
        await stream.aclose()
        for _ in range(100):
            if not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)

    run(main())
    assert engine.aborted == ["a#1", "a#2"] and not engine.has_unfinished_requests()


# Output channels: one Ingress's requests share one stream of gathered outputs.


async def _with_channel(loop: StepLoop, requests: list[GenerateRequest]) -> tuple[list, list[list]]:
    """Opens channel "c", runs the requests naming it; (the channel's items, each request's items)."""
    channel = loop.channel("c")
    received = [await anext(channel)]  # the hello, before any request names the channel
    reader = asyncio.ensure_future(_read_into(channel, received))
    streams = await asyncio.gather(*(_collect_items(loop.generate(r, "c")) for r in requests))
    await asyncio.sleep(0.05)  # the last finished outputs go out at once
    reader.cancel()
    return received, streams


async def _read_into(channel, received: list) -> None:
    async for item in channel:
        received.append(item)


async def _collect_items(stream) -> list:
    return [item async for item in stream]


def test_requests_naming_an_open_channel_send_their_outputs_on_it_gathered():
    loop = StepLoop(FakeEngine(step_s=0.01), 0.1, name="replica-1")
    received, streams = run(_with_channel(loop, [request(f"r{i}", 10) for i in range(4)]))
    assert received[0] == "replica-1"
    for i, items in enumerate(streams):  # admitted on the channel; the stream carries no output
        assert items == [Admitted("replica-1", on_channel=True)]
        outputs = [out for batch in received[1:] for out in batch if out.request_id == f"r{i}"]
        assert [out.new_token_ids[0] for out in outputs] == list(range(10, 0, -1))
        assert outputs[-1].finished
    # 4 streams of 10 tokens over ~0.1 s of steps: a few gathered batches, not one per stream and step
    assert len(received) - 1 <= 10


def test_a_request_naming_a_channel_not_open_here_streams_its_own_outputs():
    loop = StepLoop(FakeEngine(), 0.0, name="replica-1")
    items = run(_collect_items(loop.generate(request("a", 3), "elsewhere")))
    assert items[0] == Admitted("replica-1", on_channel=False)
    assert [out.new_token_ids[0] for batch in items[1:] for out in batch] == [3, 2, 1]


def test_a_channel_bound_request_that_waits_gets_heartbeats_on_its_stream():
    loop = StepLoop(FakeEngine(step_s=0.35), 0.0, heartbeat_s=0.1, name="r")
    received, streams = run(_with_channel(loop, [request("a", 2)]))
    assert streams[0][0] == Admitted("r", on_channel=True)
    assert len(streams[0]) >= 3 and all(item == [] for item in streams[0][1:])  # heartbeats only
    assert [out.new_token_ids[0] for batch in received[1:] for out in batch] == [2, 1]


def test_a_failing_step_fails_channel_bound_requests_on_the_channel():
    loop = StepLoop(FakeEngine(fail_steps=1), 0.0, name="r")
    received, streams = run(_with_channel(loop, [request("a", 5)]))
    errors = [out for batch in received[1:] for out in batch]
    assert [(out.finish_reason, out.request_id) for out in errors] == [("error", "a")]
    assert streams == [[Admitted("r", on_channel=True)]]


def test_cancelling_a_channel_bound_stream_aborts_its_request():
    async def main() -> FakeEngine:
        engine = FakeEngine(step_s=0.01)
        loop = StepLoop(engine, 0.0, name="r")
        channel = loop.channel("c")
        await anext(channel)
        stream = loop.generate(request("a", 1000), "c")
        assert await anext(stream) == Admitted("r", on_channel=True)
        task = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.05)
        task.cancel()  # as Ray cancels the call when the Ingress does
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        await channel.aclose()
        return engine

    engine = run(main())
    assert engine.aborted == ["a"] and not engine.remaining


def test_a_closed_channel_is_forgotten_and_later_requests_stream_their_own_outputs():
    async def main() -> list:
        loop = StepLoop(FakeEngine(), 0.0, name="r")
        channel = loop.channel("c")
        await anext(channel)
        await channel.aclose()
        return await _collect_items(loop.generate(request("a", 2), "c"))

    items = run(main())
    assert items[0] == Admitted("r", on_channel=False) and len(items) >= 2


def test_an_idle_channel_ends_but_not_while_a_request_is_bound_to_it():
    async def main() -> tuple[list, list, float]:
        loop = StepLoop(FakeEngine(step_s=0.3), 0.0, heartbeat_s=0.1, name="r")
        channel = loop.channel("c", idle_s=0.1)
        received = [await anext(channel)]
        start_s = time.monotonic()
        reader = asyncio.ensure_future(_read_into(channel, received))
        # bound for ~0.6 s (two slow steps), longer than idle_s: the channel stays open for it
        items = await _collect_items(loop.generate(request("a", 2), "c"))
        await asyncio.wait_for(reader, 2.0)  # then it ends by itself
        return received, items, time.monotonic() - start_s

    received, items, elapsed_s = run(main())
    assert items[0] == Admitted("r", on_channel=True)
    assert [out.new_token_ids[0] for batch in received[1:] for out in batch] == [2, 1]
    assert elapsed_s >= 0.55


def test_a_request_after_its_channel_idled_out_streams_its_own_outputs():
    async def main() -> list:
        loop = StepLoop(FakeEngine(), 0.0, name="r")
        channel = loop.channel("c", idle_s=0.05)
        await anext(channel)
        assert [item async for item in channel] == []  # ended: idle, nothing bound
        return await _collect_items(loop.generate(request("a", 2), "c"))

    items = run(main())
    assert items[0] == Admitted("r", on_channel=False) and len(items) >= 2
