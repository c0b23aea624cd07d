from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog

from canary.notify.secrets import MASK, Redactor, SecretResolver, SecretUnavailable, make_redact_processor
from canary.policy.model import SecretRef

SLACK_URL = "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/cccccccccccccccccccccccc"


def test_env_secret_is_resolved_when_asked_and_registered_for_redaction() -> None:
    environ: dict[str, str] = {}
    redactor = Redactor()
    resolver = SecretResolver(redactor, environ)
    ref = SecretRef(env="SLACK_WEBHOOK_URL")
    environ["SLACK_WEBHOOK_URL"] = SLACK_URL + "\n"  # resolved at send time, not construction time
    assert resolver.resolve(ref) == SLACK_URL
    assert SLACK_URL in redactor
    assert redactor.scrub(f"posting to {SLACK_URL} failed") == f"posting to {MASK} failed"


def test_file_secret_is_stripped_and_rotation_is_picked_up(tmp_path: Path) -> None:
    secret_file = tmp_path / "hmac"
    secret_file.write_text("first-signing-key-value\n")
    redactor = Redactor()
    resolver = SecretResolver(redactor, {})
    ref = SecretRef(file=str(secret_file))
    assert resolver.resolve(ref) == "first-signing-key-value"
    secret_file.write_text("  second-signing-key-value  \n")
    assert resolver.resolve(ref) == "second-signing-key-value"
    # Both values stay redacted: logs about the old key may still be written.
    assert redactor.scrub("first-signing-key-value second-signing-key-value") == f"{MASK} {MASK}"


def test_errors_name_the_reference_never_the_value(tmp_path: Path) -> None:
    resolver = SecretResolver(Redactor(), {"EMPTY": "   ", "SHORT": "ab"})
    with pytest.raises(SecretUnavailable, match="^env MISSING is not set$"):
        resolver.resolve(SecretRef(env="MISSING"))
    with pytest.raises(SecretUnavailable, match="^env EMPTY is empty$"):
        resolver.resolve(SecretRef(env="EMPTY"))
    with pytest.raises(SecretUnavailable, match="env SHORT is shorter than 16") as short:
        resolver.resolve(SecretRef(env="SHORT"))
    assert "ab" not in str(short.value).replace("cannot", "")
    missing = tmp_path / "nope"
    with pytest.raises(SecretUnavailable, match=f"^file {missing} cannot be read"):
        resolver.resolve(SecretRef(file=str(missing)))


def test_url_fragments_that_http_errors_repeat_are_redacted() -> None:
    redactor = Redactor()
    url = "https://hooks.example.com/deploy/9f8e7d6c5b4a?token=abc123def456"
    redactor.add(url)
    # urllib3 reports only the path: "Max retries exceeded with url: /deploy/..."
    assert "9f8e7d6c5b4a" not in redactor.scrub(
        "Max retries exceeded with url: /deploy/9f8e7d6c5b4a?token=abc123def456"
    )
    assert "9f8e7d6c5b4a" not in redactor.scrub("GET /deploy/9f8e7d6c5b4a HTTP/1.1")
    # Percent-encoded, as it appears inside another URL's query.
    assert "9f8e7d6c5b4a" not in redactor.scrub(
        "redirect=https%3A%2F%2Fhooks.example.com%2Fdeploy%2F9f8e7d6c5b4a"
    )


def test_credential_shapes_are_redacted_even_if_never_registered() -> None:
    redactor = Redactor()
    assert redactor.scrub("https://bob:hunter22@example.com/x") == f"https://{MASK}@example.com/x"
    assert redactor.scrub(f"url={SLACK_URL}") == f"url=https://hooks.slack.com/services/{MASK}"
    assert redactor.scrub("https://h/x?a=1&token=s3cr3t&b=2") == f"https://h/x?a=1&token={MASK}&b=2"
    assert redactor.scrub("Authorization: Bearer eyJhbGciOi.x-y_z") == f"Authorization: Bearer {MASK}"
    # Ordinary text is left alone.
    assert redactor.scrub("p99 612ms ≤ 800ms at https://prometheus:9090/api/v1/query") == (
        "p99 612ms ≤ 800ms at https://prometheus:9090/api/v1/query"
    )


def test_scrub_value_walks_containers_and_stringifies_revealing_objects() -> None:
    redactor = Redactor()
    redactor.add("topsecret-value")
    error = RuntimeError("failed at topsecret-value")
    scrubbed = redactor.scrub_value(
        {"a": ["x topsecret-value"], "b": ("topsecret-value",), "e": error, "n": 3}
    )
    assert scrubbed == {"a": [f"x {MASK}"], "b": (MASK,), "e": f"failed at {MASK}", "n": 3}


def test_redact_processor_scrubs_rendered_log_lines_including_tracebacks() -> None:
    redactor = Redactor()
    redactor.add(SLACK_URL)
    output = io.StringIO()
    structlog.configure(
        processors=[make_redact_processor(redactor), structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(output),
        cache_logger_on_first_use=False,
    )
    try:
        logger = structlog.get_logger("test")
        logger.warning("posting failed", url=SLACK_URL, extra={"nested": [SLACK_URL]})
        try:
            raise ConnectionError(f"cannot reach {SLACK_URL}")
        except ConnectionError:
            logger.exception("unexpected")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in output.getvalue().splitlines()]
    assert len(lines) == 2
    assert "cccccccccccccccccccccccc" not in output.getvalue()
    assert lines[0]["url"] == MASK
    assert "ConnectionError: cannot reach ***" in lines[1]["exception"]
