"""From a policy's ``notify`` entries (and the controller's API client) to dispatcher destinations.

Build them once per policy (re)load, not per notification: each sender keeps an HTTP session.
Secrets are *not* read here — each sender resolves its references when it sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubernetes.client import ApiClient

from canary.notify.delivery import DEFAULT_TIMEOUT, Clock, TargetKind, utc_now
from canary.notify.discord import DiscordSender
from canary.notify.dispatcher import Destination
from canary.notify.events import KubernetesEventSender
from canary.notify.message import NO_CONTEXT, MessageContext, Severity
from canary.notify.secrets import SecretResolver, describe_ref
from canary.notify.slack import SlackSender
from canary.notify.teams import TeamsSender
from canary.notify.webhook import WebhookSender
from canary.policy.model import NotifyTarget

__all__ = ["EVENTS_KEY", "destination_for", "destination_ref", "destinations_for", "events_destination"]

EVENTS_KEY = "kubernetes events"


def destination_for(
    target: NotifyTarget,
    *,
    resolver: SecretResolver,
    timeout: tuple[float, float] = DEFAULT_TIMEOUT,
    clock: Clock = utc_now,
    ref: str = "",
    context: MessageContext = NO_CONTEXT,
) -> Destination:
    """One policy ``notify`` entry as a destination; its key names the secret *reference*, its
    ``ref`` (``notify[<index>]``) where the policy has it, for the outbox."""
    minimum = Severity(target.min_severity)
    if target.slack is not None:
        slack = target.slack
        key = f"slack {describe_ref(slack.webhook_url_from)}" + (f" {slack.channel}" if slack.channel else "")
        sender = SlackSender(
            slack.webhook_url_from,
            resolver=resolver,
            channel=slack.channel,
            timeout=timeout,
            clock=clock,
            context=context,
        )
        return Destination(key, TargetKind.SLACK, sender, minimum, ref)
    if target.teams is not None:
        teams = TeamsSender(
            target.teams.webhook_url_from, resolver=resolver, timeout=timeout, clock=clock, context=context
        )
        key = f"teams {describe_ref(target.teams.webhook_url_from)}"
        return Destination(key, TargetKind.TEAMS, teams, minimum, ref)
    if target.discord is not None:
        discord = DiscordSender(
            target.discord.webhook_url_from, resolver=resolver, timeout=timeout, clock=clock, context=context
        )
        key = f"discord {describe_ref(target.discord.webhook_url_from)}"
        return Destination(key, TargetKind.DISCORD, discord, minimum, ref)
    webhook = target.webhook
    assert webhook is not None  # NotifyTarget guarantees exactly one kind per entry
    key = f"webhook {describe_ref(webhook.url_from)}"
    if webhook.secret_from is not None:
        key += f" signed with {describe_ref(webhook.secret_from)}"
    sender_ = WebhookSender(
        webhook.url_from,
        resolver=resolver,
        secret_from=webhook.secret_from,
        timeout=timeout,
        clock=clock,
        context=context,
    )
    return Destination(key, TargetKind.WEBHOOK, sender_, minimum, ref)


def destinations_for(
    targets: Sequence[NotifyTarget],
    *,
    resolver: SecretResolver,
    timeout: tuple[float, float] = DEFAULT_TIMEOUT,
    clock: Clock = utc_now,
    context: MessageContext = NO_CONTEXT,
) -> list[Destination]:
    return [
        destination_for(
            target,
            resolver=resolver,
            timeout=timeout,
            clock=clock,
            ref=destination_ref(index),
            context=context,
        )
        for index, target in enumerate(targets)
    ]


def destination_ref(index: int) -> str:
    """How an outbox entry names its destination: the policy's ``notify`` entry number."""
    return f"notify[{index}]"


def events_destination(
    api_client: ApiClient,
    *,
    resolver: SecretResolver,
    clock: Clock = utc_now,
    context: MessageContext = NO_CONTEXT,
) -> Destination:
    """Kubernetes Events on the InferenceService, for every decision (info and warning)."""
    sender = KubernetesEventSender(api_client, redactor=resolver.redactor, clock=clock, context=context)
    return Destination(EVENTS_KEY, TargetKind.KUBERNETES_EVENT, sender, Severity.INFO)
