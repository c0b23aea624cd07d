"""Where Prometheus (or Thanos, Mimir, Cortex) is and the credentials it takes, as settings
(:mod:`canary.metrics.client` asks with them)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests
from requests.auth import AuthBase, HTTPBasicAuth

from canary.retrying import RetryPolicy

__all__ = ["DEFAULT_MAX_ANSWER_BYTES", "PrometheusConfig", "credentials", "parse_headers"]

# Bytes of one 2xx answer read at most, by default. The largest answer this controller asks for is the
# per-tick counter sample: at 1,000 rollouts (benchmarks/scale.py) about 100,000 series, each about
# 250 bytes of JSON (six labels with Kubernetes names of usual length, one sample): some 25 MB. A
# backfill's range query is bounded by its sample budget (200,000 samples, a few MB). 128 MiB holds
# five times the largest, for more pods, buckets or longer names; past it the query fails as
# malformed-response and says which setting to raise.
DEFAULT_MAX_ANSWER_BYTES = 128 * 1024 * 1024


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


def _read_secret(file: str | None, env: str | None) -> str:
    if file:
        return Path(file).read_text(encoding="utf-8").strip()
    if env:
        return os.environ.get(env, "").strip()
    return ""


class _Credentials(AuthBase):
    """A bearer token, else basic auth, read from its file or environment variable at each request."""

    def __init__(self, config: PrometheusConfig) -> None:
        self._config = config

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        config = self._config
        if config.bearer_token_file or config.bearer_token_env:
            token = _read_secret(config.bearer_token_file, config.bearer_token_env)
            if token:
                request.headers["Authorization"] = f"Bearer {token}"
            return request
        password = _read_secret(config.basic_auth_password_file, config.basic_auth_password_env)
        prepared: requests.PreparedRequest = HTTPBasicAuth(config.basic_auth_username or "", password)(
            request
        )
        return prepared


def credentials(config: PrometheusConfig) -> AuthBase | None:
    """The session's auth for ``config``: a bearer token, basic auth, or none."""
    if config.bearer_token_file or config.bearer_token_env or config.basic_auth_username:
        return _Credentials(config)
    return None


def parse_headers(values: Iterable[str]) -> dict[str, str]:
    """``NAME=VALUE`` each (``--prometheus-header``). A malformed one is refused without being
    quoted: a header is where a credential travels."""
    parsed: dict[str, str] = {}
    for value in values:
        name, separator, content = value.partition("=")
        if not separator or not name.strip():
            raise ValueError("expected NAME=VALUE: a name, '=' and the value")
        parsed[name.strip()] = content.strip()
    return parsed
