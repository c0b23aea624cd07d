"""What the Slack and webhook senders share: a URL kept in a secret, posted to through one guarded poster.

The URL is resolved at send time (a rotated secret applies at once) and checked before each POST
(https, no private hosts, unless allowed); every error message is scrubbed of it.
"""

from __future__ import annotations

from canary.notify.delivery import DEFAULT_TIMEOUT, Clock, HttpPoster, utc_now
from canary.notify.secrets import SecretResolver, describe_ref
from canary.policy.model import SecretRef

__all__ = ["SecretUrlSender"]


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
