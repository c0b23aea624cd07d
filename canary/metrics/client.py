"""The HTTP side of the evidence layer: one Prometheus (or Thanos, Mimir, Cortex) and how we ask it.

Built on prometheus-api-client's :class:`PrometheusConnect`, with four of its 0.7.2 habits undone:

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
  itself (HTTP 503, errorType ``timeout``) a little before our client-side read timeout fires.

Every failure becomes a :class:`QueryFailure` with an :class:`~canary.evidence.ErrorClass`; nothing
raises out of :meth:`PrometheusClient.instant`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlencode

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.auth import AuthBase, HTTPBasicAuth
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError
from urllib3.util.retry import Retry

from canary.evidence import ErrorClass

__all__ = [
    "PrometheusClient",
    "PrometheusConfig",
    "QueryAnswer",
    "QueryFailure",
    "QueryOutcome",
    "RetryPolicy",
    "as_utc",
]

_DETAIL_LIMIT = 500  # characters of a Prometheus error message kept in evidence and logs


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a query that certainly did not run is tried again (never one that timed out)."""

    attempts: int = 3  # tries in total, the first included
    backoff: float = 0.2  # seconds before the second try; doubled for each further try
    max_backoff: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff must not be negative")

    def pause_before(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt`` (2, 3, ...)."""
        return float(min(self.max_backoff, self.backoff * 2.0 ** (attempt - 2)))


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

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the Prometheus URL must start with http:// or https://, got {self.url!r}")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.bearer_token_file and self.bearer_token_env:
            raise ValueError("give the bearer token as a file or an environment variable, not both")
        if (self.basic_auth_password_file or self.basic_auth_password_env) and not self.basic_auth_username:
            raise ValueError("a basic-auth password needs basic_auth_username")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read ``PROMETHEUS_URL``, ``PROMETHEUS_HEADERS`` (``K=V,K2=V2``), ``PROMETHEUS_TOKEN_FILE``,
        ``PROMETHEUS_TOKEN_ENV`` (the *name* of a variable holding the token), ``PROMETHEUS_USERNAME``,
        ``PROMETHEUS_PASSWORD_FILE``, ``PROMETHEUS_PASSWORD_ENV``, ``PROMETHEUS_CA_FILE``,
        ``PROMETHEUS_INSECURE_SKIP_VERIFY`` and ``PROMETHEUS_TIMEOUT`` (seconds)."""
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
        session = requests.Session()
        session.verify = False if config.insecure_skip_verify else (config.ca_file or True)
        if config.bearer_token_file or config.bearer_token_env:
            session.auth = _BearerToken(config.bearer_token_file, config.bearer_token_env)
        elif config.basic_auth_username:
            session.auth = _BasicAuth(
                config.basic_auth_username, config.basic_auth_password_file, config.basic_auth_password_env
            )
        session.hooks["response"].append(self._keep_response)
        self._session = session
        # Prometheus gets `timeout` and answers 503 when it runs out; the client waits a bit longer so
        # that answer, not a read timeout, is what normally ends a slow query.
        self._http_timeout = (config.connect_timeout, config.timeout + 1.0)
        self._connect = PrometheusConnect(
            url=config.url.rstrip("/"),
            headers=dict(config.headers),
            # The library's default re-runs timed-out queries; retries are ours (see RetryPolicy).
            # read=False re-raises a read timeout as itself instead of wrapping it as a connection error.
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

    def instant(self, promql: str, at: datetime) -> QueryOutcome:
        """Evaluate ``promql`` at ``at`` (``time=``; Prometheus' clock is never used)."""
        params = {"time": f"{as_utc(at).timestamp():.3f}", "timeout": f"{self.config.timeout:g}"}

        def call() -> object:
            if len(urlencode({"query": promql, **params})) <= self.config.max_get_length:
                return self._connect.custom_query(query=promql, params=params, timeout=self._http_timeout)
            # The library sends parameters in the URL even with method="POST", and long URLs fail
            # behind proxies (414, or silently truncated): send long queries as a form body instead.
            return self._session.post(
                f"{self._connect.url}/api/v1/query",
                data={"query": promql, **params},
                headers=dict(self.config.headers),
                timeout=self._http_timeout,
            )

        started = self._clock()
        attempt, http_requests = self._with_retries(call)
        duration = self._clock() - started
        if attempt.failure is not None:
            return QueryOutcome(promql, None, attempt.failure, http_requests, duration)
        data = attempt.payload
        if not isinstance(data, dict) or "resultType" not in data or "result" not in data:
            failure = QueryFailure(ErrorClass.UNEXPECTED_RESULT, "the answer has no data.resultType/result")
            return QueryOutcome(promql, None, failure, http_requests, duration)
        answer = QueryAnswer(str(data["resultType"]), data["result"], attempt.warnings)
        return QueryOutcome(promql, answer, None, http_requests, duration)

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
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, "expected a list of names"), http_requests
        return [str(item) for item in attempt.payload], http_requests

    def _read_timeout_detail(self) -> str:
        return f"no answer within {self._http_timeout[1]:g}s (client read timeout; not retried)"

    def _with_retries(self, call: Callable[[], object]) -> tuple[_Attempt, int]:
        policy = self.config.retry
        tries = 0
        while True:
            tries += 1
            attempt = self._attempt(call)
            if attempt.failure is None or not attempt.retryable or tries >= policy.attempts:
                return attempt, tries
            self._sleep(policy.pause_before(tries + 1))

    def _attempt(self, call: Callable[[], object]) -> _Attempt:
        self._captured.response = None
        try:
            call()
        except PrometheusApiClientException:
            pass  # the captured response below says what went wrong, without parsing a bytes repr
        except requests.exceptions.ConnectTimeout as error:
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, _short(error)), retryable=True)
        except requests.exceptions.Timeout:
            return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail()))
        except requests.exceptions.SSLError as error:
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, f"TLS: {_short(error)}"))
        except requests.exceptions.ConnectionError as error:
            if _caused_by(error, ReadTimeoutError):
                return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, self._read_timeout_detail()))
            # Retry only when the request certainly never reached Prometheus (refused, DNS): a reset
            # connection may have been running an expensive query.
            never_sent = _caused_by(error, NewConnectionError, ConnectTimeoutError)
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, _short(error)), retryable=never_sent)
        except requests.exceptions.RequestException as error:
            return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, _short(error)))
        except ValueError as error:  # a 200 whose body is not JSON (a proxy's login page, ...)
            response = getattr(self._captured, "response", None)
            status = response.status_code if response is not None else None
            return _Attempt(
                failure=QueryFailure(
                    ErrorClass.UNEXPECTED_RESULT, f"not a Prometheus answer: {_short(error)}", status
                )
            )
        response = getattr(self._captured, "response", None)
        if response is None:
            return _Attempt(failure=QueryFailure(ErrorClass.SERVER, "no HTTP response was seen"))
        return _classify(response)


def _caused_by(error: BaseException, *kinds: type[BaseException]) -> bool:
    """Whether ``error`` or anything in its cause chain (urllib3 nests them deeply) is one of ``kinds``."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return True
        pending.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    return False


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"


def _classify(response: requests.Response) -> _Attempt:
    """Turn one HTTP response into a payload or a classified failure."""
    status = response.status_code
    try:
        envelope = response.json()
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict):
        envelope = {}
    warnings = tuple(str(item) for item in envelope.get("warnings") or ())
    if status == 200 and envelope.get("status") == "success":
        return _Attempt(payload=envelope.get("data"), warnings=warnings)
    error_type = str(envelope.get("errorType", ""))
    message = str(envelope.get("error") or response.text.strip() or response.reason or "")
    detail = _short(
        f"HTTP {status}" + (f" {error_type}" if error_type else "") + (f": {message}" if message else "")
    )
    if status == 200:
        return _Attempt(failure=QueryFailure(ErrorClass.UNEXPECTED_RESULT, detail, status))
    if error_type == "timeout" or status == 504:
        return _Attempt(failure=QueryFailure(ErrorClass.TIMEOUT, detail, status))  # never re-run
    if status == 400 or error_type == "bad_data":
        return _Attempt(failure=QueryFailure(ErrorClass.BAD_QUERY, detail, status))
    if status == 422 or error_type == "execution":
        return _Attempt(failure=QueryFailure(ErrorClass.EXECUTION, detail, status))
    if status in {502, 503, 429}:
        # Nothing ran: a proxy without a backend, Prometheus starting up, or rate limiting.
        return _Attempt(failure=QueryFailure(ErrorClass.UNREACHABLE, detail, status), retryable=True)
    return _Attempt(failure=QueryFailure(ErrorClass.SERVER, detail, status))
