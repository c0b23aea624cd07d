"""Slack incoming webhooks: one Block Kit message per decision, with every number behind it.

Layout (https://api.slack.com/reference/block-kit/blocks):

* ``header`` — action emoji, model and what happened: ``⏩ llama-chat: canary advanced``;
* ``section`` — the summary sentence and the reasons as bullets;
* ``section`` fields — model, traffic (``10% → 30%``), canary and stable revisions, phase;
* ``section`` fields, 10 per block — one per check: ``✅ *p99*`` / ``612ms ≤ 800ms (stable 540ms)``;
* ``actions`` — a button to the rollout's dashboard page, when ``--dashboard-url`` is set;
* ``context`` — policy, decision id and time.

With ``--cluster-name`` the header and the fields name the cluster.

A plain ``text`` fallback carries the same facts for push notifications and for Slack-compatible
receivers (Mattermost, Rocket.Chat) that ignore blocks. ``channel`` overrides the webhook's channel
where Slack still honours it (legacy webhooks); app webhooks post to their configured channel.
"""

from __future__ import annotations

import json
from typing import Any

from canary.notify.delivery import DEFAULT_TIMEOUT, USER_AGENT, Clock, utc_now
from canary.notify.message import (
    NO_CONTEXT,
    CheckLine,
    CheckVerdict,
    MessageContext,
    Notification,
    NotificationAction,
    story,
)
from canary.notify.posting import SecretUrlSender
from canary.notify.secrets import SecretResolver
from canary.policy.model import SecretRef

__all__ = ["ACTION_EMOJI", "VERDICT_EMOJI", "SlackSender", "check_text", "headline", "slack_message"]

ACTION_EMOJI: dict[NotificationAction, str] = {
    NotificationAction.STARTED: "🚦",
    NotificationAction.ADVANCED: "⏩",
    NotificationAction.PROMOTED: "🚀",
    NotificationAction.SUCCEEDED: "✅",
    NotificationAction.ROLLED_BACK: "⏪",
    NotificationAction.PAUSED: "⏸️",
    NotificationAction.RESUMED: "▶️",
    NotificationAction.APPROVED: "👍",
    NotificationAction.ABORTED: "🛑",
    NotificationAction.INCONCLUSIVE: "❔",
    NotificationAction.WAITING: "⏳",
    NotificationAction.UNGUARDED_ROLLOUT: "⚠️",
    NotificationAction.PROMETHEUS_UNAVAILABLE: "📉",
    NotificationAction.NOTIFICATION_FAILED: "📭",
    NotificationAction.GATE_WAITING: "🚧",
    NotificationAction.GATE_FAILED: "⛔",
}

VERDICT_EMOJI: dict[CheckVerdict, str] = {
    CheckVerdict.PASS: "✅",
    CheckVerdict.FAIL: "❌",
    CheckVerdict.NOT_YET: "⏳",
    CheckVerdict.NO_DATA: "⚪",
    CheckVerdict.ERROR: "⚠️",
}

# Block Kit limits; exceeding them makes Slack reject the whole message with invalid_blocks.
_HEADER_MAX = 150
_SECTION_TEXT_MAX = 3000
_FIELD_TEXT_MAX = 2000
_FIELDS_PER_SECTION = 10
_MAX_CHECK_SECTIONS = 4  # 40 checks; the rest are summarised in one line
_FALLBACK_MAX = 3900  # Slack truncates long `text`; keep the start meaningful


def _escape(text: str) -> str:
    """Slack mrkdwn control characters (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_text(check: CheckLine) -> str:
    """``p99: 612ms ≤ 800ms (stable 540ms) ✅`` — one check on one line."""
    critical = " (critical)" if check.critical else ""
    return f"{check.name}{critical}: {check.describe()} {VERDICT_EMOJI[check.verdict]}"


def _check_field(check: CheckLine) -> dict[str, str]:
    critical = " _(critical)_" if check.critical else ""
    text = f"{VERDICT_EMOJI[check.verdict]} *{_escape(check.name)}*{critical}\n{_escape(check.describe())}"
    return {"type": "mrkdwn", "text": _clip(text, _FIELD_TEXT_MAX)}


def headline(notification: Notification, context: MessageContext = NO_CONTEXT, *, full: bool = False) -> str:
    """``⏩ [prod-eu] llama-chat: canary advanced 10% → 30%`` — the first line of every chat message;
    ``full`` names the model with its namespace (``ml/llama-chat``)."""
    emoji = ACTION_EMOJI.get(notification.action, "")
    cluster = f"[{context.cluster}] " if context.cluster else ""
    traffic = f" {notification.traffic}" if notification.traffic else ""
    name = notification.model if full else notification.inference_service
    return f"{emoji} {cluster}{name}: {notification.title}{traffic}"


def _fallback_text(notification: Notification, context: MessageContext) -> str:
    lines = [f"{headline(notification, context, full=True)}. {notification.summary}"]
    lines += [f"• {reason}" for reason in story(notification)]
    lines += [check_text(check) for check in notification.checks]
    text = _clip(_escape("\n".join(lines)), _FALLBACK_MAX - 200)
    link = context.link(notification)
    return text + (f"\n<{link}|Open in the dashboard>" if link else "")


def slack_message(
    notification: Notification, channel: str | None = None, context: MessageContext = NO_CONTEXT
) -> dict[str, Any]:
    """The JSON body for a Slack incoming webhook."""
    header = headline(notification, context)
    lines = [f"*{_escape(notification.summary)}*"] + [
        f"• {_escape(reason)}" for reason in story(notification)
    ]
    facts = [{"type": "mrkdwn", "text": fact} for fact in _facts(notification, context)]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(header, _HEADER_MAX), "emoji": True}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _clip("\n".join(lines), _SECTION_TEXT_MAX)}},
        {"type": "section", "fields": facts},
        *_check_blocks(notification),
        *_link_blocks(context.link(notification)),
        _footer(notification),
    ]  # fmt: skip
    message: dict[str, Any] = {"text": _fallback_text(notification, context), "blocks": blocks}
    if channel:
        message["channel"] = channel
    return _verbatim(message)


def _facts(notification: Notification, context: MessageContext) -> list[str]:
    facts = []
    if context.cluster:
        facts.append(f"*Cluster*\n`{_escape(context.cluster)}`")
    facts.append(f"*Model*\n`{_escape(notification.model)}`")
    if notification.traffic:
        facts.append(f"*Traffic*\n{_escape(notification.traffic)}")
    if notification.canary_revision:
        facts.append(f"*Canary revision*\n`{_escape(notification.canary_revision)}`")
        facts.append(f"*Canary serves*\n`{_escape(notification.served('canary'))}`")
    if notification.stable_revision:
        facts.append(f"*Stable revision*\n`{_escape(notification.stable_revision)}`")
        facts.append(f"*Stable serves*\n`{_escape(notification.served('stable'))}`")
    if notification.phase:
        facts.append(f"*Phase*\n{_escape(notification.phase)}")
    return facts


def _check_blocks(notification: Notification) -> list[dict[str, Any]]:
    checks = list(notification.checks)
    shown = checks[: _FIELDS_PER_SECTION * _MAX_CHECK_SECTIONS]
    blocks: list[dict[str, Any]] = [{"type": "divider"}] if shown else []
    for start in range(0, len(shown), _FIELDS_PER_SECTION):
        chunk = shown[start : start + _FIELDS_PER_SECTION]
        blocks.append({"type": "section", "fields": [_check_field(check) for check in chunk]})
    if len(checks) > len(shown):
        rest = checks[len(shown) :]
        failing = sum(1 for check in rest if check.verdict is not CheckVerdict.PASS)
        more = (
            f"… and {len(rest)} more checks ({failing} not passing); see the webhook or "
            "`kserve-canary explain` for all of them"
        )
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": more}})
    return blocks


def _link_blocks(link: str) -> list[dict[str, Any]]:
    if not link:
        return []
    button = {"type": "button", "text": {"type": "plain_text", "text": "Open in the dashboard"}, "url": link}
    return [{"type": "actions", "elements": [button]}]


def _footer(notification: Notification) -> dict[str, Any]:
    when = notification.time.strftime("%Y-%m-%d %H:%M:%S UTC")
    text = (
        f"policy `{_escape(notification.policy)}` · decision `{_escape(notification.id)}` · {when} · "
        "kserve-canary"
    )
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def _verbatim(message: dict[str, Any]) -> dict[str, Any]:
    """Every mrkdwn text of the blocks marked ``verbatim``: Slack then links no bare URL, channel name
    or mention in it (what an error text may carry), and still reads *bold* and our own ``<url|text>``
    (https://docs.slack.dev/reference/block-kit/composition-objects/text-object)."""
    for block in message["blocks"]:
        texts = [block.get("text"), *block.get("fields", ()), *block.get("elements", ())]
        for text in texts:
            if isinstance(text, dict) and text.get("type") == "mrkdwn":
                text["verbatim"] = True
    return message


class SlackSender(SecretUrlSender):
    """Posts :func:`slack_message` to the incoming-webhook URL read from ``webhook_url_from``."""

    def __init__(
        self,
        webhook_url_from: SecretRef,
        *,
        resolver: SecretResolver,
        channel: str | None = None,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        context: MessageContext = NO_CONTEXT,
    ) -> None:
        super().__init__("slack webhook", webhook_url_from, resolver=resolver, timeout=timeout, clock=clock)
        self._channel = channel
        self._context = context

    def send(self, notification: Notification) -> None:
        url = self._url()
        body = json.dumps(
            slack_message(self._scrubbed(notification), self._channel, self._context), ensure_ascii=False
        ).encode()
        self._post(url, body, {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT})
