"""A gateway served for real, on a loopback socket, by an event loop in a thread of its own.

aiohttp's TestServer shares the test's loop: a test cannot then block the gateway's loop
without blocking its own client too. Here the gateway's loop runs in a background thread,
so a test drives clients from its thread (its own loop, raw sockets, or blocking calls)
while it inspects the gateway (`call`) or stalls it (`block`):

    from gateway_harness import GatewayThread

    with GatewayThread(lambda: create_app("unused:1", options, edge=edge, triton=fake)) as gw:
        gw.url("/ws")                 # ws://127.0.0.1:PORT/ws
        gw.call(lambda: edge.caps.open)  # a function (or coroutine function) on its loop
        done = gw.block(5.0)          # its loop busy for 5 s from now (returns once it is)
        done.result()                 # ...until it is free again

`make_app` is called on the gateway's loop (so that whatever the app creates binds to it).
`loop_errors` holds what reached the loop's exception handler (a task's exception that was
never retrieved, a failing callback): a test may assert it stays empty. `thread_id` tells
the gateway's log records (`LogRecord.thread`) from the test's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web


class GatewayThread:
    """The app of `make_app()` on http://`host`:`port` (0: a free port) in a daemon thread.
    A context manager; or `start()` and `stop()`."""

    def __init__(
        self,
        make_app: Callable[[], web.Application],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        shutdown_timeout_s: float = 1.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.make_app, self.host, self._port = make_app, host, port
        self.shutdown_timeout_s, self.start_timeout_s = shutdown_timeout_s, start_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app: web.Application | None = None
        self.thread: threading.Thread | None = None
        self.thread_id: int | None = None
        self.loop_errors: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> GatewayThread:
        self.thread = threading.Thread(target=self._main, name="gateway-loop", daemon=True)
        self.thread.start()
        if not self._ready.wait(self.start_timeout_s):
            raise TimeoutError(f"the gateway did not start in {self.start_timeout_s:g} s")
        if self._failure is not None:
            self.thread.join(5)
            raise RuntimeError("the gateway failed to start") from self._failure
        return self

    def _main(self) -> None:
        self.thread_id = threading.get_ident()
        self.loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._on_loop_error)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as error:  # handed to start()
            self._failure = error
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self.app = self.make_app()
        self._runner = web.AppRunner(
            self.app, handle_signals=False, shutdown_timeout=self.shutdown_timeout_s
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        self._port = self._runner.addresses[0][1]

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.loop_errors.append(context)
        loop.default_exception_handler(context)

    def stop(self) -> None:
        """Stop serving (open connections are cut after `shutdown_timeout_s`) and join."""
        if self.loop is not None and self.thread is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(self.shutdown_timeout_s + 30)

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ where

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self._port

    def url(self, path: str = "/", scheme: str = "http") -> str:
        """`path` on the gateway; scheme "ws" for a WebSocket URL (`url("/ws", "ws")`)."""
        return f"{scheme}://{self.host}:{self._port}{path}"

    # ------------------------------------------------------------------ on its loop

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float = 10.0) -> Any:
        """`fn(*args)` run on the gateway's loop (a coroutine function is awaited there);
        its result, or its exception raised here. TimeoutError when the loop is blocked for
        longer than `timeout_s`."""

        async def run() -> Any:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the gateway's loop did not run it in {timeout_s:g} s") from None

    def block(self, seconds: float) -> concurrent.futures.Future:
        """Make the gateway's loop busy for `seconds` (a blocking sleep on it, as a CPU-bound
        call or a synchronous client would); returns once the block has begun, with a future
        that is done when the loop is free again."""
        started, done = threading.Event(), concurrent.futures.Future()

        def busy() -> None:
            started.set()
            time.sleep(seconds)
            done.set_result(seconds)

        self.loop.call_soon_threadsafe(busy)
        if not started.wait(max(10.0, seconds + 10.0)):
            raise TimeoutError("the gateway's loop did not start the block")
        return done
