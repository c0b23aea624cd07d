"""What the chat and webhook senders share: a URL kept in a secret, posted to through one guarded poster.

The URL is resolved at send time (a rotated secret applies at once) and checked before each POST
(https, no private hosts, unless allowed); every error message is scrubbed of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from canary.notify.delivery import DEFAULT_TIMEOUT, USER_AGENT, Clock, HttpPoster, utc_now
from canary.notify.message import NO_CONTEXT, MessageContext, Notification
from canary.notify.secrets import SecretResolver, describe_ref
from canary.policy.model import SecretRef

__all__ = ["JsonMessageSender", "SecretUrlSender"]


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
        body = json.dumps(self._render(notification, self._context), ensure_ascii=False).encode()
        self._post(url, body, {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT})
