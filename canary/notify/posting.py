"""What the chat and webhook senders share: a URL kept in a secret, posted to through one guarded poster.

The URL is resolved at send time (a rotated secret applies at once) and checked before each POST
(https, no private hosts, unless allowed); every error message is scrubbed of it.

What a body says is scrubbed too, before it is rendered (:func:`scrubbed`): every text of the
notification, with the secret values of the notification's namespace only (and the credential
patterns), as its Events are. Before rendering, because rendering changes the text a value would be
found in (Slack's ``&amp;``, Markdown's backslashes) and cuts it to the service's limits (half a value
would stay in sight).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from canary.notify.delivery import DEFAULT_TIMEOUT, USER_AGENT, Clock, HttpPoster, utc_now
from canary.notify.message import NO_CONTEXT, MessageContext, Notification
from canary.notify.secrets import Redactor, SecretResolver, describe_ref
from canary.policy.model import SecretRef

__all__ = ["JsonMessageSender", "SecretUrlSender", "scrubbed"]

# Fields that identify, rather than tell: receivers key on them (the idempotency key, the Event reason,
# the payload version), and none is built from text a secret could be in.
_IDENTIFIERS = frozenset({"id", "reason", "schema_version"})

_Value = TypeVar("_Value")


def scrubbed(notification: Notification, redactor: Redactor) -> Notification:
    """``notification`` with every text scrubbed with its namespace's secret values only."""
    return _scrub(notification, redactor.for_namespace(notification.namespace).scrub)


def _scrub(value: _Value, scrub: Callable[[str], str]) -> _Value:
    """Every string inside ``value`` (dataclasses, tuples) scrubbed; enums and other values kept."""
    if isinstance(value, Enum):
        return value
    if isinstance(value, str):
        return scrub(value)  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(_scrub(item, scrub) for item in value)  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            item.name: _scrub(getattr(value, item.name), scrub)
            for item in dataclasses.fields(value)
            if item.init and item.name not in _IDENTIFIERS
        }
        changed = {name: new for name, new in changes.items() if new != getattr(value, name)}
        return dataclasses.replace(value, **changed) if changed else value
    return value


class SecretUrlSender:
    """The base of senders that POST to the URL read from ``url_from``; ``what`` names the kind."""

    def __init__(
        self,
        what: str,
        url_from: SecretRef,
        *,
        resolver: SecretResolver,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
    ) -> None:
        self._url_from = url_from
        self._resolver = resolver
        self._clock = clock
        self.description = f"{what} ({describe_ref(url_from)})"
        self._poster = HttpPoster(
            describe=self.description,
            redactor=resolver.redactor,
            timeout=timeout,
            clock=clock,
            guard=resolver.url_guard,  # the URL is checked before each POST (https, no private hosts)
        )

    def _url(self) -> str:
        return self._resolver.resolve(self._url_from)  # at send time: rotated secrets apply at once

    def _scrubbed(self, notification: Notification) -> Notification:
        """What the body may say: call after :meth:`_url`, so this send's own URL is known."""
        return scrubbed(notification, self._resolver.redactor)

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        self._poster.post(url, body, headers)


class JsonMessageSender(SecretUrlSender):
    """Posts ``render(notification, context)`` as JSON to the webhook URL read from
    ``webhook_url_from`` (the chat services that take one JSON document: Teams, Discord)."""

    def __init__(
        self,
        what: str,
        render: Callable[[Notification, MessageContext], dict[str, Any]],
        webhook_url_from: SecretRef,
        *,
        resolver: SecretResolver,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        context: MessageContext = NO_CONTEXT,
    ) -> None:
        super().__init__(what, webhook_url_from, resolver=resolver, timeout=timeout, clock=clock)
        self._render = render
        self._context = context

    def send(self, notification: Notification) -> None:
        url = self._url()
        message = self._render(self._scrubbed(notification), self._context)
        body = json.dumps(message, ensure_ascii=False).encode()
        self._post(url, body, {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT})
