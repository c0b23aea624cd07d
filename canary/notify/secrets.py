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
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, MutableMapping
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
    "MAX_KEY_BYTES",
    "MAX_REFERENCES_PER_NAMESPACE",
    "MAX_URL_BYTES",
    "MIN_SECRET_LENGTH",
    "Redactor",
    "SecretReader",
    "SecretResolver",
    "SecretUnavailable",
    "describe_ref",
    "make_redact_processor",
    "redact_processor",
]

MASK = "***"

# A value shorter than this is refused. A signing key of fewer than 16 characters is weak (HMAC's
# key should carry at least 128 bits; NIST SP 800-107 §5.3.4), and a short value is likely to be
# ordinary text ("rolled back") that masking would hide from its own team's messages. Every chat and
# webhook URL is far longer.
MIN_SECRET_LENGTH = 16

# The longest value read as a URL and as a signing key (UTF-8 bytes). Slack, Teams and Discord
# webhook URLs are under 300 bytes (Teams Workflows URLs the longest, with their ``sig``); browsers
# and CDNs commonly refuse URLs over 2 KiB. HMAC keys longer than the hash's block (64 bytes for
# SHA-256) are hashed first, so 256 bytes leaves room for any encoding of a 64-byte key.
MAX_URL_BYTES = 2048
MAX_KEY_BYTES = 256

# How many references a namespace's values are kept for (each with its current and previous value):
# the least recently read is dropped first. Values are registered when they are read, just before
# they are used, so what is dropped is what no send is using.
MAX_REFERENCES_PER_NAMESPACE = 32

# Fragments of a URL (its path, path and query, userinfo) shorter than this are not treated as
# secret on their own ("/", "/hook"): they are too common in ordinary text. The full URL always is.
_MIN_FRAGMENT_LENGTH = 8

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


_GRAM = _MIN_FRAGMENT_LENGTH  # every literal is at least this long
_FEW = 64  # up to this many literals, trying each costs less than indexing the text


class _Literals:
    """Literals to mask, longest first (a URL is masked whole before its path inside it), each found
    with ``in`` and masked with ``str.replace`` (C-speed scans, nothing compiled). Beyond
    :data:`_FEW`, only the literals whose first :data:`_GRAM` characters occur in the text are tried,
    found through an index of those prefixes: the cost of a text then grows with its length, not with
    the number of literals (the logs are scrubbed with every namespace's)."""

    __slots__ = ("_by_gram", "ordered")

    def __init__(self, literals: set[str]) -> None:
        self.ordered = tuple(sorted(literals, key=_longest_first))
        by_gram: dict[str, list[str]] = {}
        for literal in self.ordered:
            by_gram.setdefault(literal[:_GRAM], []).append(literal)
        self._by_gram = {gram: tuple(found) for gram, found in by_gram.items()}

    def scrub(self, text: str) -> str:
        candidates: Iterable[str] = self.ordered
        if len(self.ordered) > _FEW:
            grams = {text[index : index + _GRAM] for index in range(len(text) - _GRAM + 1)}
            found = [literal for gram in grams & self._by_gram.keys() for literal in self._by_gram[gram]]
            candidates = sorted(found, key=_longest_first)
        for literal in candidates:
            if literal in text:
                text = text.replace(literal, MASK)
        return text


def _longest_first(literal: str) -> tuple[int, str]:
    return -len(literal), literal


_NONE = _Literals(set())


class _Book:
    """The values of every namespace, shared by a :class:`Redactor` and its namespace views.

    Per namespace: per reference (``where`` it was read), its current value and the one before (an
    attempt in flight with the old value may still fail after a rotation), at most
    :data:`MAX_REFERENCES_PER_NAMESPACE` references. From them, the literals to mask (every value
    and the URL fragments HTTP errors repeat), rebuilt only when that namespace's values change; and
    the union of all namespaces for text that belongs to no namespace (logs), rebuilt when first
    needed after a change.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.references: dict[str, OrderedDict[str, tuple[str, ...]]] = {}
        self.own: dict[str, set[str]] = {}  # per namespace, the literals of its own values
        self.literals: dict[str, _Literals] = {}  # what a namespace's text is scrubbed with
        self._everyone: _Literals | None = _NONE  # None: to be rebuilt

    def add(self, namespace: str, where: str, value: str) -> None:
        with self.lock:
            references = self.references.setdefault(namespace, OrderedDict())
            known = references.get(where, ())
            references[where] = known if known[:1] == (value,) else (value, *known[:1])
            references.move_to_end(where)
            if known[:1] == (value,):
                return  # read again unchanged: nothing to rebuild
            while len(references) > MAX_REFERENCES_PER_NAMESPACE:
                references.popitem(last=False)
            self.own[namespace] = {
                variant for values in references.values() for each in values for variant in _variants(each)
            }
            # Values read without a namespace are the operator's (no tenant's): they mask everywhere.
            for changed in self.own if namespace == "" else (namespace,):
                self.literals[changed] = _Literals(self.own[changed] | self.own.get("", set()))
            self._everyone = None

    def everyone(self) -> _Literals:
        found = self._everyone  # replaced under the lock, never mutated: a read needs no lock
        if found is None:
            with self.lock:
                found = self._everyone
                if found is None:
                    found = self._everyone = _Literals(set().union(*self.own.values()))
        return found


class Redactor:
    """Knows the secret values read so far, per namespace, and scrubs them from any text. Thread-safe.

    A redactor made with ``Redactor()`` sees every namespace: what it scrubs (logs) is masked with
    every namespace's values. :meth:`for_namespace` gives a view on the same values that registers
    into, and scrubs with, one namespace's values only: the Events, notifications and statuses of
    namespace N are never masked with another namespace's values. The credential-looking patterns
    (URL userinfo, token query parameters, webhook paths, bearer tokens) are masked everywhere.

    The values are matched as literals (:class:`_Literals`): each namespace keeps at most a few
    hundred (bounded above), ``in``/``str.replace`` find one in C at the speed of a memory scan, with
    nothing compiled, and a change rebuilds only that namespace's sorted literals (the union for the
    logs when next needed).
    """

    def __init__(self, *, _book: _Book | None = None, _namespace: str | None = None) -> None:
        self._book = _book if _book is not None else _Book()
        self._namespace = _namespace

    @property
    def namespace(self) -> str | None:
        return self._namespace

    def for_namespace(self, namespace: str) -> Redactor:
        """A view on the same values that registers into and scrubs with ``namespace``'s only."""
        return Redactor(_book=self._book, _namespace=namespace)

    def add(self, secret: str, *, where: str | None = None) -> None:
        """Register a secret value (and, for URLs, the fragments HTTP errors repeat) read from
        ``where`` (its reference); a new value of the same reference replaces all but the last one."""
        self._book.add(self._namespace or "", where if where is not None else secret, secret)

    def __contains__(self, secret: str) -> bool:
        return secret in self._literals().ordered

    def _literals(self) -> _Literals:
        book = self._book  # replaced under the lock, never mutated: reads need no lock
        if self._namespace is None:
            return book.everyone()
        return book.literals.get(self._namespace) or book.literals.get("", _NONE)

    def scrub(self, text: str) -> str:
        """``text`` with every known secret and every credential-looking fragment masked."""
        text = self._literals().scrub(text)
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
    """The value, raw and percent-encoded, and for a URL the fragments HTTP errors repeat."""
    variants = {secret, quote(secret, safe=""), quote(secret, safe="/:")}
    parts = urlsplit(secret)
    if parts.scheme and parts.netloc:
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        for fragment in (parts.path, tail, parts.query):
            variants.update({fragment, quote(fragment, safe="/?&="), quote(fragment, safe="")})
        variants.update({parts.password or "", parts.username or ""})
    return {variant for variant in variants if len(variant) >= _MIN_FRAGMENT_LENGTH}


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
        redactor = redactor if redactor is not None else DEFAULT_REDACTOR
        # A resolver of a namespace registers into, and scrubs with, that namespace's values only.
        self.redactor = redactor.for_namespace(namespace) if namespace is not None else redactor
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

    def resolve(self, ref: SecretRef, *, max_bytes: int = MAX_URL_BYTES, what: str = "URL") -> str:
        """The value of ``ref`` (a URL unless said otherwise), registered for redaction."""
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
        _check_value(value, where, max_bytes, what)
        self.redactor.add(value, where=where)
        return value

    def resolve_key(self, ref: SecretRef) -> str:
        """A signing key: at most :data:`MAX_KEY_BYTES`."""
        return self.resolve(ref, max_bytes=MAX_KEY_BYTES, what="signing key")

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


def _check_value(value: str, where: str, max_bytes: int, what: str) -> None:
    """Refuse a value that is empty, too short to keep out of text, or larger than its kind's cap."""
    if not value:
        raise SecretUnavailable(f"{where} is empty")
    if len(value) < MIN_SECRET_LENGTH:
        raise SecretUnavailable(
            f"{where} is shorter than {MIN_SECRET_LENGTH} characters and cannot be kept out of logs: "
            f"use a longer random value (e.g. `openssl rand -hex 16`)"
        )
    size = len(value.encode())
    if size > max_bytes:
        raise SecretUnavailable(
            f"{where} is {size} bytes, over the {max_bytes} bytes a {what} may have: "
            f"store only the {what} in it"
        )


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
