"""Microsoft Teams: one Adaptive Card per decision, posted to a Workflows (Power Automate) webhook.

Teams' Workflows webhooks ("Post to a channel when a webhook request is received") take a message
with one Adaptive Card attachment (https://learn.microsoft.com/microsoftteams/platform/
webhooks-and-connectors/how-to/add-incoming-webhook, "Send Adaptive Cards using an Incoming Webhook")::

    {"type": "message",
     "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "content": {<card>}}]}

The card: the headline (bold), the summary and the reasons, a fact set (cluster, model, traffic,
revisions, phase), a fact set of checks (``✅ p99`` / ``612ms ≤ 800ms (stable 540ms)``), a subtle
context line, and an ``Action.OpenUrl`` to the dashboard when one is configured. Adaptive Card text
is a subset of Markdown: every text is escaped (:func:`canary.notify.markdown.inert`), so nothing
from a policy or from Prometheus — an error text with a ``[link](...)`` in it — becomes a link.
Office 365 connectors (``MessageCard``) are retired by Microsoft; this format works with Workflows.
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

__all__ = ["ADAPTIVE_CARD_CONTENT_TYPE", "TeamsSender", "teams_message"]

ADAPTIVE_CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
# Adaptive Card 1.4 is what Teams renders on every client (desktop, web, mobile).
_CARD_VERSION = "1.4"
# Teams refuses messages over about 28 KB; 40 checks with their lines stay far below it.
_MAX_CHECKS = 40
_TEXT_MAX = 2000


def _shown(text: str) -> str:
    """Text as the card shows it: Markdown escaped, then cut to Teams' length."""
    return clip(inert(text), _TEXT_MAX)


def _text(text: str, **style: Any) -> dict[str, Any]:
    return {"type": "TextBlock", "text": _shown(text), "wrap": True, **style}


def _fact(title: str, value: str) -> dict[str, str]:
    return {"title": _shown(title), "value": _shown(value)}


def teams_message(notification: Notification, context: MessageContext = NO_CONTEXT) -> dict[str, Any]:
    """The JSON body for a Teams Workflows webhook: a message with one Adaptive Card."""
    warning = notification.severity.value == "warning"
    body: list[dict[str, Any]] = [
        _text(
            headline(notification, context),
            weight="Bolder",
            size="Medium",
            color="Attention" if warning else "Default",
        ),
        _text(notification.summary),
    ]
    body += [_text(f"• {reason}", spacing="None") for reason in story(notification)]
    facts = []
    if context.cluster:
        facts.append(_fact("Cluster", context.cluster))
    facts.append(_fact("Model", notification.model))
    if notification.traffic:
        facts.append(_fact("Traffic", notification.traffic))
    if notification.canary_revision:
        facts.append(_fact("Canary revision", notification.canary_revision))
        facts.append(_fact("Canary serves", notification.served("canary")))
    if notification.stable_revision:
        facts.append(_fact("Stable revision", notification.stable_revision))
        facts.append(_fact("Stable serves", notification.served("stable")))
    if notification.phase:
        facts.append(_fact("Phase", notification.phase))
    body.append({"type": "FactSet", "facts": facts})

    checks = list(notification.checks)
    shown = checks[:_MAX_CHECKS]
    if shown:
        body.append(
            {
                "type": "FactSet",
                "separator": True,
                "facts": [
                    _fact(
                        f"{VERDICT_EMOJI[check.verdict]} {check.name}"
                        + (" (critical)" if check.critical else ""),
                        check.describe(),
                    )
                    for check in shown
                ],
            }
        )
    if len(checks) > len(shown):
        rest = checks[len(shown) :]
        failing = sum(1 for check in rest if check.verdict is not CheckVerdict.PASS)
        body.append(_text(f"… and {len(rest)} more checks ({failing} not passing)", isSubtle=True))
    when = notification.time.strftime("%Y-%m-%d %H:%M:%S UTC")
    body.append(
        _text(
            f"policy {notification.policy} · decision {notification.id} · {when} · kserve-canary",
            size="Small",
            isSubtle=True,
        )
    )
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": _CARD_VERSION,
        "body": body,
        # Teams shows the card at its full width only when asked to.
        "msteams": {"width": "Full"},
    }
    link = context.link(notification)
    if link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Open in the dashboard", "url": link}]
    return {
        "type": "message",
        "attachments": [{"contentType": ADAPTIVE_CARD_CONTENT_TYPE, "contentUrl": None, "content": card}],
    }


class TeamsSender(JsonMessageSender):
    """Posts :func:`teams_message` to the Workflows webhook URL read from ``webhook_url_from``."""

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
            "teams webhook",
            teams_message,
            webhook_url_from,
            resolver=resolver,
            timeout=timeout,
            clock=clock,
            context=context,
        )
