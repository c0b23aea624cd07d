"""Every answer read from a URL the controller does not own — a gate, a chat or webhook receiver,
Prometheus or whatever answers at its URL — bounded in time and in bytes.

:class:`BoundedSession` is a :class:`requests.Session` that

* **never follows a redirect**, and never reads one: a 3xx comes back as itself with an empty body.
  (With ``allow_redirects=False`` alone, requests still reads a redirect's whole body to prepare
  ``Response.next``; :meth:`~BoundedSession.get_redirect_target`, the hook requests documents for
  this, says there is none.)
* **streams every answer and reads it chunk by chunk** (``stream=True``, ``iter_content``) up to a
  limit — one for 2xx answers, one for the others — and stops past it with :class:`AnswerTooLarge`;
  a declared ``Content-Length`` beyond it is refused unread. What is kept is the whole answer, as
  ``Response.content``, for the caller to read as usual.
* **gives each exchange one deadline**: connecting, sending, the status line, the headers and the
  whole body together. A watchdog shuts the connection's socket down when it passes, so an answer
  trickled a byte at a time is cut there (:class:`AnswerLate`) instead of living as long as each
  single read returns within its timeout. The socket is handed to the watchdog by the connection
  classes urllib3 lets an adapter choose, the moment it exists (TLS handshakes included).

A body the connection ends before its framing says it is complete (``Content-Length``, chunked) is
:class:`AnswerCut`. None of these errors carries anything of the body: a status, a size, a time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import requests
from requests.adapters import BaseAdapter, HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ReadTimeoutError
from urllib3.response import HTTPResponse
from urllib3.util.retry import Retry

__all__ = ["AnswerCut", "AnswerError", "AnswerLate", "AnswerTooLarge", "BoundedSession", "size_text"]

_CHUNK = 256 * 1024  # bytes asked for per read of a large answer
_current = threading.local()  # the watchdog of the exchange this thread is in, if any


def size_text(size: int) -> str:
    """``64 KiB``, ``128 MiB``, ``4096 bytes``: a limit as people read it."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


class AnswerError(requests.RequestException):
    """An answer that was not read whole. ``response`` (status and headers, never the body) when its
    head arrived; the message is safe to show: it says why in a few words, nothing the server wrote."""

    @property
    def status(self) -> int | None:
        return self.response.status_code if self.response is not None else None


class AnswerTooLarge(AnswerError):
    """Larger than the limit: not read further."""


class AnswerLate(AnswerError):
    """Not complete by the exchange's deadline: cut there."""


class AnswerCut(AnswerError):
    """The connection ended before the answer was complete."""


class _Watchdog:
    """Shuts the sockets of one exchange down when its deadline passes (from another thread: a
    blocked read then returns at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        _current.watchdog = self
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._sockets.clear()  # back in the pool, perhaps another exchange's now
        _current.watchdog = None

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(sock: socket.socket | None) -> None:
    watchdog: _Watchdog | None = getattr(_current, "watchdog", None)
    if watchdog is not None:
        watchdog.watch(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watched(sock)  # before anything is read from it: a TLS handshake is an answer too
        return sock

    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3's own
        _watched(self.sock)  # a kept-alive connection, reused by this exchange
        return super().getresponse()


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watched(sock)
        return sock

    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3's own
        _watched(self.sock)
        return super().getresponse()


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """An adapter whose connections hand their sockets to the current exchange's watchdog."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):
            manager.pool_classes_by_scheme = _POOLS
        return manager


class BoundedSession(requests.Session):
    """A session whose every exchange is bounded (see the module docstring).

    ``limit``: bytes of a 2xx answer read at most; ``error_limit``: of any other answer (default
    ``limit``); ``deadline``: seconds one exchange may take, connecting included (a call's read
    timeout, when shorter, is its deadline). Every adapter
    mounted on it is a watched one, with the retries it was given (prometheus-api-client mounts its
    own for its URL).
    """

    def __init__(self, *, limit: int, deadline: float, error_limit: int | None = None) -> None:
        if limit < 0 or (error_limit or 0) < 0 or deadline <= 0:
            raise ValueError("answer limits must not be negative and the deadline must be positive")
        self.limit = limit
        self.error_limit = limit if error_limit is None else error_limit
        self.deadline = deadline
        super().__init__()

    def mount(self, prefix: str | bytes, adapter: BaseAdapter) -> None:
        if not isinstance(adapter, _WatchedAdapter):
            retries = adapter.max_retries if isinstance(adapter, HTTPAdapter) else Retry(0, read=False)
            adapter = _WatchedAdapter(max_retries=retries)
        super().mount(prefix, adapter)

    def get_redirect_target(self, resp: requests.Response) -> str | None:
        return None  # never followed (nor read: requests reads a redirect's body to follow it)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        kwargs.update(stream=True, allow_redirects=False)
        # A call may ask for less than the session's deadline with a shorter read timeout.
        timeout = kwargs.get("timeout")
        asked = timeout[1] if isinstance(timeout, tuple) else timeout
        deadline = min(self.deadline, asked) if isinstance(asked, int | float) else self.deadline
        with _Watchdog(deadline) as watchdog:
            try:
                response = super().send(request, **kwargs)
            except requests.RequestException as error:
                if watchdog.expired and not isinstance(error, AnswerError):
                    raise AnswerLate(f"no answer within {deadline:g}s", request=request) from None
                raise
            if 300 <= response.status_code < 400:
                response.close()  # a redirect: reported by its status, its body never read
                response._content = b""
                return response
            limit = self.limit if 200 <= response.status_code < 300 else self.error_limit
            try:
                response._content = _read(response, limit, watchdog)
            except AnswerError:
                response.close()
                raise
        return response


def _read(response: requests.Response, limit: int, watchdog: _Watchdog) -> bytes:
    """The whole body of ``response``, read chunk by chunk, or an :class:`AnswerError`."""
    declared = response.headers.get("Content-Length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(f"an answer larger than {size_text(limit)}", response=response)
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_content(max(1, min(limit + 1, _CHUNK))):
            size += len(chunk)
            if size > limit:
                raise AnswerTooLarge(f"an answer larger than {size_text(limit)}", response=response)
            chunks.append(chunk)
    except AnswerError:
        raise
    except requests.RequestException as error:
        timed_out = any(isinstance(cause, ReadTimeoutError) for cause in error.args)
        if watchdog.expired or timed_out:
            raise AnswerLate(f"no complete answer within {watchdog.seconds:g}s", response=response) from None
        if isinstance(error, requests.exceptions.ContentDecodingError):
            raise AnswerCut("an answer that could not be decoded", response=response) from None
        raise AnswerCut("the answer was cut short", response=response) from None
    if watchdog.expired:  # an answer without a length ends at the close: ours, at the deadline
        raise AnswerLate(f"no complete answer within {watchdog.seconds:g}s", response=response)
    return b"".join(chunks)
