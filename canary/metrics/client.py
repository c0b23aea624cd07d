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

Every failure becomes a :class:`QueryFailure` with an :class:`~canary.evidence.ErrorClass` named from
what Prometheus said — its ``errorType`` first (``bad_data``, ``execution``, ``timeout``,
``unavailable``), the HTTP status otherwise — and carrying its own ``error`` text (truncated). What is
not a Prometheus answer at all (not JSON, truncated JSON, an empty body, a proxy's HTML page, JSON
without ``status``/``data``, an answer past its cap) is ``malformed-response``; a connection that
failed is ``unreachable``. Of such an answer a detail says the status and the content type, never
its text: it reaches Events, notifications and ``explain``. Details never carry a secret: no header
values, and the URL only as ``scheme://host[:port]``. Nothing raises out of
:meth:`PrometheusClient.instant` or :meth:`PrometheusClient.range_query`.

An instant query may be asked with a typed decoder (:func:`vector_decoder`, msgspec): a well-formed
answer is then read straight from the body's bytes into compact typed series, in one pass and without
a ``dict`` per series (the evidence pipeline's per-tick sample: a hundred thousand series at 1,000
rollouts). An answer that does not fit the type is read as any other, so what is wrong with it is
named the same way.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote_plus, urlencode, urlsplit

import msgspec
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.auth import AuthBase, HTTPBasicAuth
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError, ReadTimeoutError
from urllib3.util.retry import Retry

from canary.answers import AnswerError, AnswerLate, AnswerTooLarge, BoundedSession
from canary.evidence import ErrorClass
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
]

_DETAIL_LIMIT = 500  # characters of a Prometheus error message kept in evidence and logs
# Bytes of one 2xx answer read at most, by default. The largest answer this controller asks for is the
# per-tick counter sample: at 1,000 rollouts (benchmarks/scale.py) about 100,000 series, each about
# 250 bytes of JSON (six labels with Kubernetes names of usual length, one sample): some 25 MB. A
# backfill's range query is bounded by its sample budget (200,000 samples, a few MB). 128 MiB holds
# five times the largest, for more pods, buckets or longer names; past it the query fails as
# malformed-response and says which setting to raise.
DEFAULT_MAX_ANSWER_BYTES = 128 * 1024 * 1024
# Bytes of any other answer read at most: Prometheus' error envelope is an errorType and one message
# (a parse error quotes a position, a many-to-many error two label sets), far below this.
ERROR_ANSWER_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """Where Prometheus is and how to talk to it. Secrets are referenced (env var, file), never held.

    Prometheus-compatible backends are configuration: Mimir/Cortex need ``headers={"X-Scope-OrgID":
    "tenant"}``, Thanos or a proxy may need a bearer token (``bearer_token_file`` is re-read on every
    request, so rotated service-account tokens keep working) and a CA bundle.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may carry credentials
    bearer_token_file: str | None = None
    bearer_token_env: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    basic_auth_password_env: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 10.0  # seconds: Prometheus' own query timeout; the client waits a little longer
    connect_timeout: float = 3.0
    max_get_length: int = 4000  # longer encoded queries go as a POST form body
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES  # of one 2xx answer; more is not read

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the Prometheus URL must start with http:// or https://, got {self.url!r}")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_answer_bytes <= 0:
            raise ValueError("max_answer_bytes must be positive")
        if self.bearer_token_file and self.bearer_token_env:
            raise ValueError("give the bearer token as a file or an environment variable, not both")
        if (self.basic_auth_password_file or self.basic_auth_password_env) and not self.basic_auth_username:
            raise ValueError("a basic-auth password needs basic_auth_username")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read ``PROMETHEUS_URL``, ``PROMETHEUS_HEADERS`` (``K=V,K2=V2``), ``PROMETHEUS_TOKEN_FILE``,
        ``PROMETHEUS_TOKEN_ENV`` (the *name* of a variable holding the token), ``PROMETHEUS_USERNAME``,
        ``PROMETHEUS_PASSWORD_FILE``, ``PROMETHEUS_PASSWORD_ENV``, ``PROMETHEUS_CA_FILE``,
        ``PROMETHEUS_INSECURE_SKIP_VERIFY``, ``PROMETHEUS_TIMEOUT`` (seconds) and
        ``PROMETHEUS_MAX_ANSWER_BYTES``."""
        env = os.environ if environ is None else environ
        headers: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in env.get("PROMETHEUS_HEADERS", "").split(","))):
            name, separator, value = item.partition("=")
            if not separator or not name.strip():
                raise ValueError(f"PROMETHEUS_HEADERS entries look like Name=value, got {name.strip()!r}")
            headers[name.strip()] = value.strip()
        return cls(
            url=env.get("PROMETHEUS_URL", "http://localhost:9090"),
            headers=headers,
            bearer_token_file=env.get("PROMETHEUS_TOKEN_FILE") or None,
            bearer_token_env=env.get("PROMETHEUS_TOKEN_ENV") or None,
            basic_auth_username=env.get("PROMETHEUS_USERNAME") or None,
            basic_auth_password_file=env.get("PROMETHEUS_PASSWORD_FILE") or None,
            basic_auth_password_env=env.get("PROMETHEUS_PASSWORD_ENV") or None,
            ca_file=env.get("PROMETHEUS_CA_FILE") or None,
            insecure_skip_verify=env.get("PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower()
            in {"1", "true", "yes"},
            timeout=float(env.get("PROMETHEUS_TIMEOUT", "10")),
            max_answer_bytes=int(env.get("PROMETHEUS_MAX_ANSWER_BYTES") or DEFAULT_MAX_ANSWER_BYTES),
        )


def _read_secret(file: str | None, env: str | None) -> str:
    if file:
        return Path(file).read_text(encoding="utf-8").strip()
    if env:
        return os.environ.get(env, "").strip()
    return ""


class _BearerToken(AuthBase):
    """``Authorization: Bearer`` from a file or an environment variable, read when each request is made."""

    def __init__(self, file: str | None, env: str | None) -> None:
        self._file = file
        self._env = env

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        token = _read_secret(self._file, self._env)
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        return request


class _BasicAuth(AuthBase):
    def __init__(self, username: str, file: str | None, env: str | None) -> None:
        self._username = username
        self._file = file
        self._env = env

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        prepared: requests.PreparedRequest = HTTPBasicAuth(
            self._username, _read_secret(self._file, self._env)
        )(request)
        return prepared


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime; a naive one is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


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
class _Attempt:
    payload: Any = None  # ``data`` of a successful envelope
    failure: QueryFailure | None = None
    retryable: bool = False
    warnings: tuple[str, ...] = ()
    content_type: str = ""


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
        if config.bearer_token_file or config.bearer_token_env:
            session.auth = _BearerToken(config.bearer_token_file, config.bearer_token_env)
        elif config.basic_auth_username:
            session.auth = _BasicAuth(
                config.basic_auth_username, config.basic_auth_password_file, config.basic_auth_password_env
            )
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
            failure = _malformed(attempt, "data without resultType and result")
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
            return _malformed(attempt, "data is not a list of names"), http_requests
        return [str(item) for item in attempt.payload], http_requests

    def _with_retries(
        self, call: Callable[[], object], typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None
    ) -> tuple[_Attempt, int]:
        # Only what certainly never ran is tried again (see the module docstring): `retryable`.
        return retrying(
            self.config.retry,
            lambda _: self._attempt(call, typed),
            again=lambda attempt: attempt.failure is not None and attempt.retryable,
            sleep=self._sleep,
        )

    def _attempt(
        self, call: Callable[[], object], typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None
    ) -> _Attempt:
        self._captured.response = None
        origin = redact_url(self.config.url)
        try:
            call()
        except AnswerError as error:
            return self._unread(error, origin)
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
            return _Attempt(
                failure=QueryFailure(ErrorClass.SERVER, f"{origin}: no HTTP response was seen{seen}")
            )
        if typed is not None and response.status_code == 200:
            try:
                envelope = typed.decode(response.content)
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass  # not of the type: read as any answer below, which names what is wrong with it
            else:
                if envelope.status == "success" and envelope.data is not None:
                    return _Attempt(payload=envelope.data, warnings=tuple(envelope.warnings))
        return _classify(response, self._secrets(response))

    def _not_asked(self, error: requests.exceptions.RequestException, origin: str) -> _Attempt:
        """A call that got no answer: no connection, a read timeout, a connection that failed."""
        if isinstance(error, requests.exceptions.ConnectTimeout):
            detail = f"{origin}: no connection within {self.config.connect_timeout:g}s (connect timeout)"
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, detail), retryable=True)
        if isinstance(error, requests.exceptions.Timeout):
            return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail(origin)))
        if isinstance(error, requests.exceptions.SSLError):
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: TLS: {_reason(error)}"))
        if isinstance(error, requests.exceptions.ConnectionError):
            if _caused_by(error, ReadTimeoutError):
                return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail(origin)))
            # Retry only when the request certainly never reached Prometheus (refused, DNS): a reset
            # connection may have been running an expensive query.
            never_sent = _caused_by(error, NewConnectionError, ConnectTimeoutError)
            failure = QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: {_reason(error)}")
            return _Attempt(failure=failure, retryable=never_sent)
        return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, f"{origin}: {_reason(error)}"))

    def _unread(self, error: AnswerError, origin: str) -> _Attempt:
        """An answer not read whole: late (by the deadline), too large, or cut short. Named by its
        status; nothing of its body is shown."""
        status = error.status
        if isinstance(error, AnswerLate) or status is None:
            said = "no answer" if status is None else "no complete answer"
            detail = f"{origin}: {said} within {self._deadline:g}s (client deadline; not retried)"
            return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, detail, status))
        ok = 200 <= status < 300
        error_class = ErrorClass.MALFORMED_RESPONSE if ok else _BY_STATUS.get(status, ErrorClass.SERVER)
        if isinstance(error, AnswerTooLarge):  # the same again if asked again: not retried
            setting = " (max_answer_bytes)" if ok else ""
            return _Attempt(
                failure=QueryFailure(
                    error_class, f"{_status_text(status)}: {error}{setting}, not read", status
                )
            )
        failure = QueryFailure(error_class, f"{_status_text(status)}: {error}", status)
        return _Attempt(failure=failure, retryable=error_class is ErrorClass.UNAVAILABLE)

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
        return _short(getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or tls)
    text = _POOL.sub("", str(error)).strip(" ()'\"") or type(error).__name__
    return _short(text)


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"


def _malformed(attempt: _Attempt, problem: str) -> QueryFailure:
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
_BY_STATUS = {
    504: ErrorClass.TIMEOUT,
    400: ErrorClass.BAD_QUERY,
    422: ErrorClass.EXECUTION,
    # Nothing ran: a proxy without a backend, Prometheus starting up, or rate limiting.
    502: ErrorClass.UNAVAILABLE,
    503: ErrorClass.UNAVAILABLE,
    429: ErrorClass.UNAVAILABLE,
}


def _classify(response: requests.Response, secrets: Sequence[str] = ()) -> _Attempt:
    """Turn one HTTP response into a payload or a failure named from what the server said: of a body
    that is not a Prometheus answer, only its status and content type."""
    status = response.status_code
    if 300 <= status < 400:
        detail = f"{_status_text(status)}: a redirect, not followed"
        return _Attempt(failure=QueryFailure(ErrorClass.SERVER, detail, status))
    content_type = _media_type(response)
    envelope, problem = _envelope(_text(response), content_type)
    prometheus = envelope if envelope is not None else {}
    listed = prometheus.get("warnings")
    warnings = tuple(str(item) for item in listed) if isinstance(listed, list) else ()  # not `true`, `5`
    if status == 200 and prometheus.get("status") == "success":
        if "data" not in prometheus:
            detail = f"HTTP 200 {content_type}, not a Prometheus answer: status success without data"
            return _Attempt(failure=_scrubbed(ErrorClass.MALFORMED_RESPONSE, detail, status, secrets))
        return _Attempt(payload=prometheus["data"], warnings=warnings, content_type=content_type)
    if status == 200 and not prometheus:
        detail = f"HTTP 200 {content_type}, not a Prometheus answer: {problem}"
        return _Attempt(failure=_scrubbed(ErrorClass.MALFORMED_RESPONSE, detail, status, secrets))
    error_type = str(prometheus.get("errorType") or "")
    if prometheus:
        message = str(prometheus.get("error") or "")
        detail = (
            f"HTTP {status}" + (f" {error_type}" if error_type else "") + (f": {message}" if message else "")
        )
    else:
        detail = _status_text(status)  # a proxy's page, a login form: its text is not shown
    error_class = _BY_ERROR_TYPE.get(error_type) or _BY_STATUS.get(status, ErrorClass.SERVER)
    # A timed-out query is never re-run; "unavailable" (nothing ran) is.
    retryable = error_class is ErrorClass.UNAVAILABLE
    return _Attempt(failure=_scrubbed(error_class, detail, status, secrets), retryable=retryable)


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


def _status_text(status: int) -> str:
    """``HTTP 503 Service Unavailable``: the status and its standard phrase (never the server's)."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _scrubbed(error_class: ErrorClass, detail: str, status: int, secrets: Sequence[str]) -> QueryFailure:
    for secret in secrets:
        detail = detail.replace(secret, "<redacted>")
    return QueryFailure(error_class, _short(detail), status)
