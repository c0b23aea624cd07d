"""Where notifications may go: checked before every delivery, so a policy cannot point the controller at
itself, the node or the cloud's metadata service (SSRF).

:class:`UrlGuard` accepts a URL only if

* its scheme is ``https`` (``http`` only for a host on the allow-list);
* its host does not resolve to a loopback, link-local (169.254.0.0/16 with the cloud metadata
  service, fe80::/10), private, unique-local, shared (100.64/10), multicast, reserved or unspecified
  address — unless the host is on the allow-list (``--notify-allow-host HOST``; the sandbox's loopback
  receiver is ``127.0.0.1``).

Every address the name resolves to is checked (a name with one public and one private address is
refused). The check runs at send time, right before the request; a DNS answer that changes between
the check and the connection (rebinding) is not covered — keep receivers on names you control.

:func:`origin` renders a URL as ``scheme://host``: the only part of a secret URL that messages show.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["UnsafeUrl", "UrlGuard", "origin"]

_HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]]{1,255}$")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")

Resolve = Callable[[str, int], list[str]]


def _getaddrinfo(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


class UnsafeUrl(Exception):
    """The URL may not be used. The message never contains the URL (only ``scheme://host``)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def origin(url: str) -> str:
    """``https://hooks.slack.com`` for any URL; ``<invalid URL>`` when there is no sensible host."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return "<invalid URL>"
    scheme = parts.scheme.lower()
    if scheme not in {"http", "https"} or not host or not _HOST.match(host):
        return "<invalid URL>"
    return f"{scheme}://{host}"


def _forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata)"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_private or address in ipaddress.ip_network("100.64.0.0/10"):
        return "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


@dataclass(frozen=True)
class UrlGuard:
    allow_hosts: frozenset[str] = field(default_factory=frozenset)
    resolve: Resolve = _getaddrinfo

    @classmethod
    def allowing(cls, hosts: Iterable[str], resolve: Resolve = _getaddrinfo) -> UrlGuard:
        allowed: set[str] = set()
        for value in hosts:
            allowed.update(host.strip().strip("[]").lower() for host in value.split(",") if host.strip())
        return cls(frozenset(allowed), resolve)

    def check(self, url: str) -> None:
        """Raise :class:`UnsafeUrl` unless a notification may be POSTed to ``url``."""
        shown = origin(url)
        if _CONTROL.search(url.strip()):
            raise UnsafeUrl("the URL contains spaces or control characters")
        try:
            parts = urlsplit(url.strip())
            host = (parts.hostname or "").lower()
            port = parts.port
        except ValueError:
            raise UnsafeUrl("the URL cannot be parsed") from None
        scheme = parts.scheme.lower()
        if scheme not in {"http", "https"}:
            raise UnsafeUrl("only https URLs are allowed")
        if not host or shown == "<invalid URL>":
            raise UnsafeUrl("the URL has no valid host")
        allowed = host in self.allow_hosts
        if scheme == "http" and not allowed:
            raise UnsafeUrl(f"{shown}: http is allowed only for hosts on --notify-allow-host; use https")
        if allowed:
            return
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                addresses = [
                    ipaddress.ip_address(a.split("%")[0])
                    for a in self.resolve(host, port or (443 if scheme == "https" else 80))
                ]
            except (OSError, UnicodeError, ValueError):
                raise UnsafeUrl(f"{shown}: the host name does not resolve", retryable=True) from None
        if not addresses:
            raise UnsafeUrl(f"{shown}: the host name does not resolve", retryable=True)
        for address in addresses:
            kind = _forbidden(address)
            if kind is not None:
                raise UnsafeUrl(
                    f"{shown} resolves to a {kind} address ({address}): refused unless the operator "
                    "allows the host with --notify-allow-host"
                )
