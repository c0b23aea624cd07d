"""Calling the gates a decision waits for, beside the tick (canary/rollout/gates.py is the pure part).

:meth:`GateRunner.submit` takes the ``gate_calls`` of a decision (after its state was stored) and
returns at once: each call runs on a small worker pool, so a gate that takes its whole timeout holds
one worker, never the tick and never another rollout. Bounded everywhere:

* **one attempt at a time per call point** (rollout, revision, gate, step): a call asked for again
  while one is in flight, or before its retry time, is not started;
* **retries with backoff** after a failed attempt: 2 s, 4 s, 8 s ... at most 30 s apart (or the
  receiver's ``Retry-After``, at most 5 minutes); the core keeps asking while the gate has not
  passed, and its deadline (in the rollout state) decides when to stop;
* **at most** ``max_in_flight`` attempts queued or running over all rollouts; beyond, a call
  waits for the next tick;
* **each attempt's deadline** is the gate's ``webhook.timeout``, for the whole exchange (connect at
  most 3.05 s of it).

An attempt is a POST of the call's JSON body (``kind: GateRequest``) with ``Content-Type:
application/json``, ``User-Agent: kserve-canary/<version>``, ``Idempotency-Key: <call id>`` (the
same for every attempt at a call point) and, with ``secretFrom``, ``X-Kserve-Canary-Timestamp`` and
``X-Kserve-Canary-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`` — the scheme of
webhook notifications, so :func:`canary.notify.webhook.verify_signature` checks both. The URL and the
key are read at call time through the policy's resolver (a file's policy: its namespace's scope; a
PromotionPolicy object: keys of its namespace's Secret) and checked by the same URL guard as
notifications; redirects are not followed. A gate fails closed: it passes only on a 2xx whose whole
answer (at most :data:`~canary.notify.delivery.ANSWER_LIMIT` bytes, never interpreted) arrived within
``webhook.timeout`` — connecting, the status, the headers and the body together. Anything else — an
answer dribbled past the timeout, cut short, too large, another status — is a failed attempt whose
detail names the secret *reference*, the status and the host, never the URL, a key or the body.

Each finished attempt is kept (the latest per call point) and handed to the next decision of its
rollout (:meth:`results`); ``on_done(key)`` asks the tick to decide that rollout soon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime

import structlog

from canary.evidence import Evidence
from canary.notify.delivery import USER_AGENT, DeliveryError, HttpPoster, utc_now
from canary.notify.secrets import SecretResolver, SecretUnavailable, describe_ref
from canary.notify.webhook import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from canary.policy import PromotionPolicy
from canary.rollout.decision import Decision
from canary.rollout.gates import GateCall, GateResult
from canary.rollout.records import ExplainDocument

__all__ = ["GATE_HEADER", "GateRunner", "explain_with_gates"]

log = structlog.get_logger("kserve_canary.gates")

GATE_HEADER = "X-Kserve-Canary-Gate"  # the gate's name and stage: "smoke; at=pre-rollout"
_CONNECT_TIMEOUT = 3.05
_FIRST_RETRY = 2.0
_MOST_RETRY = 30.0
_MOST_RETRY_AFTER = 300.0

_Slot = tuple[str, str, str]  # (policy key, revision, call key)


@dataclass
class _Attempts:
    in_flight: bool = False
    failures: int = 0
    next_at: float = 0.0  # monotonic: not before
    last: GateResult | None = None


def explain_with_gates(
    stored: ExplainDocument | None, decision: Decision, evidence: Evidence | None, now: datetime
) -> ExplainDocument | None:
    """``explain.json`` after ``decision``: its own evaluation when it judged one; else, when the
    rollout has gates, the stored latest evaluation of the same revision with the gates as they are
    now (a tick that only records a gate attempt must not erase the checks); else None (kept as is)."""
    if decision.judgements:
        return ExplainDocument.of(decision, evidence, now)
    if not decision.new_state.gates:
        return None
    current = ExplainDocument.of(decision, None, now)
    if stored is not None and stored.revision == decision.revision:
        return replace(stored, gates=current.gates)
    return current


class GateRunner:
    def __init__(
        self,
        *,
        resolver_for: Callable[[PromotionPolicy], SecretResolver],
        on_done: Callable[[str], None] = lambda key: None,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        max_workers: int = 4,
        max_in_flight: int = 64,
    ) -> None:
        self._resolver_for = resolver_for
        self._on_done = on_done
        self._clock = clock
        self._monotonic = monotonic
        self._max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gate")
        self._lock = threading.Lock()
        self._slots: dict[_Slot, _Attempts] = {}
        self._closed = False

    def submit(self, policy: PromotionPolicy, calls: Sequence[GateCall]) -> int:
        """Start the attempts due among ``calls`` (never blocks); how many were started."""
        started = 0
        now = self._monotonic()
        for call in calls:
            slot: _Slot = (call.policy_key, call.revision, call.key)
            with self._lock:
                if self._closed:
                    return started
                # A rollout of another revision replaced this one: what it had is of no use.
                for other in [s for s, a in self._slots.items() if s[0] == call.policy_key]:
                    if other[1] != call.revision and not self._slots[other].in_flight:
                        del self._slots[other]
                attempts = self._slots.setdefault(slot, _Attempts())
                if attempts.in_flight or now < attempts.next_at:
                    continue
                if attempts.last is not None and attempts.last.passed:
                    continue  # the next decision records it
                if sum(1 for a in self._slots.values() if a.in_flight) >= self._max_in_flight:
                    log.warning(
                        "gate call postponed: too many in flight", gate=call.name, key=call.policy_key
                    )
                    continue
                attempts.in_flight = True
            self._pool.submit(self._attempt, policy, call, slot)
            started += 1
        return started

    def results(self, key: str) -> tuple[GateResult, ...]:
        """The latest finished attempt of each call point of rollout ``key`` (namespace/name)."""
        with self._lock:
            return tuple(
                attempts.last for slot, attempts in self._slots.items() if slot[0] == key and attempts.last
            )

    def forget(self, key: str) -> None:
        with self._lock:
            for slot in [slot for slot in self._slots if slot[0] == key]:
                if not self._slots[slot].in_flight:
                    del self._slots[slot]

    def close(self, *, wait: bool = False) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # -- one attempt -------------------------------------------------------------------------

    def _attempt(self, policy: PromotionPolicy, call: GateCall, slot: _Slot) -> None:
        began = self._monotonic()
        retry_after: float | None = None
        status: int | None
        try:
            status, detail = self._post(policy, call)
            passed = True
        except DeliveryError as error:
            passed, status, detail, retry_after = False, error.status, str(error), error.retry_after
        except SecretUnavailable as error:
            passed, status, detail = False, None, str(error)
        except Exception as error:  # a bug must not kill the worker; the type says enough
            passed, status, detail = False, None, f"gate call failed ({type(error).__name__})"
        seconds = self._monotonic() - began
        result = GateResult(call.revision, call.key, passed, self._clock(), status, detail, seconds)
        with self._lock:
            attempts = self._slots.setdefault(slot, _Attempts())
            attempts.in_flight = False
            attempts.last = result
            if not passed:
                attempts.failures += 1
                delay = min(_MOST_RETRY, _FIRST_RETRY * 2 ** (attempts.failures - 1))
                if retry_after is not None:
                    delay = max(delay, min(retry_after, _MOST_RETRY_AFTER))
                attempts.next_at = self._monotonic() + delay
        (log.info if passed else log.warning)(
            "gate passed" if passed else "gate attempt failed",
            key=call.policy_key,
            revision=call.revision,
            gate=call.name,
            at=call.stage.value,
            callPoint=call.key,
            status=status,
            seconds=round(seconds, 3),
            detail=detail,
        )
        try:
            self._on_done(call.policy_key)
        except Exception as error:  # the next tick comes anyway
            log.warning("gate: could not trigger the rollout", key=call.policy_key, error=str(error))

    def _post(self, policy: PromotionPolicy, call: GateCall) -> tuple[int, str]:
        gates = policy.spec.gates
        if call.index >= len(gates) or gates[call.index].at is not call.stage:
            raise DeliveryError(f"gate {call.name}: no longer in the policy", retryable=False)
        webhook = gates[call.index].webhook
        resolver = self._resolver_for(policy)
        url = resolver.resolve(webhook.url_from)
        body = call.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            IDEMPOTENCY_HEADER: call.id,
            GATE_HEADER: f"{call.name}; at={call.stage.value}",
        }
        if webhook.secret_from is not None:
            secret = resolver.resolve_key(webhook.secret_from)
            timestamp = str(int(self._clock().timestamp()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(body, timestamp, secret)
        poster = HttpPoster(
            describe=f"gate {call.name} ({describe_ref(webhook.url_from)})",
            redactor=resolver.redactor,
            timeout=(min(_CONNECT_TIMEOUT, webhook.timeout), webhook.timeout),
            clock=self._clock,
            guard=resolver.url_guard,
        )
        try:
            # A gate fails closed: a 2xx passes only when its whole answer arrived in time.
            answer = poster.post(url, body, headers, whole_answer=True)
        finally:
            poster.close()
        return answer.status, f"HTTP {answer.status}"
