"""Client configuration: secrets by reference, our retry policy."""

from __future__ import annotations

from typing import Any

import pytest

from canary.metrics.client import PrometheusConfig, RetryPolicy


def test_header_values_never_appear_in_the_repr() -> None:
    config = PrometheusConfig(url="http://p:9090", headers={"Authorization": "Bearer s3cr3t"})
    assert "s3cr3t" not in repr(config)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"url": "prometheus:9090"}, "http:// or https://"),
        ({"bearer_token_file": "/t", "bearer_token_env": "T"}, "not both"),
        ({"basic_auth_password_env": "P"}, "basic_auth_username"),
        ({"timeout": 0}, "positive"),
        ({"max_answer_bytes": 0}, "positive"),
    ],
)
def test_bad_configuration_is_refused_with_a_reason(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrometheusConfig(**{"url": "http://p:9090", **settings})


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=5, backoff=0.1, max_backoff=0.3)
    assert [policy.pause_before(attempt) for attempt in (2, 3, 4, 5)] == pytest.approx([0.1, 0.2, 0.3, 0.3])


def test_retry_policy_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)
