"""Slack, Teams, Discord and webhook bodies are scrubbed with the secret values of the notification's
namespace, as its Events are (issue #34, Build item 3): team A's URL or key in team A's message (a
Prometheus error that repeats a URL, a proxy that echoes a header) is masked, and team A's values never
mask words in team B's messages. Real HTTP to a receiver per team, senders built as the controller
builds them: one process-wide redactor, one resolver per namespace reading that namespace's Secret."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from canary.notify.destinations import destination_for
from canary.notify.message import CheckLine, CheckVerdict, Notification
from canary.notify.posting import scrubbed
from canary.notify.secrets import MASK, Redactor, SecretResolver
from canary.policy.model import NotifyTarget, SecretRef
from tests.notify.support import Receiver, rollback_notification

SECRET_NAME = "kserve-canary-notifications"
# Team A's signing key happens to be words that every team's rollback notice carries.
TEAM_A_KEY = "rolled back to the stable revision"
TEAM_A_TOKEN = "team-a-token-5f0c9e2d41b7"  # the credential part of team A's webhook URL
KINDS = ("slack", "teams", "discord", "webhook")
KEY_REF = SecretRef(env="HOOK_KEY")


def _target(kind: str) -> NotifyTarget:
    if kind == "webhook":
        entry = {"urlFrom": {"env": "HOOK_URL"}, "secretFrom": {"env": "HOOK_KEY"}}
    else:
        entry = {"webhookUrlFrom": {"env": "HOOK_URL"}}
    return NotifyTarget.model_validate({kind: entry})


def _resolver(redactor: Redactor, namespace: str, data: Mapping[str, str]) -> SecretResolver:
    """A PromotionPolicy object's resolver: keys of its namespace's Secret, as the controller reads them."""

    def read(secret_namespace: str, name: str) -> Mapping[str, str] | None:
        assert (secret_namespace, name) == (namespace, SECRET_NAME)
        return data

    return SecretResolver(redactor, {}).from_namespace_secret(namespace, read, SECRET_NAME)


def _received(receiver: Receiver) -> str:
    """Every text of the one body the receiver got (JSON decoded, so no escape hides a value)."""
    (request,) = receiver.wait_for(1)
    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(request.json())
    return "\n".join(texts)


def _leaky(namespace: str, url: str) -> Notification:
    """A rollback whose Prometheus error text repeats a webhook URL, its path alone, and a key."""
    path = url.split("/", 3)[3]
    detail = f"HTTPConnectionPool: Max retries exceeded with url: /{path}; upstream said {TEAM_A_KEY!r}"
    return rollback_notification(
        namespace=namespace,
        summary=f"Evidence for kv-cache could not be read: POST {url} failed",
        reasons=(f"kv-cache: query failed: {detail}",),
        checks=(CheckLine("kv-cache", CheckVerdict.ERROR, limit="≤ 95%", detail=detail),),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_teams_own_secret_values_are_masked_in_its_own_chat_body(receiver_factory: Any, kind: str) -> None:
    team_a = receiver_factory()
    url = f"{team_a.url}/hooks/{TEAM_A_TOKEN}"
    redactor = Redactor()
    resolver = _resolver(redactor, "team-a", {"HOOK_URL": url, "HOOK_KEY": TEAM_A_KEY})
    resolver.resolve_key(KEY_REF)
    destination_for(_target(kind), resolver=resolver, ref="notify[0]").sender.send(_leaky("team-a", url))

    body = _received(team_a)
    assert TEAM_A_TOKEN not in body, body
    assert TEAM_A_KEY not in body, body
    assert MASK in body.replace("\\", "")  # Teams and Discord show it Markdown-escaped
    assert "kv-cache" in body  # the rest of the message is intact


@pytest.mark.parametrize("kind", KINDS)
def test_one_teams_values_never_mask_words_in_another_teams_chat_body(
    receiver_factory: Any, kind: str
) -> None:
    team_a, team_b = receiver_factory(), receiver_factory()
    redactor = Redactor()  # one per process, shared by every namespace's resolver
    a_data = {"HOOK_URL": f"{team_a.url}/hooks/{TEAM_A_TOKEN}", "HOOK_KEY": TEAM_A_KEY}
    b_data = {
        "HOOK_URL": f"{team_b.url}/hooks/team-b-token-0a8d77c3e9",
        "HOOK_KEY": "team-b-signing-key-93e1",
    }
    a_resolver = _resolver(redactor, "team-a", a_data)
    a_resolver.resolve_key(KEY_REF)  # team A's key is known before either message is sent
    team_a_sender = destination_for(_target(kind), resolver=a_resolver).sender
    team_b_sender = destination_for(_target(kind), resolver=_resolver(redactor, "team-b", b_data)).sender

    team_a_sender.send(rollback_notification(namespace="team-a"))
    team_b_sender.send(rollback_notification(namespace="team-b"))

    assert "Critical check oom failed at 30%; rolled back to the stable revision." in _received(team_b)
    assert MASK not in _received(team_b)
    assert TEAM_A_KEY not in _received(team_a)
    assert "Critical check oom failed at 30%; ***." in _received(team_a).replace("\\", "")


def test_scrubbing_keeps_identifiers_and_enums_and_returns_the_same_object_when_clean() -> None:
    redactor = Redactor()
    _resolver(redactor, "team-a", {"HOOK_KEY": TEAM_A_KEY}).resolve_key(KEY_REF)
    clean = rollback_notification(namespace="team-b")
    assert scrubbed(clean, redactor) is clean
    original = rollback_notification(namespace="team-a")
    masked = scrubbed(original, redactor)
    assert masked.summary == "Critical check oom failed at 30%; ***."
    assert (masked.id, masked.reason, masked.action, masked.severity, masked.time) == (
        original.id,
        original.reason,
        original.action,
        original.severity,
        original.time,
    )
    assert masked.checks is original.checks  # nothing in them to mask: kept as they were
