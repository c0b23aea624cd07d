"""What every sender shares: the :class:`Sender` protocol, :class:`DeliveryError`, and an HTTP POST
that classifies failures for the dispatcher's retry logic without ever putting the URL in a message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Protocol

import requests

from canary import __version__
from canary.notify.message import Notification
from canary.notify.secrets import Redactor

__all__ = [
    "DEFAULT_TIMEOUT",
    "USER_AGENT",
    "Clock",
    "DeliveryError",
    "HttpPoster",
    "Sender",
    "TargetKind",
    "is_retryable_status",
    "parse_retry_after",
    "utc_now",
]

USER_AGENT = f"kserve-canary/{__version__}"

# (connect, read) seconds. A notification is never worth holding a worker for long: a receiver
# that takes longer is retried later (or given up on), it does not stall its lane.
DEFAULT_TIMEOUT: tuple[float, float] = (3.05, 10.0)

# Response bodies are quoted in errors to help debugging (Slack answers "no_service",
# "invalid_payload"), but only the start: a receiver could echo a whole request back.
_BODY_EXCERPT = 200

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class TargetKind(StrEnum):
    SLACK = "slack"
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


class HttpPoster:
    """POSTs bytes to a secret URL and turns every failure into a scrubbed :class:`DeliveryError`.

    One ``requests.Session`` per poster keeps connections alive between notifications; a lock makes
    it safe if one poster is shared between dispatcher lanes (Session is not documented thread-safe).
    """

    def __init__(
        self,
        *,
        describe: str,
        redactor: Redactor,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        session: requests.Session | None = None,
    ) -> None:
        self._describe = describe  # e.g. "slack webhook (env SLACK_WEBHOOK_URL)": safe to show
        self._redactor = redactor
        self._timeout = timeout
        self._clock = clock
        self._session = session if session is not None else requests.Session()
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> requests.Response:
        try:
            with self._lock:
                response = self._session.post(
                    url,
                    data=body,
                    headers=dict(headers),
                    timeout=self._timeout,
                    # A redirect would re-send a signed payload somewhere the policy did not name.
                    allow_redirects=False,
                )
        except requests.Timeout as error:
            raise DeliveryError(
                f"{self._describe}: timed out: {self._safe(error)}", retryable=True
            ) from None  # `from None`: the chained exception's text carries the URL
        except requests.ConnectionError as error:
            raise DeliveryError(
                f"{self._describe}: connection failed: {self._safe(error)}", retryable=True
            ) from None
        except requests.RequestException as error:
            # Invalid URL, unsupported scheme, ...: configuration, trying again will not help.
            raise DeliveryError(
                f"{self._describe}: request could not be sent: {type(error).__name__}: {self._safe(error)}",
                retryable=False,
            ) from None
        if 200 <= response.status_code < 300:
            return response
        excerpt = response.text[:_BODY_EXCERPT].strip()
        detail = f": {excerpt}" if excerpt else ""
        status = response.status_code
        if 300 <= status < 400:
            raise DeliveryError(
                f"{self._describe}: HTTP {status} redirect not followed{self._safe(detail)}",
                retryable=False,
                status=status,
            )
        raise DeliveryError(
            f"{self._describe}: HTTP {status} {response.reason or ''}".rstrip() + self._safe(detail),
            retryable=is_retryable_status(status),
            retry_after=parse_retry_after(response.headers.get("Retry-After"), self._clock()),
            status=status,
        )

    def _safe(self, text: object) -> str:
        return self._redactor.scrub(str(text))
