from __future__ import annotations

from typing import Any

import pytest

from canary.notify.delivery import USER_AGENT, DeliveryError
from canary.notify.message import CheckLine, CheckVerdict, NotificationAction
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.slack import SlackSender, check_text, slack_message
from canary.policy.model import SecretRef
from tests.notify.support import DECISION_TIME, Receiver, Reply, make_notification, rollback_notification


def _sender(receiver: Receiver, path: str = "/services/T0/B0/slack-token-123", **kwargs: Any) -> SlackSender:
    resolver = SecretResolver(Redactor(), {"SLACK_WEBHOOK_URL": receiver.url + path})
    return SlackSender(SecretRef(env="SLACK_WEBHOOK_URL"), resolver=resolver, **kwargs)


def _texts(message: dict[str, Any]) -> list[str]:
    """Every text shown by the blocks, in order."""
    texts: list[str] = []
    for block in message["blocks"]:
        if "text" in block:
            texts.append(block["text"]["text"])
        texts.extend(item["text"] for item in block.get("fields", []))
        texts.extend(item["text"] for item in block.get("elements", []))
    return texts


def test_block_kit_message_over_real_http_carries_every_number(receiver: Receiver) -> None:
    notification = make_notification()
    _sender(receiver).send(notification)

    (request,) = receiver.wait_for(1)
    assert request.path == "/services/T0/B0/slack-token-123"
    assert request.headers["Content-Type"].startswith("application/json")
    assert request.headers["User-Agent"] == USER_AGENT
    message = request.json()
    blocks = message["blocks"]
    assert blocks[0] == {
        "type": "header",
        "text": {"type": "plain_text", "text": "⏩ llama-chat: canary advanced 10% → 30%", "emoji": True},
    }
    texts = _texts(message)
    # The facts: model, weights, both revisions.
    assert "*Model*\n`ml/llama-chat`" in texts
    assert "*Traffic*\n10% → 30%" in texts
    assert "*Canary revision*\n`llama-chat-predictor-00002`" in texts
    assert "*Stable revision*\n`llama-chat-predictor-00001`" in texts
    # One field per check: value against limit, the stable value, the samples.
    assert "✅ *p99*\n612ms ≤ 800ms and ≤ +20% vs stable (stable 540ms), 1840 requests" in texts
    assert "✅ *errors*\n0.11% ≤ 1% (stable 0.09%), 1840 requests" in texts
    assert "✅ *oom* _(critical)_\n0 ≤ 0" in texts
    # Summary, reasons, and the context line with policy and decision id.
    assert any(notification.summary in text and "1,840 canary requests" in text for text in texts)
    assert texts[-1] == (
        f"policy `llama-chat-policy` · decision `{notification.id}` · 2025-03-14 09:26:53 UTC · kserve-canary"
    )
    # The plain-text fallback says the same in one go.
    assert message["text"].startswith("⏩ ml/llama-chat: canary advanced 10% → 30%. Step 10% held")
    assert "p99: 612ms ≤ 800ms and ≤ +20% vs stable (stable 540ms), 1840 requests ✅" in message["text"]
    assert "channel" not in message


def test_rollback_shows_failing_missing_and_erroring_checks_and_honours_channel(receiver: Receiver) -> None:
    _sender(receiver, channel="#ml-deploys").send(rollback_notification())
    message = receiver.wait_for(1)[0].json()
    assert message["channel"] == "#ml-deploys"
    texts = _texts(message)
    assert message["blocks"][0]["text"]["text"] == "⏪ llama-chat: canary rolled back 30% → 0%"
    assert "❌ *oom* _(critical)_\n2, not ≤ 0" in texts
    assert "⚪ *p99*\nno data: 12 requests &lt; minRequests 100 (limit ≤ 800ms)" in texts  # mrkdwn-escaped
    assert "⚠️ *kv-cache*\nquery failed: Prometheus timed out (limit ≤ 95%)" in texts


def test_promotion_reads_as_field_removed() -> None:
    message = slack_message(
        make_notification(action=NotificationAction.PROMOTED, from_weight=50, to_weight=None)
    )
    assert message["blocks"][0]["text"]["text"] == "🚀 llama-chat: canary promoted 50% → 100% (promoted)"


def test_many_checks_respect_block_kit_limits() -> None:
    checks = tuple(
        CheckLine(f"c{i}", CheckVerdict.PASS if i % 2 else CheckVerdict.FAIL, "1", "≤ 2") for i in range(57)
    )
    message = slack_message(make_notification(checks=checks, summary="x" * 5000))
    blocks = message["blocks"]
    assert len(blocks) <= 50
    assert all(len(block.get("fields", [])) <= 10 for block in blocks)
    assert all(
        len(block["text"]["text"]) <= 3000
        for block in blocks
        if block["type"] == "section" and "text" in block
    )
    assert len(blocks[0]["text"]["text"]) <= 150
    shown = [
        field
        for block in blocks
        for field in block.get("fields", [])
        if field["text"].split("*")[1].startswith("c")
    ]
    assert len(shown) == 40
    assert any("… and 17 more checks (9 not passing)" in text for text in _texts(message))


def test_user_text_is_escaped_for_mrkdwn() -> None:
    message = slack_message(make_notification(summary="<!channel> & friends", reasons=("a <b> c",)))
    text = _texts(message)[1]
    assert "&lt;!channel&gt; &amp; friends" in text
    assert "<!channel>" not in message["text"]


def test_error_text_and_check_names_carry_no_mrkdwn_control_sequence() -> None:
    """Slack reads <!channel>, <!here>, <@U…>, <#C…>, <!subteam^…> and <url|text> only from a raw "<":
    every one from Prometheus' error text or a check's name arrives as text."""
    hostile = "<!channel> <!here> <@U123> <#C123> <!subteam^S1> <https://evil.example|your dashboard> &"
    notification = rollback_notification(
        summary=f"Evidence could not be read: {hostile}",
        reasons=(f"kv-cache: query failed: {hostile}",),
        checks=(CheckLine(f"kv {hostile}", CheckVerdict.ERROR, limit="≤ 95%", detail=hostile),),
    )
    message = slack_message(notification)
    for text in [message["text"], *_texts(message)[1:]]:  # the header block is plain_text
        assert "<" not in text and ">" not in text.replace("&gt;", ""), text
        assert "&lt;https://evil.example|your dashboard&gt;" in text or "kv" not in text


def test_every_mrkdwn_text_is_verbatim_so_slack_links_no_bare_url_or_mention() -> None:
    """A text object that is not verbatim has its URLs linked, channel names linked and "certain
    mentions" parsed by Slack (docs.slack.dev/reference/block-kit/composition-objects/text-object,
    field ``verbatim``): an error text's https://evil.example or #general would become links."""
    hostile = "see https://evil.example/login or #general, @channel"
    notification = rollback_notification(
        summary=f"Evidence could not be read: {hostile}",
        reasons=(f"kv-cache: query failed: {hostile}",),
        checks=(CheckLine("kv-cache", CheckVerdict.ERROR, limit="≤ 95%", detail=hostile),),
    )
    message = slack_message(notification)
    mrkdwn = [
        text
        for block in message["blocks"]
        for text in [block.get("text"), *block.get("fields", []), *block.get("elements", [])]
        if isinstance(text, dict) and text.get("type") == "mrkdwn"
    ]
    assert len(mrkdwn) >= 4  # the summary, the facts, the checks, the context
    assert all(text.get("verbatim") is True for text in mrkdwn), mrkdwn
    assert any("https://evil.example/login" in text["text"] for text in mrkdwn)  # shown, as text


def test_check_text_one_liner() -> None:
    line = CheckLine("p99", CheckVerdict.PASS, "612ms", "≤ 800ms", "540ms")
    assert check_text(line) == "p99: 612ms ≤ 800ms (stable 540ms) ✅"


@pytest.mark.parametrize(
    ("reply", "retryable", "retry_after"),
    [
        (Reply(404, b"no_service"), False, None),
        (Reply(400, b"invalid_payload"), False, None),
        (Reply(429, b"rate_limited", {"Retry-After": "7"}), True, 7.0),
        (Reply(503, b"unavailable", {"Retry-After": "Fri, 14 Mar 2025 09:27:23 GMT"}), True, 30.0),
        (Reply(500, b"oops"), True, None),
        (Reply(302, b"", {"Location": "http://elsewhere/"}), False, None),
    ],
)
def test_failures_are_classified_for_retry(
    receiver: Receiver, reply: Reply, retryable: bool, retry_after: float | None
) -> None:
    receiver.reply(reply)
    sender = _sender(receiver, clock=lambda: DECISION_TIME)
    with pytest.raises(DeliveryError) as failure:
        sender.send(make_notification())
    assert failure.value.retryable is retryable
    assert failure.value.retry_after == retry_after
    assert failure.value.status == reply.status
    assert str(failure.value).startswith("slack webhook (env SLACK_WEBHOOK_URL): HTTP ")
    assert "slack-token-123" not in str(failure.value)
