"""The HTTP side of the evidence layer: one Prometheus (or Thanos, Mimir, Cortex) and how we ask it.

Built on prometheus-api-client's :class:`PrometheusConnect`, with five of its 0.7.2 habits undone:

* its default ``Retry(total=3, status_forcelist=[..., 503, 504])`` re-runs a query that timed out —
  three more times the most expensive query of the tick. We mount ``Retry(total=0)`` and run our own
  :class:`RetryPolicy`: only failures where the query certainly never ran (connection refused, connect
  timeout, 502, 503 *unavailable*, 429) are retried, a bounded number of times with a short backoff;
  a read timeout or Prometheus' own timeout is never re-run.
* ``custom_query`` returns only ``data.result`` (the result type and warnings are dropped) and reports
  an HTTP error as an exception carrying the body as a ``bytes`` repr. A response hook on our own
  ``requests.Session`` keeps the real response, so we read the envelope (``resultType``,
  ``errorType``, ``error``, ``warnings``) ourselves.
* ``method="POST"`` still puts the query in the URL, which proxies cut off or refuse; queries longer
  than ``max_get_length`` (grouped queries over many rollouts) are POSTed as a form body instead.
* it never sends Prometheus' ``timeout`` parameter; we do, so Prometheus stops an expensive query
  itself (HTTP 503, errorType ``timeout``) a little before our client-side deadline.
* its session follows redirects (the configured headers, a tenant ID or an API key, went along to
  another origin) and reads whole answers, however large or slow. Ours is a
  :class:`~canary.answers.BoundedSession`: a 3xx is reported by its status, never followed or read;
  an attempt has one deadline, ``timeout`` + 1 s for connecting and every read together (an answer
  trickled a byte at a time is cut there); at most ``max_answer_bytes`` of a 2xx answer and
  :data:`ERROR_ANSWER_LIMIT` of any other are read, chunk by chunk.

Every failure becomes a :class:`~canary.metrics.envelope.QueryFailure` (:mod:`canary.metrics.envelope`
reads the answers and names failures); a connection that failed is ``unreachable``. Details never
carry a secret: no header values, and the URL only as ``scheme://host[:port]``. Nothing raises out
of :meth:`PrometheusClient.instant` or :meth:`PrometheusClient.range_query`.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus, urlencode, urlsplit

import msgspec
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError, ReadTimeoutError
from urllib3.util.retry import Retry

from canary.answers import AnswerError, BoundedSession
from canary.evidence import ErrorClass
from canary.metrics.connection import DEFAULT_MAX_ANSWER_BYTES, PrometheusConfig, credentials
from canary.metrics.envelope import (
    Attempt,
    QueryAnswer,
    QueryFailure,
    QueryOutcome,
    VectorData,
    VectorEnvelope,
    classify,
    malformed,
    shorten,
    unread_answer,
    vector_decoder,
)
from canary.retrying import RetryPolicy, retrying

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "ERROR_ANSWER_LIMIT",
    "PrometheusClient",
    "PrometheusConfig",
    "QueryAnswer",
    "QueryFailure",
    "QueryOutcome",
    "RetryPolicy",
    "as_utc",
    "redact_url",
    "vector_decoder",
]

# Bytes of any other answer read at most: Prometheus' error envelope is an errorType and one message
# (a parse error quotes a position, a many-to-many error two label sets), far below this.
ERROR_ANSWER_LIMIT = 64 * 1024


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime; a naive one is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


_FORM = "application/x-www-form-urlencoded"
# The form-encoded texts of the long queries asked lately (PrometheusClient._quoted): a tick's grouped
# queries, one per builtin family, each up to the sample limit's chunk; cleared when full.
_QUOTED_KEPT = 32


class PrometheusClient:
    """Instant queries and label look-ups against one Prometheus, with our retry and error classes.

    Thread-safe: the session's connection pool is shared, the captured response is per thread.
    """

    def __init__(
        self,
        config: PrometheusConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._sleep = sleep
        self._clock = clock
        self._captured = threading.local()
        # Prometheus gets `timeout` and answers 503 when it runs out; the client waits a bit longer so
        # that answer, not the client's deadline, is what normally ends a slow query.
        self._deadline = config.timeout + 1.0
        session = BoundedSession(
            limit=config.max_answer_bytes, error_limit=ERROR_ANSWER_LIMIT, deadline=self._deadline
        )
        session.verify = False if config.insecure_skip_verify else (config.ca_file or True)
        session.auth = credentials(config)
        session.hooks["response"].append(self._keep_response)
        self._session = session
        self._http_timeout = (config.connect_timeout, self._deadline)
        self._quoted_queries: dict[str, str] = {}
        self._connect = PrometheusConnect(
            url=config.url.rstrip("/"),
            headers=dict(config.headers),
            # The library's default re-runs timed-out queries; retries are ours (see RetryPolicy).
            # read=False re-raises a read timeout as itself instead of wrapping it as a connection error.
            # (Its adapter becomes a bounded one: BoundedSession.mount.)
            retry=Retry(total=0, read=False, raise_on_status=False, raise_on_redirect=False),
            session=session,
            timeout=self._http_timeout,  # the label calls take no per-call timeout
        )

    def close(self) -> None:
        self._connect.close()

    def _keep_response(
        self, response: requests.Response, *args: object, **kwargs: object
    ) -> requests.Response:
        self._captured.response = response
        return response

    # -- the public calls -----------------------------------------------------------------------

    def instant(
        self,
        promql: str,
        at: datetime,
        *,
        typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None,
        within: float | None = None,
    ) -> QueryOutcome:
        """Evaluate ``promql`` at ``at`` (``time=``; Prometheus' clock is never used). ``typed``: read
        a well-formed vector answer with this decoder (:func:`vector_decoder`); the answer's
        ``result`` is then a list of its typed series. ``within``: seconds the whole exchange may
        take, when less than the configured timeout (Prometheus is told so too)."""
        limit = self.config.timeout if within is None else max(0.001, min(within, self.config.timeout))
        params = {"time": f"{as_utc(at).timestamp():.3f}", "timeout": f"{limit:g}"}
        http_timeout = self._http_timeout
        if within is not None and limit < self.config.timeout:
            http_timeout = (min(self.config.connect_timeout, limit), limit)

        def call() -> object:
            body = f"query={self._quoted(promql)}&{urlencode(params)}"
            short = len(body) <= self.config.max_get_length
            if short and typed is None:
                return self._connect.custom_query(query=promql, params=params, timeout=http_timeout)
            if short:  # the library would decode the body once more, into dicts
                return self._session.get(
                    f"{self._connect.url}/api/v1/query",
                    params={"query": promql, **params},
                    headers=dict(self.config.headers),
                    timeout=http_timeout,
                )
            # The library sends parameters in the URL even with method="POST", and long URLs fail
            # behind proxies (414, or silently truncated): send long queries as a form body instead.
            return self._session.post(
                f"{self._connect.url}/api/v1/query",
                data=body,
                headers={**self.config.headers, "Content-Type": _FORM},
                timeout=http_timeout,
            )

        return self._outcome(promql, call, typed)

    def _quoted(self, promql: str) -> str:
        """``promql`` form-encoded, once per text: the grouped queries of a tick are the same text
        tick after tick while the tracked revisions stay (about 100 kB at 1,000 rollouts, whose
        encoding, twice a tick, was about 4 % of the controller's time holding the GIL)."""
        if len(promql) <= self.config.max_get_length:
            return quote_plus(promql)  # short ones are many (custom checks) and cheap: not kept
        quoted = self._quoted_queries.get(promql)
        if quoted is None:
            if len(self._quoted_queries) >= _QUOTED_KEPT:
                self._quoted_queries.clear()
            quoted = self._quoted_queries[promql] = quote_plus(promql)
        return quoted

    def _outcome(
        self,
        promql: str,
        call: Callable[[], object],
        typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None,
    ) -> QueryOutcome:
        started = self._clock()
        attempt, http_requests = self._with_retries(call, typed)
        duration = self._clock() - started
        if attempt.failure is not None:
            return QueryOutcome(promql, None, attempt.failure, http_requests, duration)
        data = attempt.payload
        if isinstance(data, VectorData):
            answer = QueryAnswer(data.resultType, data.result, attempt.warnings)
            return QueryOutcome(promql, answer, None, http_requests, duration)
        if not isinstance(data, dict) or "resultType" not in data or "result" not in data:
            failure = malformed(attempt, "data without resultType and result")
            return QueryOutcome(promql, None, failure, http_requests, duration)
        answer = QueryAnswer(str(data["resultType"]), data["result"], attempt.warnings)
        return QueryOutcome(promql, answer, None, http_requests, duration)

    def range_query(self, promql: str, start: datetime, end: datetime, step: float) -> QueryOutcome:
        """Evaluate ``promql`` at ``start``, ``start + step``, ... up to ``end`` (``/api/v1/query_range``).

        The same habits as :meth:`instant`: GET, a form-body POST when the query is long, Prometheus'
        ``timeout`` sent, only what certainly never ran retried, every failure classified, nothing
        raised. The answer is a matrix; keeping within Prometheus' 11,000 points per series is the
        caller's job.
        """
        if step <= 0:
            raise ValueError("a range query needs a positive step")
        params = {
            "start": f"{as_utc(start).timestamp():.3f}",
            "end": f"{as_utc(end).timestamp():.3f}",
            "step": f"{step:g}",
            "timeout": f"{self.config.timeout:g}",
        }
        url = f"{self._connect.url}/api/v1/query_range"

        def call() -> object:
            form = {"query": promql, **params}
            if len(urlencode(form)) <= self.config.max_get_length:
                return self._session.get(
                    url, params=form, headers=dict(self.config.headers), timeout=self._http_timeout
                )
            return self._session.post(
                url, data=form, headers=dict(self.config.headers), timeout=self._http_timeout
            )

        return self._outcome(promql, call)

    def label_values(
        self, label: str, matches: Sequence[str], start: datetime, end: datetime
    ) -> tuple[list[str] | QueryFailure, int]:
        """Values of ``label`` on series matching any of ``matches`` in [start, end]; and round trips."""
        params = self._range_params(matches, start, end)
        return self._list_call(lambda: self._connect.get_label_values(label_name=label, params=params))

    def label_names(
        self, matches: Sequence[str], start: datetime, end: datetime
    ) -> tuple[list[str] | QueryFailure, int]:
        """Label names on series matching any of ``matches`` in [start, end]; and round trips."""
        params = self._range_params(matches, start, end)
        return self._list_call(lambda: self._connect.get_label_names(params=params))

    # -- internals ------------------------------------------------------------------------------

    def _range_params(self, matches: Sequence[str], start: datetime, end: datetime) -> dict[str, object]:
        return {
            "match[]": list(matches),
            "start": f"{as_utc(start).timestamp():.3f}",
            "end": f"{as_utc(end).timestamp():.3f}",
        }

    def _list_call(self, call: Callable[[], object]) -> tuple[list[str] | QueryFailure, int]:
        attempt, http_requests = self._with_retries(call)
        if attempt.failure is not None:
            return attempt.failure, http_requests
        if not isinstance(attempt.payload, list):
            return malformed(attempt, "data is not a list of names"), http_requests
        return [str(item) for item in attempt.payload], http_requests

    def _with_retries(
        self, call: Callable[[], object], typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None
    ) -> tuple[Attempt, int]:
        # Only what certainly never ran is tried again (see the module docstring): `retryable`.
        return retrying(
            self.config.retry,
            lambda _: self._attempt(call, typed),
            again=lambda attempt: attempt.failure is not None and attempt.retryable,
            sleep=self._sleep,
        )

    def _attempt(
        self, call: Callable[[], object], typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None
    ) -> Attempt:
        self._captured.response = None
        origin = redact_url(self.config.url)
        try:
            call()
        except AnswerError as error:
            return unread_answer(error, origin, self._deadline)
        except (PrometheusApiClientException, requests.exceptions.InvalidJSONError, ValueError, LookupError,
                TypeError, RecursionError) as error:  # fmt: skip
            # prometheus-api-client could not read the answer (a non-200, a body that is not JSON, a 200
            # whose envelope has no "data"): the captured response below says what it really was.
            unread: BaseException | None = error
        except requests.exceptions.RequestException as error:
            return self._not_asked(error, origin)
        else:
            unread = None
        response = getattr(self._captured, "response", None)
        if response is None:
            seen = f": {type(unread).__name__}: {_reason(unread)}" if unread is not None else ""
            return Attempt(
                failure=QueryFailure(ErrorClass.SERVER, f"{origin}: no HTTP response was seen{seen}")
            )
        if typed is not None and response.status_code == 200:
            try:
                envelope = typed.decode(response.content)
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass  # not of the type: read as any answer below, which names what is wrong with it
            else:
                if envelope.status == "success" and envelope.data is not None:
                    return Attempt(payload=envelope.data, warnings=tuple(envelope.warnings))
        return classify(response, self._secrets(response))

    def _not_asked(self, error: requests.exceptions.RequestException, origin: str) -> Attempt:
        """A call that got no answer: no connection, a read timeout, a connection that failed."""
        if isinstance(error, requests.exceptions.ConnectTimeout):
            detail = f"{origin}: no connection within {self.config.connect_timeout:g}s (connect timeout)"
            return Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, detail), retryable=True)
        if isinstance(error, requests.exceptions.Timeout):
            return Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail(origin)))
        if isinstance(error, requests.exceptions.SSLError):
            return Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: TLS: {_reason(error)}"))
        if isinstance(error, requests.exceptions.ConnectionError):
            if _caused_by(error, ReadTimeoutError):
                return Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail(origin)))
            # Retry only when the request certainly never reached Prometheus (refused, DNS): a reset
            # connection may have been running an expensive query.
            never_sent = _caused_by(error, NewConnectionError, ConnectTimeoutError)
            failure = QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: {_reason(error)}")
            return Attempt(failure=failure, retryable=never_sent)
        return Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: {_reason(error)}"))

    def _read_timeout_detail(self, origin: str) -> str:
        return f"{origin}: no answer within {self._http_timeout[1]:g}s (client read timeout; not retried)"

    def _secrets(self, response: requests.Response) -> list[str]:
        """What must never appear in a detail: header values sent, credentials in the URL."""
        secrets = [str(value) for value in self.config.headers.values()]
        sent = response.request.headers if response.request is not None else {}
        authorization = str(sent.get("Authorization", ""))
        secrets += [authorization, authorization.partition(" ")[2]]
        parts = urlsplit(self.config.url)
        secrets += [parts.username or "", parts.password or ""]
        return [secret for secret in secrets if len(secret) >= 4]


def redact_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: no credentials, no path, no query (safe for logs)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _caused_by(error: BaseException, *kinds: type[BaseException]) -> bool:
    """Whether ``error`` or anything in its cause chain (urllib3 nests them deeply) is one of ``kinds``."""
    return _find(error, *kinds) is not None


def _find(error: BaseException, *kinds: type[BaseException]) -> BaseException | None:
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue  # None, or a plain `reason` string (ssl.SSLError has one)
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        pending.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    return None


# requests and urllib3 quote the connection pool and the URL (with the query) in their messages.
_POOL = re.compile(r"\w*ConnectionPool\([^)]*\):\s*|Max retries exceeded with url: \S+\s*|<[^>]+>:?\s*")


def _reason(error: BaseException) -> str:
    """Why a connection failed, without the URL it was for."""
    if _caused_by(error, ConnectionRefusedError):
        return "connection refused"
    resolution = _find(error, NameResolutionError)
    if resolution is not None:
        return "the host name does not resolve"
    tls = _find(error, ssl.SSLError)
    if tls is not None:
        return shorten(getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or tls)
    text = _POOL.sub("", str(error)).strip(" ()'\"") or type(error).__name__
    return shorten(text)
