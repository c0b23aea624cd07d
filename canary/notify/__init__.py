"""Telling people about every decision: Slack, Teams, Discord, generic webhooks and Kubernetes Events.

The controller maps each decision of the core into a :class:`Notification` (with the numbers
behind it) and hands it to a :class:`NotificationDispatcher`, which delivers it in the background —
retried, de-duplicated, never blocking or failing a rollout, and never logging a secret.
See ``docs/notifications.md``.
"""

from canary.notify.delivery import DeliveryError, Sender, TargetKind
from canary.notify.destinations import destination_for, destinations_for, events_destination
from canary.notify.discord import DiscordSender, discord_message
from canary.notify.dispatcher import Destination, NotificationDispatcher, RetryPolicy, Submission
from canary.notify.events import KubernetesEventSender, event_message
from canary.notify.message import (
    NOTIFICATION_API_VERSION,
    CheckLine,
    CheckVerdict,
    MessageContext,
    Notification,
)
from canary.notify.metrics import DeliveryRecorder, Loss, Outcome, PrometheusDeliveryRecorder
from canary.notify.outbox import Outbox, OutboxEntry, OutboxStore, RetryHorizon
from canary.notify.secrets import (
    DEFAULT_REDACTOR,
    Redactor,
    SecretResolver,
    SecretUnavailable,
    redact_processor,
)
from canary.notify.slack import SlackSender, slack_message
from canary.notify.teams import TeamsSender, teams_message
from canary.notify.webhook import WebhookSender, sign, verify_signature, webhook_payload
from canary.rollout.vocabulary import EventReason, NotificationAction, Severity

__all__ = [
    "DEFAULT_REDACTOR",
    "NOTIFICATION_API_VERSION",
    "CheckLine",
    "CheckVerdict",
    "DeliveryError",
    "DeliveryRecorder",
    "Destination",
    "DiscordSender",
    "EventReason",
    "KubernetesEventSender",
    "Loss",
    "MessageContext",
    "Notification",
    "NotificationAction",
    "NotificationDispatcher",
    "Outbox",
    "OutboxEntry",
    "OutboxStore",
    "Outcome",
    "PrometheusDeliveryRecorder",
    "Redactor",
    "RetryHorizon",
    "RetryPolicy",
    "SecretResolver",
    "SecretUnavailable",
    "Sender",
    "Severity",
    "SlackSender",
    "Submission",
    "TargetKind",
    "TeamsSender",
    "WebhookSender",
    "destination_for",
    "destinations_for",
    "discord_message",
    "event_message",
    "events_destination",
    "redact_processor",
    "sign",
    "slack_message",
    "teams_message",
    "verify_signature",
    "webhook_payload",
]
