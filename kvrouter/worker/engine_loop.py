"""The engine's own thread. It steps while requests run and, between steps,
runs the calls that the gRPC handlers submit; nothing else touches the
engine, so it needs no locks. Outputs go back to each request's asyncio
queue on the server's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvrouter.engine import EngineLoad, LLMEngine, RequestOutput, SamplingParams
from kvrouter.engine.sequence import Sequence

log = logging.getLogger("kvrouter.worker.engine_loop")

# How long an idle engine thread sleeps between checks when requests wait
# for blocks that only a release can free.
IDLE_WAIT_S = 0.02

Hook = Callable[[LLMEngine], None]
FinishHook = Callable[[LLMEngine, Sequence], None]


@dataclass
class RequestHandle:
    # RequestOutputs as they come (an EngineFailure instead when the engine
    # breaks, a SequenceFailed when this request alone fails).
    outputs: asyncio.Queue
    # The engine's record of the request; read it only once the request has ended.
    seq: Sequence
    # Runs once the request holds its blocks (scheduled), or when it ends first.
    on_scheduled: Hook | None
    # Runs on the engine thread as the request finishes, before its last output is sent.
    on_finish: FinishHook | None


class EngineFailure(RuntimeError):
    """The engine raised while stepping; the requests in flight are aborted."""


class SequenceFailed(RuntimeError):
    """This request alone failed in the engine (e.g. its sampling); the
    others in the batch go on."""


class EngineLoop:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.load: EngineLoad = engine.load()
        self._loop = loop
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._requests: dict[str, RequestHandle] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join()

    async def call(self, fn: Callable[..., Any], *args) -> Any:
        """Runs `fn(engine, *args)` on the engine thread between steps."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fn, args, future))
        self._wake.set()
        return await asyncio.wrap_future(future)

    async def add_request(
        self,
        prompt: list[int],
        params: SamplingParams,
        request_id: str,
        *,
        on_scheduled: Hook | None = None,
        on_finish: FinishHook | None = None,
    ) -> RequestHandle:
        """Queues a request. Raises ValueError for a request the engine refuses."""
        outputs: asyncio.Queue = asyncio.Queue()

        def add(engine: LLMEngine) -> RequestHandle:
            engine.add_request(prompt, params, request_id)
            handle = RequestHandle(outputs, engine.requests[request_id], on_scheduled, on_finish)
            self._requests[request_id] = handle
            return handle

        return await self.call(add)

    def post(self, fn: Callable[..., Any], *args) -> None:
        """Runs `fn(engine, *args)` on the engine thread; returns at once (any thread)."""
        self._calls.put((fn, args, None))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Stops a request if it still runs (any thread; returns at once)."""
        self.post(self._abort, request_id)

    # -- the engine thread

    def _abort(self, engine: LLMEngine, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if request_id in engine.requests:
            engine.abort_request(request_id)
        if request.on_scheduled is not None:
            _run_hook(request.on_scheduled, engine)

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            self._run_calls()
            if not engine.has_unfinished_requests():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as e:
                log.exception("engine step failed; aborting the requests in flight")
                self._fail_all(EngineFailure(f"the engine failed: {e}"))
                continue
            self.load = engine.load()
            for output in outputs:
                self._deliver(output)
            self._run_scheduled_hooks()
            if self.load.num_running == 0:
                # Nothing could be scheduled: wait for a call (a release) to free blocks.
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
        self._fail_all(EngineFailure("the worker is shutting down"))

    def _run_calls(self) -> None:
        while True:
            try:
                fn, args, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if future is not None and not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(self.engine, *args)
            except Exception as e:
                if future is None:
                    log.exception("engine call failed")
                else:
                    future.set_exception(e)
            else:
                if future is not None:
                    future.set_result(result)

    def _deliver(self, output: RequestOutput) -> None:
        request = self._requests.get(output.request_id)
        if request is None:
            return
        failed = output.finish_reason == "error"
        if output.finished:
            del self._requests[output.request_id]
            if request.on_scheduled is not None:
                _run_hook(request.on_scheduled, self.engine)
                request.on_scheduled = None
            if request.on_finish is not None and not failed:
                _run_hook(request.on_finish, self.engine, request.seq)
        if failed:
            log.warning(
                "request failed alone",
                extra={"fields": {"request_id": output.request_id, "error": request.seq.failure}},
            )
            self._send(request.outputs, SequenceFailed(request.seq.failure))
        else:
            self._send(request.outputs, output)

    def _run_scheduled_hooks(self) -> None:
        for request in self._requests.values():
            if request.on_scheduled is not None and request.seq.timings.first_scheduled is not None:
                _run_hook(request.on_scheduled, self.engine)
                request.on_scheduled = None

    def _fail_all(self, error: Exception) -> None:
        for request_id, request in list(self._requests.items()):
            try:
                self._abort(self.engine, request_id)
            except Exception:
                log.exception("abort failed", extra={"fields": {"request_id": request_id}})
            self._send(request.outputs, error)
        self._requests.clear()

    def _send(self, outputs: asyncio.Queue, item) -> None:
        try:
            self._loop.call_soon_threadsafe(outputs.put_nowait, item)
        except RuntimeError:
            pass  # the event loop has closed: nobody is listening


def _run_hook(hook: Callable[..., None], *args) -> None:
    """A failing hook is logged; it must not stop the engine thread."""
    try:
        hook(*args)
    except Exception:
        log.exception("request hook failed")
