"""The rollback ledger: the revisions rolled back, kept where losing the rollout state cannot undo them.

The state remembers rolled-back revisions too, but the state can be lost (a person deletes its
ConfigMap to "start over", an empty ``state.json``). Without a memory of the rollback, the
rolled-back revision — at 0 % and still Ready — looks like a dark launch on first sight, and its
first step would be written again. The ledger is a separate record (the shell keeps it in its own
ConfigMap, docs/design.md §4.3), written *before* the rollback's patch, and bound to the
InferenceService's uid: a model deleted and re-created under the same name starts a new ledger
(Knative numbers its revisions from 00001 again, so old names would match new revisions).

The core gets it as an input (``decide(..., ledger=...)``): a revision in the ledger is never
started, advanced or promoted again. It stays pure: the shell reads and writes the record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime

from pydantic import AwareDatetime, TypeAdapter, ValidationError

from canary.rollout.decision import Decision
from canary.rollout.state import JSON_CONFIG, StateFormatError, read_json_object
from canary.rollout.vocabulary import Action

__all__ = [
    "LEDGER_SCHEMA_VERSION",
    "MAX_LEDGER_ENTRIES",
    "LedgerEntry",
    "LedgerFormatError",
    "RollbackLedger",
    "ledger_after",
]

LEDGER_SCHEMA_VERSION = 1
MAX_LEDGER_ENTRIES = 32  # the last N rolled-back revisions: a few KiB at most


class LedgerFormatError(StateFormatError):
    """The stored rollback ledger cannot be read."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One rolled-back revision of the InferenceService the ledger belongs to."""

    __pydantic_config__ = JSON_CONFIG

    revision: str
    fingerprint: str | None  # the predictor spec (minus the percentage) that produced it
    at: AwareDatetime  # when the rollback was decided


@dataclass(frozen=True, slots=True)
class RollbackLedger:
    """The rolled-back revisions of one InferenceService object (``inference_service_uid``)."""

    __pydantic_config__ = JSON_CONFIG

    inference_service_uid: str | None = None
    entries: tuple[LedgerEntry, ...] = ()

    def entry(self, revision: str | None) -> LedgerEntry | None:
        return next((entry for entry in self.entries if entry.revision == revision), None)

    def has(self, revision: str | None) -> bool:
        return self.entry(revision) is not None

    def for_inference_service(self, uid: str | None) -> RollbackLedger:
        """The ledger as it applies to the object with ``uid``: empty when it belongs to another one."""
        if self.inference_service_uid is None or uid is None or self.inference_service_uid == uid:
            return self
        return RollbackLedger(inference_service_uid=uid)

    def recording(
        self, revision: str, fingerprint: str | None, at: datetime, uid: str | None
    ) -> RollbackLedger:
        """This ledger with ``revision`` added (newest last, bounded); a stale ledger starts over."""
        ledger = self.for_inference_service(uid)
        if ledger.has(revision):
            return ledger
        entries = (*ledger.entries, LedgerEntry(revision, fingerprint, at))[-MAX_LEDGER_ENTRIES:]
        return replace(ledger, inference_service_uid=uid or ledger.inference_service_uid, entries=entries)

    def to_json(self) -> str:
        body = _ADAPTER.dump_python(self, mode="json", by_alias=True)
        return json.dumps({"schemaVersion": LEDGER_SCHEMA_VERSION, **body}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RollbackLedger:
        """Raises :class:`LedgerFormatError` for anything that is not a ledger of a known version."""
        document = read_json_object(text, "the rollback ledger", LedgerFormatError)
        version = document.pop("schemaVersion", None)
        if version != LEDGER_SCHEMA_VERSION or isinstance(version, bool):
            raise LedgerFormatError(
                f"the rollback ledger has schemaVersion {version!r}; this controller reads "
                f"{LEDGER_SCHEMA_VERSION}"
            )
        try:
            ledger = _ADAPTER.validate_python(document)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise LedgerFormatError(f"the rollback ledger is invalid at {where}: {first['msg']}") from None
        return replace(ledger, entries=ledger.entries[-MAX_LEDGER_ENTRIES:])


_ADAPTER: TypeAdapter[RollbackLedger] = TypeAdapter(RollbackLedger)


def ledger_after(decision: Decision, ledger: RollbackLedger, uid: str | None) -> RollbackLedger | None:
    """The ledger the shell must store *before* patching ``decision`` — None when it has nothing to add.

    A rollback adds its revision (with the fingerprint the state records); nothing else changes it.
    """
    revision = decision.revision
    if decision.action is not Action.ROLLBACK or revision is None:
        return None
    current = ledger.for_inference_service(uid)
    if current.has(revision):
        return None
    # A rollback always records its revision among the state's rolled-back ones, with its time.
    at = next(entry.at for entry in decision.new_state.rolled_back if entry.revision == revision)
    return current.recording(revision, decision.new_state.fingerprint, at, uid)
