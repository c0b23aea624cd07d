"""Client configuration: environment, secrets by reference, our retry policy."""

from __future__ import annotations

import pytest

from canary.metrics.client import PrometheusConfig, RetryPolicy


def test_from_env_reads_url_headers_and_secret_references() -> None:
    config = PrometheusConfig.from_env(
        {
            "PROMETHEUS_URL": "https://mimir.example:8080/prometheus",
            "PROMETHEUS_HEADERS": "X-Scope-OrgID=team-a, X-Extra = 1",
            "PROMETHEUS_TOKEN_FILE": "/var/run/secrets/token",
            "PROMETHEUS_CA_FILE": "/etc/ca.pem",
            "PROMETHEUS_TIMEOUT": "7.5",
        }
    )
    assert config.url == "https://mimir.example:8080/prometheus"
    assert dict(config.headers) == {"X-Scope-OrgID": "team-a", "X-Extra": "1"}
    assert config.bearer_token_file == "/var/run/secrets/token"
    assert config.ca_file == "/etc/ca.pem"
    assert config.timeout == 7.5


def test_header_values_never_appear_in_the_repr() -> None:
    config = PrometheusConfig(url="http://p:9090", headers={"Authorization": "Bearer s3cr3t"})
    assert "s3cr3t" not in repr(config)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"PROMETHEUS_HEADERS": "novalue"}, "Name=value"),
        ({"PROMETHEUS_URL": "prometheus:9090"}, "http:// or https://"),
        ({"PROMETHEUS_TOKEN_FILE": "/t", "PROMETHEUS_TOKEN_ENV": "T"}, "not both"),
        ({"PROMETHEUS_PASSWORD_ENV": "P"}, "basic_auth_username"),
        ({"PROMETHEUS_TIMEOUT": "0"}, "positive"),
    ],
)
def test_bad_configuration_is_refused_with_a_reason(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrometheusConfig.from_env(environ)


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=5, backoff=0.1, max_backoff=0.3)
    assert [policy.pause_before(attempt) for attempt in (2, 3, 4, 5)] == pytest.approx([0.1, 0.2, 0.3, 0.3])


def test_retry_policy_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)
