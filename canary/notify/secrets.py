"""Secrets for notification targets: resolved at send time, and kept out of every log line and event.

A Slack incoming-webhook URL *is* a credential (anyone holding it can post to the channel), and so
are webhook URLs with tokens in their path or query, and HMAC keys. The policy file only names
where they come from (:class:`~canary.policy.model.SecretRef`: an environment variable or a
mounted file); :class:`SecretResolver` reads them when a notification is sent — never at import
or load time, so a rotated Secret is picked up without a restart — and registers every value it
reads with a :class:`Redactor`.

What a policy may reference is scoped to its namespace (:class:`~canary.policy.scope.SecretScope`):
the controller's resolver is :meth:`SecretResolver.scoped` to the policy's namespace, so ``file:``
resolves inside ``<secret file root>/<namespace>/`` and ``env:`` only names the operator allowed for
that namespace. A file is read only if it is a regular file of at most 64 KiB, opened without
blocking (a FIFO or ``/dev/zero`` is refused, not read). The resolver also carries the
:class:`~canary.notify.urls.UrlGuard` the senders check URLs with.

The :class:`Redactor` scrubs, from any string:

* every secret value it has seen, and the forms in which HTTP libraries repeat a URL in their
  errors (``Max retries exceeded with url: /services/T0/B0/XXXX`` carries only the path, so the
  path and path+query of a secret URL are secrets too), raw and percent-encoded;
* things that look like credentials even when they were never registered: URL userinfo
  (``https://user:pass@host``), token-like query parameters (``?token=...``), Slack webhook paths
  and ``Bearer`` tokens.

Errors about secrets name the reference (``env SLACK_WEBHOOK_URL``), never the value.

A policy read from a PromotionPolicy *object* is written by whoever may create one in its namespace,
so its references reach neither the controller's environment nor its files: the resolver
:meth:`SecretResolver.from_namespace_secret` reads ``{env: KEY}`` as key ``KEY`` of one Secret in the
object's own namespace, through the API (a :data:`SecretReader` the controller passes), at send time.

:func:`redact_processor` is a structlog processor over the process-wide :data:`DEFAULT_REDACTOR`;
put it anywhere before the renderer (it renders ``exc_info`` itself so tracebacks are scrubbed too).
The dispatcher also scrubs its own messages, so a missing processor does not leak.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import structlog

from canary.notify.urls import UrlGuard
from canary.policy.model import SecretRef
from canary.policy.scope import MAX_SECRET_FILE_BYTES, ScopeError, SecretScope

__all__ = [
    "DEFAULT_REDACTOR",
    "MASK",
    "Redactor",
    "SecretReader",
    "SecretResolver",
    "SecretUnavailable",
    "describe_ref",
    "make_redact_processor",
    "redact_processor",
]

MASK = "***"

# Shorter values are not registered: redacting every "ab" in every log line would make logs
# unreadable, and a two-character secret protects nothing anyway. Such a secret is refused.
MIN_SECRET_LENGTH = 4

# Path fragments shorter than this are not treated as secret on their own ("/", "/hook"): they are
# too common in ordinary log lines. The full URL is always registered.
_MIN_SECRET_PATH_LENGTH = 8

# Credentials that look like credentials, whether or not they were registered.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # https://user:password@host -> https://***@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@"), rf"\g<1>{MASK}@"),
    # Slack (and Slack-compatible) webhook paths: the path is the credential.
    (
        re.compile(r"(?i)(hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s\"'<>)]+"),
        rf"\g<1>{MASK}",
    ),
    # Discord webhooks: /api/webhooks/<id>/<token>; the token is the credential.
    (
        re.compile(r"(?i)((?:discord|discordapp)\.com/api/(?:v\d+/)?webhooks/)[^\s\"'<>)]+"),
        rf"\g<1>{MASK}",
    ),
    # Teams: Office 365 connector webhooks (webhook.office.com/webhookb2/...) and Workflows URLs
    # (.../workflows/<id>/triggers/...; their ?sig= is masked below as well).
    (
        re.compile(r"(?i)(\.webhook\.office\.com/webhookb2/|/workflows/)[^\s\"'<>)?]+"),
        rf"\g<1>{MASK}",
    ),
    # ?token=... &api_key=... &sig=...
    (
        re.compile(
            r"(?i)([?&](?:access_token|token|api[_-]?key|key|secret|signature|sig|password|passwd|pwd|auth)=)"
            r"[^&\s\"'<>#]+"
        ),
        rf"\g<1>{MASK}",
    ),
    # Authorization: Bearer xyz
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*"), rf"\g<1>{MASK}"),
)


# (namespace, Secret name) -> the Secret's data, decoded (None: no such Secret). Raises for API errors.
SecretReader = Callable[[str, str], "Mapping[str, str] | None"]


class SecretUnavailable(Exception):
    """A secret could not be read. The message names the reference, never a value."""


def describe_ref(ref: SecretRef) -> str:
    """``env SLACK_WEBHOOK_URL`` or ``file /var/run/secrets/slack/url``: safe to log."""
    if ref.env is not None:
        return f"env {ref.env}"
    return f"file {ref.file}"


class Redactor:
    """Knows every secret value resolved so far and scrubs them from any text. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, secret: str) -> None:
        """Register a secret value (and, for URLs, the fragments HTTP errors repeat)."""
        variants = _variants(secret)
        with self._lock:
            before = len(self._secrets)
            self._secrets.update(variants)
            if len(self._secrets) != before:
                # Longest first: a URL must be masked whole before its path is masked inside it.
                ordered = sorted(self._secrets, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(value) for value in ordered))

    def __contains__(self, secret: str) -> bool:
        with self._lock:
            return secret in self._secrets

    def scrub(self, text: str) -> str:
        """``text`` with every known secret and every credential-looking fragment masked."""
        pattern = self._pattern  # an atomic read; replaced (never mutated) under the lock
        if pattern is not None:
            text = pattern.sub(MASK, text)
        for credential, replacement in _PATTERNS:
            text = credential.sub(replacement, text)
        return text

    def scrub_value(self, value: object) -> object:
        """Scrub strings inside containers; other objects are replaced by their scrubbed text if
        their text would reveal a secret (an exception, a request object), else kept as they are."""
        if isinstance(value, str):
            return self.scrub(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, Mapping):
            return {key: self.scrub_value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.scrub_value(item) for item in value]
        if isinstance(value, tuple | set | frozenset):
            return tuple(self.scrub_value(item) for item in value)
        text = str(value)
        scrubbed = self.scrub(text)
        return scrubbed if scrubbed != text else value


def _variants(secret: str) -> set[str]:
    variants = {secret, quote(secret, safe=""), quote(secret, safe="/:")}
    parts = urlsplit(secret)
    if parts.scheme and parts.netloc:
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        for fragment in (parts.path, tail, parts.query):
            if len(fragment) >= _MIN_SECRET_PATH_LENGTH:
                variants.update({fragment, quote(fragment, safe="/?&="), quote(fragment, safe="")})
        if parts.password:
            variants.add(parts.password)
        if parts.username and len(parts.username) >= MIN_SECRET_LENGTH:
            variants.add(parts.username)
    return {variant for variant in variants if len(variant) >= MIN_SECRET_LENGTH}


DEFAULT_REDACTOR = Redactor()


class SecretResolver:
    """Reads :class:`SecretRef` values when they are needed and registers them for redaction.

    With a ``scope`` (the controller always has one), references are checked against it for the
    resolver's ``namespace`` (see :meth:`scoped`); without one (tests, embedding) any ``env``/``file``
    is read — still only regular files of at most 64 KiB, never blocking.
    """

    def __init__(
        self,
        redactor: Redactor | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        scope: SecretScope | None = None,
        namespace: str | None = None,
        url_guard: UrlGuard | None = None,
    ) -> None:
        self.redactor = redactor if redactor is not None else DEFAULT_REDACTOR
        # Read os.environ at resolve time (not a copy taken now) unless a mapping is injected.
        self._environ = environ
        self.scope = scope
        self.namespace = namespace
        self.url_guard = url_guard  # what senders check a URL with before posting (None: unchecked)
        # (reader, Secret name): references are keys of that Secret in ``namespace``, read through
        # the API, and nothing else (see from_namespace_secret).
        self._secret: tuple[SecretReader, str] | None = None

    def scoped(self, namespace: str) -> SecretResolver:
        """The same resolver for the policies of ``namespace`` (same redactor, scope and guard)."""
        return SecretResolver(
            self.redactor, self._environ, scope=self.scope, namespace=namespace, url_guard=self.url_guard
        )

    def from_namespace_secret(self, namespace: str, reader: SecretReader, secret_name: str) -> SecretResolver:
        """A resolver for a PromotionPolicy object of ``namespace``: ``{env: KEY}`` is key ``KEY`` of
        the Secret ``secret_name`` in that namespace; ``file:`` is refused; the controller's
        environment and files are never read (same redactor and URL guard)."""
        resolver = SecretResolver(
            self.redactor, {}, scope=None, namespace=namespace, url_guard=self.url_guard
        )
        resolver._secret = (reader, secret_name)
        return resolver

    def _from_secret(self, ref: SecretRef, reader: SecretReader, secret_name: str) -> tuple[str, str]:
        """(where, raw value) of a reference of a PromotionPolicy object."""
        namespace = self.namespace or ""
        if ref.env is None:
            raise SecretUnavailable(
                f"{describe_ref(ref)} refused: a PromotionPolicy object names keys of the Secret "
                f"{namespace}/{secret_name}, not files"
            )
        where = f"key {ref.env} of Secret {namespace}/{secret_name}"
        try:
            data = reader(namespace, secret_name)
        except Exception as error:
            # The API error names the Secret and the status, never a value.
            raise SecretUnavailable(
                f"{where} cannot be read: {self.redactor.scrub(str(error))[:200]}"
            ) from None
        if data is None:
            raise SecretUnavailable(f"{where}: there is no Secret {secret_name} in namespace {namespace}")
        raw = data.get(ref.env)
        if raw is None:
            raise SecretUnavailable(f"{where} is not set")
        return where, raw

    def resolve(self, ref: SecretRef) -> str:
        where = describe_ref(ref)
        if self._secret is not None:
            where, raw = self._from_secret(ref, *self._secret)
        elif ref.env is not None:
            self._check_env(ref.env, where)
            environ = self._environ if self._environ is not None else os.environ
            found = environ.get(ref.env)
            if found is None:
                raise SecretUnavailable(f"{where} is not set")
            raw = found
        else:
            assert ref.file is not None  # SecretRef guarantees exactly one of env/file
            raw = _read_secret_file(self._file_path(ref.file, where), where, strict=self.scope is not None)
        # Mounted Secrets and `echo` into env files end with a newline that is not part of the value.
        value = raw.strip()
        if not value:
            raise SecretUnavailable(f"{where} is empty")
        if len(value) < MIN_SECRET_LENGTH:
            raise SecretUnavailable(
                f"{where} is shorter than {MIN_SECRET_LENGTH} characters and cannot be kept out of logs"
            )
        self.redactor.add(value)
        return value

    def _check_env(self, name: str, where: str) -> None:
        if self.scope is None:
            return
        if self.namespace is None:
            raise SecretUnavailable(f"{where}: no namespace to check the reference against")
        try:
            self.scope.check_env(name, self.namespace)
        except ScopeError as error:
            raise SecretUnavailable(f"{where} refused: {error}") from None

    def _file_path(self, name: str, where: str) -> Path:
        if self.scope is None:
            return Path(name)
        if self.namespace is None:
            raise SecretUnavailable(f"{where}: no namespace to check the reference against")
        try:
            return self.scope.file_path(name, self.namespace)
        except ScopeError as error:
            raise SecretUnavailable(f"{where} refused: {error}") from None


def _read_secret_file(path: Path, where: str, *, strict: bool) -> str:
    """A regular file of at most :data:`MAX_SECRET_FILE_BYTES`, opened without blocking.

    ``strict``: the path is already resolved (symlinks checked), so a symlink swapped in since is
    refused (``O_NOFOLLOW``).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (os.O_NOFOLLOW if strict else 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        # The OS error names the path (fine) and the reason; it cannot contain the value.
        raise SecretUnavailable(f"{where} cannot be read: {error.strerror or error}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnavailable(f"{where} is not a regular file")
        if info.st_size > MAX_SECRET_FILE_BYTES:
            raise SecretUnavailable(f"{where} is larger than {MAX_SECRET_FILE_BYTES // 1024} KiB")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRET_FILE_BYTES:  # /proc files say size 0: read until EOF or the cap
            chunk = os.read(descriptor, MAX_SECRET_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as error:
        raise SecretUnavailable(f"{where} cannot be read: {error.strerror or error}") from None
    finally:
        os.close(descriptor)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SecretUnavailable(f"{where} is larger than {MAX_SECRET_FILE_BYTES // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretUnavailable(f"{where} is not UTF-8 text") from None


Processor = Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]


def make_redact_processor(redactor: Redactor) -> Processor:
    """A structlog processor that scrubs every value of the event dict with ``redactor``."""

    def processor(
        _logger: Any, _method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if event_dict.get("exc_info"):
            # A traceback repeats exception messages (which may hold a URL): render it here, then
            # scrub it, so the processor is safe wherever it sits in the chain.
            event_dict = structlog.processors.format_exc_info(_logger, _method_name, event_dict)
        for key in list(event_dict):
            event_dict[key] = redactor.scrub_value(event_dict[key])
        return event_dict

    return processor


redact_processor: Processor = make_redact_processor(DEFAULT_REDACTOR)
"""structlog processor over :data:`DEFAULT_REDACTOR` (which :class:`SecretResolver` uses by default)."""
