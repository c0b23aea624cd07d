"""What every sender shares: the :class:`Sender` protocol, :class:`DeliveryError`, and an HTTP POST
that classifies failures for the dispatcher's retry logic without ever putting the URL in a message.

A failure message is built only from what cannot carry a secret: the destination's description
(which names the secret *reference*), the exception class, the HTTP status code and the URL's
``scheme://host``. Never the exception's text (requests repeats the URL, ``repr``-escaped, in it),
never the reason phrase or the response body (a receiver, or whatever the URL really points at, may
echo the request or its own secrets back). Before any request the URL is checked with the resolver's
:class:`~canary.notify.urls.UrlGuard` (https; no loopback, link-local, private addresses).

The answer is bounded (:class:`~canary.answers.BoundedSession`): no redirect is followed or read, at
most :data:`ANSWER_LIMIT` bytes of it are read (and thrown away), and the whole attempt — connecting,
sending, the status, the headers and that much body — ends by the timeout's second number.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from http import HTTPStatus
from typing import Protocol

import requests

from canary import __version__
from canary.answers import AnswerError, BoundedSession
from canary.notify.message import Notification
from canary.notify.secrets import Redactor
from canary.notify.urls import UnsafeUrl, UrlGuard, origin

__all__ = [
    "ANSWER_LIMIT",
    "DEFAULT_TIMEOUT",
    "USER_AGENT",
    "Clock",
    "Delivered",
    "DeliveryError",
    "HttpPoster",
    "Sender",
    "TargetKind",
    "is_retryable_status",
    "parse_retry_after",
    "utc_now",
]

USER_AGENT = f"kserve-canary/{__version__}"

# (connect, whole attempt) seconds. A notification is never worth holding a worker for long: a
# receiver that takes longer is retried later (or given up on), it does not stall its lane.
DEFAULT_TIMEOUT: tuple[float, float] = (3.05, 10.0)
# Bytes of a receiver's answer read at most. No answer of these protocols needs more: Slack says "ok"
# or an error code, a Teams workflow 202 and an empty body, Discord 204 (or, asked with ?wait=true,
# the message it posted), a webhook or a gate only its status. Read only so that the exchange ends
# cleanly (and its connection can be reused), then thrown away; a larger 2xx answer still delivers a
# notification, but fails a gate (canary.controller.gates).
ANSWER_LIMIT = 4 * 1024

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class TargetKind(StrEnum):
    SLACK = "slack"
    TEAMS = "teams"
    DISCORD = "discord"
    WEBHOOK = "webhook"
    KUBERNETES_EVENT = "kubernetes-event"


class Sender(Protocol):
    """Delivers one notification to one destination, or raises (ideally :class:`DeliveryError`)."""

    def send(self, notification: Notification) -> None: ...


class DeliveryError(Exception):
    """A delivery failed. ``retryable`` tells the dispatcher whether trying again can help.

    The message must already be safe to log (senders build it from scrubbed text).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after  # seconds the receiver asked us to wait (429/503 Retry-After)
        self.status = status


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP-date (RFC 9110)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def is_retryable_status(status: int) -> bool:
    """Retry rate limits, request timeouts and server errors; any other answer will not change."""
    return status in (408, 425, 429) or status >= 500


def _status_text(status: int) -> str:
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


@dataclass(frozen=True, slots=True)
class Delivered:
    """A 2xx answer: its status, and why its body was not read whole ("" when it was): ``"no
    complete answer within 10s"``, ``"an answer larger than 4 KiB"``, ``"the answer was cut short"``."""

    status: int
    unread: str = ""


class HttpPoster:
    """POSTs bytes to a secret URL and turns every failure into a safe :class:`DeliveryError`.

    One :class:`~canary.answers.BoundedSession` per poster keeps connections alive between
    notifications; a lock makes it safe if one poster is shared between dispatcher lanes (Session is
    not documented thread-safe). ``timeout`` is (connect, whole attempt) seconds. ``guard`` checks
    every URL before it is used (None: unchecked, for tests and embedding).
    """

    def __init__(
        self,
        *,
        describe: str,
        redactor: Redactor,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        guard: UrlGuard | None = None,
    ) -> None:
        self._describe = describe  # e.g. "slack webhook (env SLACK_WEBHOOK_URL)": safe to show
        self._redactor = redactor
        self._timeout = timeout
        self._clock = clock
        # A redirect would re-send a signed payload somewhere the policy did not name: never followed.
        self._session = BoundedSession(limit=ANSWER_LIMIT, deadline=timeout[1])
        self._guard = guard
        self._lock = threading.Lock()

    def close(self) -> None:
        self._session.close()

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, whole_answer: bool = False
    ) -> Delivered:
        """POST ``body``; a 2xx answer is delivered. ``whole_answer``: only if its body also arrived
        whole, within the limit and the timeout (a gate); otherwise a :class:`DeliveryError`."""
        where = origin(url)
        self._check(url)
        try:
            with self._lock:
                response = self._session.post(url, data=body, headers=dict(headers), timeout=self._timeout)
            unread = ""
        except AnswerError as cut:
            if cut.response is None:  # not even a status by the deadline
                raise DeliveryError(self._failed("timed out", cut, where), retryable=True) from None
            response, unread = cut.response, str(cut)
        # `from None` everywhere: the chained exception's text carries the URL.
        except requests.Timeout as error:
            raise DeliveryError(self._failed("timed out", error, where), retryable=True) from None
        except requests.ConnectionError as error:
            raise DeliveryError(self._failed("connection failed", error, where), retryable=True) from None
        except Exception as error:
            # Invalid URL, unsupported scheme, ...: configuration, trying again will not help.
            raise DeliveryError(
                self._failed("request could not be sent", error, where), retryable=False
            ) from None
        return self._judge(response, unread, where, whole_answer=whole_answer)

    def _check(self, url: str) -> None:
        if self._guard is None:
            return
        try:
            self._guard.check(url)
        except UnsafeUrl as refused:
            raise DeliveryError(
                self._safe(f"{self._describe}: URL refused: {refused}"), retryable=refused.retryable
            ) from None

    def _judge(
        self, response: requests.Response, unread: str, where: str, *, whole_answer: bool
    ) -> Delivered:
        """The answer by its status (its body is never shown: it may echo the request, secrets and all)."""
        status = response.status_code
        said = f"{self._describe}: {_status_text(status)} from {where}"
        if 200 <= status < 300:
            if unread and whole_answer:
                raise DeliveryError(self._safe(f"{said}: {unread}"), retryable=True, status=status)
            return Delivered(status, unread)
        if 300 <= status < 400:
            raise DeliveryError(self._safe(f"{said}: redirect not followed"), retryable=False, status=status)
        raise DeliveryError(
            self._safe(said),
            retryable=is_retryable_status(status),
            retry_after=parse_retry_after(response.headers.get("Retry-After"), self._clock()),
            status=status,
        )

    def _failed(self, what: str, error: BaseException, where: str) -> str:
        return self._safe(f"{self._describe}: {what} ({type(error).__name__}) sending to {where}")

    def _safe(self, text: object) -> str:
        return self._redactor.scrub(str(text))
