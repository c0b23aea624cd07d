"""Discord: one message with an embed per decision, posted to a channel webhook.

Discord's Execute Webhook (https://discord.com/developers/docs/resources/webhook#execute-webhook)
takes ``{"content": ..., "embeds": [...]}``. ``content`` is the headline (≤ 2000 characters); the
embed carries the summary and reasons (description ≤ 4096), one inline field per fact and per check
(≤ 25 fields, names ≤ 256, values ≤ 1024), the decision in the footer, and the dashboard link as the
embed's ``url`` when configured. Discord refuses a message whose embeds hold more than 6000
characters in all, so checks beyond that budget are summarised in one field.
``allowed_mentions: {"parse": []}``: a model or check named ``@everyone`` pings no one. Every text is
escaped (:func:`canary.notify.markdown.inert`): nothing from a policy or from Prometheus — an error
text with a ``[link](...)`` in it — becomes a link; the dashboard's link alone is one.
"""

from __future__ import annotations

from typing import Any

from canary.notify.delivery import DEFAULT_TIMEOUT, Clock, utc_now
from canary.notify.markdown import clip, inert
from canary.notify.message import NO_CONTEXT, CheckVerdict, MessageContext, Notification, story
from canary.notify.posting import JsonMessageSender
from canary.notify.secrets import SecretResolver
from canary.notify.slack import VERDICT_EMOJI, headline
from canary.policy.model import SecretRef

__all__ = ["DiscordSender", "discord_message"]

# Discord's documented limits (Embed Limits); exceeding one makes it answer 400 Invalid Form Body.
_CONTENT_MAX = 2000
_TITLE_MAX = 256
_DESCRIPTION_MAX = 4096
_FIELDS_MAX = 25
_FIELD_NAME_MAX = 256
_FIELD_VALUE_MAX = 1024
_FOOTER_MAX = 2048
_EMBED_TOTAL_MAX = 6000
_WARNING_COLOUR = 0xE01E5A
_INFO_COLOUR = 0x2EB67D


def _clip(text: str, limit: int) -> str:
    """Text as Discord shows it: Markdown escaped, then cut to ``limit``."""
    return clip(inert(text), limit)


def discord_message(notification: Notification, context: MessageContext = NO_CONTEXT) -> dict[str, Any]:
    """The JSON body for a Discord channel webhook."""
    title = _clip(headline(notification, context), _TITLE_MAX)
    lines = [f"**{inert(notification.summary)}**", *(f"• {inert(reason)}" for reason in story(notification))]
    description = clip("\n".join(lines), _DESCRIPTION_MAX)
    when = notification.time.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    footer = _clip(f"policy {notification.policy} · decision {notification.id} · kserve-canary", _FOOTER_MAX)
    fields: list[dict[str, Any]] = []
    if context.cluster:
        fields.append({"name": "Cluster", "value": context.cluster, "inline": True})
    fields.append({"name": "Model", "value": notification.model, "inline": True})
    if notification.traffic:
        fields.append({"name": "Traffic", "value": notification.traffic, "inline": True})
    if notification.canary_revision:
        fields.append({"name": "Canary revision", "value": notification.canary_revision, "inline": True})
        fields.append({"name": "Canary serves", "value": notification.served("canary"), "inline": True})
    if notification.stable_revision:
        fields.append({"name": "Stable revision", "value": notification.stable_revision, "inline": True})
        fields.append({"name": "Stable serves", "value": notification.served("stable"), "inline": True})
    if notification.phase:
        fields.append({"name": "Phase", "value": notification.phase, "inline": True})
    fields = [
        {
            **item,
            "name": _clip(item["name"], _FIELD_NAME_MAX),
            "value": _clip(item["value"], _FIELD_VALUE_MAX),
        }
        for item in fields
    ]
    used = len(title) + len(description) + len(footer) + sum(len(f["name"]) + len(f["value"]) for f in fields)
    reserve = 120  # room for the "… and N more checks" field
    checks = list(notification.checks)
    shown = 0
    for check in checks:
        name = _clip(
            f"{VERDICT_EMOJI[check.verdict]} {check.name}" + (" (critical)" if check.critical else ""),
            _FIELD_NAME_MAX,
        )
        value = _clip(check.describe(), _FIELD_VALUE_MAX)
        if len(fields) >= _FIELDS_MAX - 1 or used + len(name) + len(value) > _EMBED_TOTAL_MAX - reserve:
            break
        fields.append({"name": name, "value": value, "inline": False})
        used += len(name) + len(value)
        shown += 1
    if shown < len(checks):
        rest = checks[shown:]
        failing = sum(1 for check in rest if check.verdict is not CheckVerdict.PASS)
        fields.append(
            {"name": f"… and {len(rest)} more checks", "value": f"{failing} not passing", "inline": False}
        )
    embed: dict[str, Any] = {
        "title": title,
        "description": description,
        "color": _WARNING_COLOUR if notification.severity.value == "warning" else _INFO_COLOUR,
        "fields": fields,
        "footer": {"text": footer},
        "timestamp": when,
    }
    link = context.link(notification)
    if link:
        embed["url"] = link
    content = _clip(headline(notification, context, full=True), _CONTENT_MAX - len(link) - 1)
    return {
        "content": content + (f"\n{link}" if link else ""),
        "embeds": [embed],
        "allowed_mentions": {"parse": []},
    }


class DiscordSender(JsonMessageSender):
    """Posts :func:`discord_message` to the channel webhook URL read from ``webhook_url_from``."""

    def __init__(
        self,
        webhook_url_from: SecretRef,
        *,
        resolver: SecretResolver,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        context: MessageContext = NO_CONTEXT,
    ) -> None:
        super().__init__(
            "discord webhook",
            discord_message,
            webhook_url_from,
            resolver=resolver,
            timeout=timeout,
            clock=clock,
            context=context,
        )
