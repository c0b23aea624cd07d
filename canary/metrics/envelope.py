"""What a Prometheus answer says: its envelope read into an answer, or a failure named from it.

The HTTP exchange is :mod:`canary.metrics.client`'s; this module reads what came back. Every failure
is a :class:`QueryFailure` with an :class:`~canary.evidence.ErrorClass` named from what Prometheus said
— its ``errorType`` first (``bad_data``, ``execution``, ``timeout``, ``unavailable``), the HTTP status
otherwise — and carrying its own ``error`` text (truncated). What is not a Prometheus answer at all
(not JSON, truncated JSON, an empty body, a proxy's HTML page, JSON without ``status``/``data``, an
answer past its cap) is ``malformed-response``. Of such an answer a detail says the status and the
content type, never its text: it reaches Events, notifications and ``explain``. Secrets the client
sent are replaced before a detail leaves.

An instant query may be asked with a typed decoder (:func:`vector_decoder`, msgspec): a well-formed
answer is then read straight from the body's bytes into compact typed series, in one pass and without
a ``dict`` per series (the evidence pipeline's per-tick sample: a hundred thousand series at 1,000
rollouts). An answer that does not fit the type is read as any other, so what is wrong with it is
named the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Generic, TypeVar

import msgspec
import requests

from canary.answers import AnswerError, AnswerLate, AnswerTooLarge
from canary.evidence import ErrorClass

__all__ = [
    "Attempt",
    "QueryAnswer",
    "QueryFailure",
    "QueryOutcome",
    "VectorData",
    "VectorEnvelope",
    "classify",
    "malformed",
    "shorten",
    "unread_answer",
    "vector_decoder",
]

DETAIL_LIMIT = 500  # characters of a Prometheus error message kept in evidence and logs


@dataclass(frozen=True, slots=True)
class QueryAnswer:
    """A successful answer: Prometheus' ``data`` with its result type kept."""

    result_type: str  # vector | matrix | scalar | string
    result: Any
    warnings: tuple[str, ...] = ()


S = TypeVar("S")


class VectorData(msgspec.Struct, Generic[S]):
    """``data`` of an instant vector answer, its series typed (see :func:`vector_decoder`)."""

    resultType: str
    result: list[S]


class VectorEnvelope(msgspec.Struct, Generic[S]):
    status: str
    data: VectorData[S] | None = None
    warnings: list[str] = msgspec.field(default_factory=list)


def vector_decoder(series: type[S]) -> msgspec.json.Decoder[VectorEnvelope[S]]:
    """A decoder of instant vector answers whose series are ``series`` (a :class:`msgspec.Struct`
    naming the labels and value it reads; other labels are skipped)."""
    return msgspec.json.Decoder(VectorEnvelope[series])  # type: ignore[valid-type]


@dataclass(frozen=True, slots=True)
class QueryFailure:
    error_class: ErrorClass
    detail: str
    http_status: int | None = None


@dataclass(frozen=True, slots=True)
class QueryOutcome:
    """One query as asked: its answer or failure, and what it cost."""

    promql: str
    answer: QueryAnswer | None
    failure: QueryFailure | None
    http_requests: int  # round trips, retries included
    duration: float  # seconds, retries and backoff included


@dataclass(slots=True)
class Attempt:
    payload: Any = None  # ``data`` of a successful envelope
    failure: QueryFailure | None = None
    retryable: bool = False
    warnings: tuple[str, ...] = ()
    content_type: str = ""


def shorten(value: object) -> str:
    text = str(value)
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"


def malformed(attempt: Attempt, problem: str) -> QueryFailure:
    return QueryFailure(
        ErrorClass.MALFORMED_RESPONSE,
        f"HTTP 200 {attempt.content_type}, not a Prometheus answer: {problem}",
        200,
    )


# Prometheus' errorType, as it names it (the HTTP status alone is ambiguous: 503 is both "timeout"
# and "unavailable").
_BY_ERROR_TYPE = {
    "timeout": ErrorClass.TIMEOUT,
    "bad_data": ErrorClass.BAD_QUERY,
    "execution": ErrorClass.EXECUTION,
    "unavailable": ErrorClass.UNAVAILABLE,
}
BY_STATUS = {
    504: ErrorClass.TIMEOUT,
    400: ErrorClass.BAD_QUERY,
    422: ErrorClass.EXECUTION,
    # Nothing ran: a proxy without a backend, Prometheus starting up, or rate limiting.
    502: ErrorClass.UNAVAILABLE,
    503: ErrorClass.UNAVAILABLE,
    429: ErrorClass.UNAVAILABLE,
}


def classify(response: requests.Response, secrets: Sequence[str] = ()) -> Attempt:
    """Turn one HTTP response into a payload or a failure named from what the server said: of a body
    that is not a Prometheus answer, only its status and content type."""
    status = response.status_code
    if 300 <= status < 400:
        detail = f"{status_text(status)}: a redirect, not followed"
        return Attempt(failure=QueryFailure(ErrorClass.SERVER, detail, status))
    content_type = _media_type(response)
    envelope, problem = _envelope(_text(response), content_type)
    prometheus = envelope if envelope is not None else {}
    listed = prometheus.get("warnings")
    warnings = tuple(str(item) for item in listed) if isinstance(listed, list) else ()  # not `true`, `5`
    if status == 200 and prometheus.get("status") == "success":
        if "data" not in prometheus:
            detail = f"HTTP 200 {content_type}, not a Prometheus answer: status success without data"
            return Attempt(failure=_scrubbed(ErrorClass.MALFORMED_RESPONSE, detail, status, secrets))
        return Attempt(payload=prometheus["data"], warnings=warnings, content_type=content_type)
    if status == 200 and not prometheus:
        detail = f"HTTP 200 {content_type}, not a Prometheus answer: {problem}"
        return Attempt(failure=_scrubbed(ErrorClass.MALFORMED_RESPONSE, detail, status, secrets))
    error_type = str(prometheus.get("errorType") or "")
    if prometheus:
        message = str(prometheus.get("error") or "")
        detail = (
            f"HTTP {status}" + (f" {error_type}" if error_type else "") + (f": {message}" if message else "")
        )
    else:
        detail = status_text(status)  # a proxy's page, a login form: its text is not shown
    error_class = _BY_ERROR_TYPE.get(error_type) or BY_STATUS.get(status, ErrorClass.SERVER)
    # A timed-out query is never re-run; "unavailable" (nothing ran) is.
    retryable = error_class is ErrorClass.UNAVAILABLE
    return Attempt(failure=_scrubbed(error_class, detail, status, secrets), retryable=retryable)


def _envelope(text: str, content_type: str) -> tuple[dict[str, Any] | None, str]:
    """Prometheus' envelope (a JSON object with ``status``), or None and what the body is instead."""
    if not text.strip():
        return None, "an empty body"
    try:
        envelope = json.loads(text)
    except ValueError:
        return None, "truncated or invalid JSON" if "json" in content_type else "not JSON"
    except RecursionError:  # [[[[... nested deeper than the parser's stack
        return None, "JSON nested too deeply"
    if not isinstance(envelope, dict) or "status" not in envelope:
        return None, "JSON without status and data"
    return envelope, ""


def _text(response: requests.Response) -> str:
    """The body in the charset the answer declares, else UTF-8 (Prometheus' own): never guessed from
    the body, which requests would do over all of it."""
    try:
        return response.content.decode(response.encoding or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        return response.content.decode("utf-8", "replace")


_MEDIA_TYPE = re.compile(r"[\w.+-]{1,64}/[\w.+-]{1,64}")


def _media_type(response: requests.Response) -> str:
    """The answer's media type as a detail may name it: a well-formed ``type/subtype``, or a word."""
    media = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if not media:
        return "without a content type"
    return media if _MEDIA_TYPE.fullmatch(media) else "of an unreadable content type"


def status_text(status: int) -> str:
    """``HTTP 503 Service Unavailable``: the status and its standard phrase (never the server's)."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _scrubbed(error_class: ErrorClass, detail: str, status: int, secrets: Sequence[str]) -> QueryFailure:
    for secret in secrets:
        detail = detail.replace(secret, "<redacted>")
    return QueryFailure(error_class, shorten(detail), status)


def unread_answer(error: AnswerError, origin: str, deadline: float) -> Attempt:
    """An answer not read whole: late (by the ``deadline``), too large, or cut short. Named by its
    status; nothing of its body is shown."""
    status = error.status
    if isinstance(error, AnswerLate) or status is None:
        said = "no answer" if status is None else "no complete answer"
        detail = f"{origin}: {said} within {deadline:g}s (client deadline; not retried)"
        return Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, detail, status))
    ok = 200 <= status < 300
    error_class = ErrorClass.MALFORMED_RESPONSE if ok else BY_STATUS.get(status, ErrorClass.SERVER)
    if isinstance(error, AnswerTooLarge):  # the same again if asked again: not retried
        setting = " (max_answer_bytes)" if ok else ""
        failure = QueryFailure(error_class, f"{status_text(status)}: {error}{setting}, not read", status)
        return Attempt(failure=failure)
    failure = QueryFailure(error_class, f"{status_text(status)}: {error}", status)
    return Attempt(failure=failure, retryable=error_class is ErrorClass.UNAVAILABLE)
