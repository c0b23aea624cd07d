"""``limit``/``continue`` on lists, as the apiserver pages them.

Upstream (kubernetes ``staging/src/k8s.io/apiserver/pkg/storage``):

* ``etcd3/store.go`` ``GetList``: at most ``limit`` items, in key order; when more follow, the list's
  ``metadata.continue`` is ``EncodeContinue(string(lastKey)+"\\x00", keyPrefix, withRev)``: the next
  page starts right after the last key returned, at the *same* revision (a consistent snapshot:
  changes made between pages are not in it); ``remainingItemCount`` only when no label or field
  selector was given (``opts.Predicate.Empty()``), because the count would include objects the
  selector drops. With a selector, pages are still filled up to ``limit`` (it reads on until they are).
* ``continue.go``: the token is ``base64.RawURLEncoding`` of ``{"v":"meta.k8s.io/v1","rv":N,"start":
  KEY}``; a token that does not decode, names another version, ``rv`` 0 or an empty start key is a 400
  "continue key is not valid…".
* ``etcd3/errors.go``: a token whose revision was compacted is a 410 ``Expired`` "The provided continue
  parameter is too old to display a consistent list result. …".
* ``apimachinery/pkg/apis/meta/internalversion/validation``: ``continue`` with a ``resourceVersion`` is a
  400 "specifying resource version is not allowed when using continue".

The emulator keeps the rest of a paged list (its snapshot) for the last :data:`KEPT_LISTS` lists; a
token of an older one is answered as compacted (410), as the apiserver answers one older than its
compaction (five minutes by default).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections import OrderedDict
from typing import Any

from canary_sandbox.emulator.errors import ApiError

__all__ = ["KEPT_LISTS", "ListPages"]

JsonObject = dict[str, Any]

KEPT_LISTS = 64

_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter."
)


def _key(item: JsonObject) -> str:
    meta = item.get("metadata") or {}
    namespace, name = meta.get("namespace"), str(meta.get("name") or "")
    return f"{namespace}/{name}" if namespace else name


def _token(start: str, version: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": int(version), "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str) -> None:
    """Refuse a token the apiserver could not decode (continue.go ``DecodeContinue``)."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error) as error:
        raise ApiError.bad_request(f"continue key is not valid: {error}") from None
    if not isinstance(data, dict) or data.get("v") != "meta.k8s.io/v1":
        version = data.get("v") if isinstance(data, dict) else None
        raise ApiError.bad_request(
            f"continue key is not valid: server does not recognize this encoded version {version}"
        )
    if not data.get("rv"):
        raise ApiError.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        )
    if not data.get("start"):
        raise ApiError.bad_request(
            "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)"
        )


class ListPages:
    """The snapshots of paged lists, by the token that continues them."""

    def __init__(self, kept: int = KEPT_LISTS) -> None:
        self._kept = kept
        self._rest: OrderedDict[str, tuple[list[JsonObject], str, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def page(
        self, items: list[JsonObject], version: str, query: dict[str, str], *, selected: bool
    ) -> tuple[list[JsonObject], str, JsonObject]:
        """The page the query asks for: (items, the list's resourceVersion, extra list metadata).

        ``items``/``version``: the whole list now (ignored when ``continue`` is given); ``selected``:
        a label or field selector was given (no ``remainingItemCount`` then)."""
        token = query.get("continue", "")
        if token:
            if query.get("resourceVersion"):
                raise ApiError.bad_request("specifying resource version is not allowed when using continue")
            _decode(token)
            with self._lock:
                kept = self._rest.pop(token, None)
            if kept is None:
                raise ApiError(410, _EXPIRED, reason="Expired")
            items, version, selected = kept
        limit = _limit(query.get("limit", ""))
        if limit is None or len(items) <= limit:
            return items, version, {}
        page, rest = items[:limit], items[limit:]
        following = _token(_key(page[-1]) + "\x00", version)
        with self._lock:
            self._rest[following] = (rest, version, selected)
            while len(self._rest) > self._kept:
                self._rest.popitem(last=False)
        extra: JsonObject = {"continue": following}
        if not selected:
            extra["remainingItemCount"] = len(rest)
        return page, version, extra


def _limit(text: str) -> int | None:
    """``limit``: a positive integer pages; absent, 0 or negative lists everything (as the apiserver)."""
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ApiError.bad_request(f'invalid value for "limit": {text!r}') from None
    return value if value > 0 else None
