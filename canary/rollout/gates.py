"""Gates: the webhooks a rollout waits for, as pure values (docs/design.md, "Gates").

A policy's ``gates`` are called before the first step (``pre-rollout``), at every held step once
its window and checks passed (``step``), and before the promotion (``pre-promotion``). The core never
calls anything: like evidence, a gate's outcome is an *input* of :func:`canary.rollout.core.decide`.

* :func:`~canary.rollout.core.decide` returns the gates it waits for in ``Decision.gate_calls``
  (a :class:`GateCall` each: which gate, for which revision and step, and the JSON body to send);
* the shell calls them beside the tick (``canary.controller.gates``), retrying failed attempts, and
  hands every finished attempt back as a :class:`GateResult` to the next ``decide``;
* the rollout state keeps one :class:`GateProgress` per gate reached, so a restart neither repeats
  a passed gate (``passed_at``) nor shortens a deadline (``since``, when the gate was first asked).

A 2xx answer passes. Anything else — another status, a timeout, a connection error, a missing
secret — is a failed *attempt*: the step holds (this is not a failure of the canary) and the gate is
called again, until it passes or its ``deadline`` (from ``since``) passes; then ``failurePolicy``
applies: ``rollback`` rolls back, ``hold`` keeps holding and calling, with a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from canary.policy.model import API_VERSION, GateStage
from canary.rollout.state import GateProgress, describe_time
from canary.rollout.vocabulary import decision_id

__all__ = [
    "GATE_REQUEST_KIND",
    "MAX_GATE_DETAIL_CHARS",
    "GateCall",
    "GateProgress",
    "GateResult",
    "gate_body",
    "gate_key",
    "record_gate_result",
]

GATE_REQUEST_KIND = "GateRequest"
# What is kept of an attempt's answer (a status line, an error): enough to say why, small in the state.
MAX_GATE_DETAIL_CHARS = 200


def gate_key(stage: GateStage, index: int, weight: int | None) -> str:
    """Names one call point of one gate within a rollout: ``step@30%/1`` (the gate at position 1 of
    ``spec.gates`` at the 30% step), ``pre-rollout/0``. Steps are named by weight, so an edit of the
    policy that renumbers its steps keeps a passed step gate passed."""
    if stage is GateStage.STEP:
        return f"{stage.value}@{weight}%/{index}"
    return f"{stage.value}/{index}"


@dataclass(frozen=True, slots=True)
class GateResult:
    """One finished attempt of a gate call, as the shell saw it (an input of ``decide``).

    ``passed`` is a 2xx answer; ``status`` the HTTP status (None: no answer — a timeout, a
    connection error, a secret that could not be read); ``detail`` says why in a few words, with no
    secret in it; ``at`` is when the attempt finished, ``seconds`` how long it took.
    """

    revision: str
    key: str
    passed: bool
    at: datetime
    status: int | None = None
    detail: str = ""
    seconds: float = 0.0


def record_gate_result(progress: GateProgress, result: GateResult) -> GateProgress:
    """``progress`` with ``result`` taken in; a result already taken in (or older), one of another
    call point, or any result after the gate passed, changes nothing."""
    if progress.passed_at is not None or result.key != progress.key:
        return progress
    if progress.last_at is not None and result.at <= progress.last_at:
        return progress
    if result.at < progress.since:
        return progress  # an attempt from before this call point was reached (an earlier rollout)
    detail = result.detail[:MAX_GATE_DETAIL_CHARS]
    if result.passed:
        return replace(
            progress, passed_at=result.at, last_at=result.at, last_status=result.status, last_detail=detail
        )
    return replace(
        progress,
        attempts=progress.attempts + 1,
        last_at=result.at,
        last_status=result.status,
        last_detail=detail,
    )


@dataclass(frozen=True, slots=True)
class GateCall:
    """A gate the decision waits for: the shell calls ``gates[index]`` of the policy with ``body``.

    ``body`` is the versioned JSON document (:meth:`payload`), deterministic for a call point, so a
    retry sends the same bytes (signed afresh, with the attempt's timestamp) and ``id`` lets a
    receiver recognise a repeat.
    """

    policy_key: str  # namespace/inferenceService
    revision: str
    key: str
    index: int  # position in spec.gates
    name: str
    stage: GateStage
    timeout: float  # seconds, one attempt
    since: datetime
    deadline: timedelta
    body: str

    @property
    def id(self) -> str:
        return decision_id("gate", self.policy_key, self.revision, self.key)


def gate_body(
    *,
    policy_key: str,
    policy_name: str,
    namespace: str,
    inference_service: str,
    uid: str | None,
    revision: str,
    stable: str | None,
    key: str,
    index: int,
    name: str,
    stage: GateStage,
    step: dict[str, Any] | None,
    since: datetime,
    deadline: timedelta,
    evidence: dict[str, Any] | None,
) -> str:
    """The JSON body of a gate call (``kind: GateRequest``; receivers ignore fields they do not know).

    Compact, keys in a fixed order, times RFC 3339 UTC: the bytes that are signed.
    """
    document = {
        "apiVersion": API_VERSION,
        "kind": GATE_REQUEST_KIND,
        "id": decision_id("gate", policy_key, revision, key),
        "gate": {"name": name, "at": stage.value, "index": index},
        "inferenceService": {"namespace": namespace, "name": inference_service, "uid": uid},
        "policy": policy_name,
        "revisions": {"canary": revision, "stable": stable},
        "step": step,
        "requestedAt": describe_time(since),
        "deadline": describe_time(since + deadline),
        "evidence": evidence,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))
