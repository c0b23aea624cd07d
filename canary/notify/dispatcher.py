"""Delivering notifications without ever making a rollout wait for them.

:meth:`NotificationDispatcher.submit` puts the notification into memory (and, for Slack and webhooks
with an outbox, writes it there first: one apiserver write) and returns; the receivers are called on
worker threads. The shape, and why:

* **one lane per destination** — a bounded FIFO queue with its own worker thread. A Slack that
  hangs for its whole timeout, or answers 429 for a minute, holds up only Slack messages; the
  webhook and the Kubernetes Events keep flowing. Within a lane, order is kept (``started`` is
  posted before ``advanced``). Destinations are few (a handful of channels and hooks, plus Events),
  so a thread each is simpler and more isolating than a shared pool; ``max_lanes`` bounds them.
* **bounded queues that never block** — when a lane is full, the oldest *info* notification is
  dropped (counted, logged) to make room; if the lane holds only warnings, an arriving info is
  dropped instead, and an arriving warning replaces the oldest warning. A rollback is never
  blocked and never waits behind progress chatter.
* **retries with exponential backoff and jitter** — for what can succeed later (connection errors,
  timeouts, 408/425/429, 5xx); 429/503 ``Retry-After`` is honoured (up to ``max_retry_after``).
  Other answers (400, 403, 404, a missing secret) fail at once. The loop is
  :func:`canary.retrying.retrying`, the same idiom and :class:`RetryPolicy` shape as the Prometheus
  client's; the backoff is the ``retry`` parameter (:data:`~canary.retrying.NOTIFICATION_RETRY` by
  default). With a ``horizon`` (:class:`~canary.notify.outbox.RetryHorizon`, what the controller
  uses) a notification is retried until its horizon, counted from when it was submitted, runs out
  — an hour for rollbacks, promotions, pauses and warnings by default — not for a number of attempts;
  without one, for the policy's ``attempts``.
* **an outbox** (:class:`~canary.notify.outbox.Outbox`, optional) — a Slack or webhook notification
  is stored before it is queued and removed when it was delivered or given up, so a restart or a
  takeover by another replica continues from it (:meth:`resume`): at least once, with the same
  idempotency key. ``may_deliver`` (the controller: "do I hold the Lease?") is asked before each
  attempt of a stored notification; a replica that is no longer the leader leaves it to the next.
* **every loss is reported** — given up after its horizon, refused for good, or dropped for room:
  a ``NotificationFailed`` Event (when an Events destination is configured), the
  ``kserve_canary_notifications_lost_total{channel, reason}`` counter and an error log line.
* **de-duplication per (decision id, destination)** over a bounded memory: re-submitting a decision
  (every evaluation tick re-deriving it, a restart) posts it once — the Flagger complaint #1515.
* **severity filter** per destination (``minSeverity`` in the policy).
* **graceful close** — :meth:`close` stops intake and waits up to ``timeout`` for the lanes to
  drain (SIGTERM); what is left is counted as dropped and abandoned (workers are daemon threads).
* **no secrets in logs** — every error message is scrubbed by the :class:`Redactor` before it is
  logged, whether or not the log pipeline has :func:`~canary.notify.secrets.redact_processor`.

A Slack or webhook delivery that fails for good is reported as a Warning ``NotificationFailed``
Event on the InferenceService (when an Events destination is configured): people looking at the
model see that they were not told, and why — without the URL.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import structlog

from canary.notify.delivery import Clock, DeliveryError, Sender, TargetKind, utc_now
from canary.notify.message import Notification, NotificationAction, Severity
from canary.notify.metrics import DeliveryRecorder, Loss, Outcome, default_recorder
from canary.notify.outbox import Outbox, OutboxEntry, RetryHorizon
from canary.notify.secrets import DEFAULT_REDACTOR, Redactor, SecretUnavailable
from canary.retrying import NOTIFICATION_RETRY, RetryPolicy, retrying

__all__ = ["Destination", "NotificationDispatcher", "RetryPolicy", "Submission"]

Sleep = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class Destination:
    """Where notifications go. ``key`` names it without revealing it (``slack env SLACK_WEBHOOK_URL``):
    it is the lane, the de-duplication scope and what logs show."""

    key: str
    kind: TargetKind
    sender: Sender
    min_severity: Severity = Severity.INFO
    # How the controller finds it again after a restart ("notify[0]": the policy's first entry);
    # empty: not kept in the outbox.
    ref: str = ""

    @property
    def durable(self) -> bool:
        return bool(self.ref) and self.kind in _DURABLE_KINDS


# Kept in the outbox: what goes out of the cluster. Kubernetes Events go to the very apiserver the
# outbox would be written to, and the rollout's own history already records each decision.
_DURABLE_KINDS = frozenset({TargetKind.SLACK, TargetKind.TEAMS, TargetKind.DISCORD, TargetKind.WEBHOOK})


class _Unsendable:
    """The sender of a stored destination the policy no longer names."""

    def send(self, notification: Notification) -> None:
        raise DeliveryError("destination no longer configured", retryable=False)


@dataclass(frozen=True, slots=True)
class Submission:
    """What :meth:`NotificationDispatcher.submit` did with a notification, per destination key."""

    accepted: tuple[str, ...] = ()
    duplicates: tuple[str, ...] = ()
    filtered: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()  # refused: dispatcher closed, too many lanes, or its lane was full


@dataclass(frozen=True, slots=True)
class _Try:
    """What one delivery attempt came to."""

    delivered: bool = False
    retryable: bool = False
    retry_after: float | None = None
    message: str = ""
    abandoned: bool = False  # the dispatcher gave up on its queue (close timed out): not attempted
    cancelled: bool = False  # dropped from the outbox for room meanwhile (already reported lost)


@dataclass(slots=True)
class _Item:
    notification: Notification
    destination: Destination
    deadline: datetime | None = None  # retried until then; None: for the retry policy's attempts
    entry: OutboxEntry | None = None  # kept in the outbox until delivered or given up


@dataclass(eq=False)
class _Lane:
    key: str
    kind: TargetKind
    capacity: int
    items: deque[_Item] = field(default_factory=deque)
    condition: threading.Condition = field(default_factory=threading.Condition)
    closing: bool = False
    thread: threading.Thread | None = None

    def offer(self, item: _Item) -> _Item | None:
        """Enqueue ``item``; returns the item dropped to make room (possibly ``item`` itself)."""
        with self.condition:
            dropped: _Item | None = None
            if len(self.items) >= self.capacity:
                oldest_info = next(
                    (queued for queued in self.items if queued.notification.severity is Severity.INFO), None
                )
                if oldest_info is not None:
                    self.items.remove(oldest_info)
                    dropped = oldest_info
                elif item.notification.severity is Severity.INFO:
                    return item  # only warnings queued: they matter more than this info
                else:
                    dropped = self.items.popleft()  # all warnings: the newest is the most relevant
            self.items.append(item)
            self.condition.notify()
            return dropped


class NotificationDispatcher:
    """Accepts notifications without blocking and delivers them in the background.

    ``default_destinations`` receive every notification (typically the Kubernetes Events one);
    :meth:`submit` adds the policy's own destinations.
    """

    def __init__(
        self,
        default_destinations: Sequence[Destination] = (),
        *,
        retry: RetryPolicy | None = None,
        queue_capacity: int = 256,
        dedup_capacity: int = 10_000,
        max_lanes: int = 64,
        recorder: DeliveryRecorder | None = None,
        redactor: Redactor | None = None,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
        logger: Any = None,
        horizon: RetryHorizon | None = None,
        outbox: Outbox | None = None,
        may_deliver: Callable[[], bool] | None = None,
        clock: Clock = utc_now,
    ) -> None:
        if queue_capacity < 1:
            raise ValueError("queue_capacity must be at least 1")
        self._defaults = tuple(default_destinations)
        # The retry budget (attempts, backoff, total pause budget) is the caller's: canary.retrying.
        self._retry = retry or NOTIFICATION_RETRY
        self._queue_capacity = queue_capacity
        self._dedup_capacity = dedup_capacity
        self._max_lanes = max_lanes
        self._recorder = recorder if recorder is not None else default_recorder()
        self._redactor = redactor if redactor is not None else DEFAULT_REDACTOR
        self._abandon = threading.Event()
        # The default sleep wakes up when close() gives up, so a backoff never outlives shutdown.
        self._sleep: Sleep = sleep if sleep is not None else self._wait_unless_abandoned
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._log = logger if logger is not None else structlog.get_logger("canary.notify")
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._closed = False
        self._horizon = horizon
        self._outbox = outbox
        self._may_deliver = may_deliver or (lambda: True)
        self._now = clock
        self._cancelled: set[tuple[str, str]] = set()  # outbox entries given up while queued here

    def _wait_unless_abandoned(self, seconds: float) -> None:
        self._abandon.wait(seconds)

    # -- intake ---------------------------------------------------------------------------------

    def submit(self, notification: Notification, destinations: Iterable[Destination] = ()) -> Submission:
        """Queue ``notification`` for the default destinations and ``destinations``. Never waits for a
        receiver; with an outbox, writes the Slack and webhook entries to it first (one write)."""
        return self._submit_to(notification, (*self._defaults, *destinations))

    def _submit_to(self, notification: Notification, destinations: Iterable[Destination]) -> Submission:
        accepted: list[str] = []
        duplicates: list[str] = []
        filtered: list[str] = []
        dropped: list[str] = []
        targets: list[Destination] = []
        with self._lock:
            closed = self._closed
            for destination in destinations:
                if not notification.severity.at_least(destination.min_severity):
                    filtered.append(destination.key)
                    self._recorder.outcome(destination.kind, Outcome.FILTERED)
                    continue
                seen_key = (notification.id, destination.key)
                if seen_key in self._seen:
                    duplicates.append(destination.key)
                    self._recorder.outcome(destination.kind, Outcome.DUPLICATE)
                    continue
                if closed or self._lane_for(destination) is None:
                    dropped.append(destination.key)
                    self._recorder.outcome(destination.kind, Outcome.DROPPED)
                    continue
                self._remember(seen_key)
                targets.append(destination)
        now = self._now()
        deadline = None
        if self._horizon is not None:
            deadline = now + timedelta(seconds=self._horizon.for_notification(notification))
        items = [_Item(notification, destination, deadline) for destination in targets]
        # Stored before it is queued (outside the lock: one write for every durable destination).
        for item in self._store(items, now):
            with self._lock:
                self._seen.pop((notification.id, item.destination.key), None)
            dropped.append(item.destination.key)
            self._lose(item, Loss.DROPPED, f"no room in the outbox (at most {self._outbox_bounds()})", 0)
            items.remove(item)
        for item in items:
            if self._offer(item):
                accepted.append(item.destination.key)
            else:
                dropped.append(item.destination.key)
        if closed and dropped:
            self._log.warning(
                "notification dropped: dispatcher closed", destinations=dropped, decision_id=notification.id
            )
        return Submission(tuple(accepted), tuple(duplicates), tuple(filtered), tuple(dropped))

    def _offer(self, item: _Item) -> bool:
        """Queue ``item`` in its lane; False if it was refused (closed, or its lane was full)."""
        seen_key = (item.notification.id, item.destination.key)
        with self._lock:
            lane = None if self._closed else self._lane_for(item.destination)
            if lane is None:
                self._seen.pop(seen_key, None)
                victim: _Item | None = item
            else:
                # Offered under the dispatcher lock so close() cannot slip in between the check
                # above and the enqueue and strand the item in a lane whose worker has exited.
                victim = lane.offer(item)
            if victim is item:
                # Refused at the door (its queue holds only warnings): it was never accepted,
                # so a later re-submission is not a duplicate.
                self._seen.pop(seen_key, None)
        if victim is item and lane is None:
            self._recorder.outcome(item.destination.kind, Outcome.DROPPED)
            if item.entry is not None:
                self._log.info("notification left in the outbox: dispatcher closed", **self._fields(item))
            return False
        if victim is not None:
            self._recorder.outcome(victim.destination.kind, Outcome.DROPPED)
            self._log.warning(
                "notification dropped: queue full",
                **self._fields(victim),
                severity=victim.notification.severity.value,
                queue_capacity=self._queue_capacity,
            )
            self._lose(victim, Loss.DROPPED, f"the send queue was full ({self._queue_capacity})", 0)
        return victim is not item

    def _store(self, items: list[_Item], now: datetime) -> list[_Item]:
        """Put the durable ``items`` into the outbox; returns those dropped for room."""
        durable = [item for item in items if item.destination.durable and item.deadline is not None]
        if self._outbox is None or not durable:
            return []
        for item in durable:
            assert item.deadline is not None
            item.entry = OutboxEntry(
                notification=item.notification,
                destination=item.destination.key,
                ref=item.destination.ref,
                kind=item.destination.kind.value,
                queued_at=now,
                deadline=item.deadline,
            )
        try:
            dropped = self._outbox.add([item.entry for item in durable if item.entry is not None])
        except Exception as error:
            # Sent from memory only (a restart before delivery would lose it): said loudly.
            for item in durable:
                item.entry = None
            self._log.error(
                "notification outbox could not be written; sending from memory only",
                decision_id=items[0].notification.id,
                inference_service=items[0].notification.model,
                error=self._redactor.scrub(f"{type(error).__name__}: {error}"),
            )
            return []
        gone = {entry.key for entry in dropped}
        refused = [item for item in durable if item.entry is not None and item.entry.key in gone]
        for entry in dropped:
            if entry.key not in {item.entry.key for item in refused if item.entry is not None}:
                # An older entry made room: it is lost too; if it is queued here, it is not sent.
                with self._lock:
                    if entry.key in self._seen:
                        self._cancelled.add(entry.key)
                self._lose_entry(entry, Loss.DROPPED, "no room in the outbox for a newer notification")
        for item in refused:
            item.entry = None  # not stored: nothing to remove
        return refused

    def _outbox_bounds(self) -> str:
        if self._outbox is None:
            return "-"
        return f"{self._outbox.max_entries} entries, {self._outbox.max_bytes} bytes"

    def resume(
        self, entries: Sequence[OutboxEntry], resolve: Callable[[OutboxEntry], Destination | None]
    ) -> int:
        """Queue what a previous process (or the previous leader) left in an outbox; returns how many.

        ``resolve`` finds each entry's destination from its ``ref`` (the policy as loaded now); an
        entry whose destination is gone, or is another one now, is reported lost. Entries this
        dispatcher already holds are skipped.
        """
        resumed = 0
        for entry in entries:
            with self._lock:
                if self._closed:
                    return resumed
                if entry.key in self._seen:
                    continue
            destination = resolve(entry)
            if destination is None or destination.key != entry.destination:
                self._lose_entry(
                    entry, Loss.UNCONFIGURED, "its policy no longer names this destination", remove=True
                )
                continue
            item = _Item(entry.notification, destination, entry.deadline, entry)
            with self._lock:
                self._remember(entry.key)
            if self._offer(item):
                resumed += 1
                self._log.info("notification resumed from the outbox", **self._fields(item))
        return resumed

    def _remember(self, seen_key: tuple[str, str]) -> None:
        self._seen[seen_key] = None
        while len(self._seen) > self._dedup_capacity:
            self._seen.popitem(last=False)

    def _lane_for(self, destination: Destination) -> _Lane | None:
        lane = self._lanes.get(destination.key)
        if lane is not None:
            return lane
        if len(self._lanes) >= self._max_lanes:
            self._log.error(
                "notification destination refused: too many destinations",
                destination=destination.key,
                max_lanes=self._max_lanes,
            )
            return None
        lane = _Lane(destination.key, destination.kind, self._queue_capacity)
        lane.thread = threading.Thread(
            target=self._run_lane,
            args=(lane,),
            name=f"notify-{destination.kind}-{len(self._lanes)}",
            daemon=True,
        )
        self._lanes[destination.key] = lane
        lane.thread.start()
        return lane

    # -- delivery -------------------------------------------------------------------------------

    def _run_lane(self, lane: _Lane) -> None:
        while True:
            with lane.condition:
                while not lane.items and not lane.closing:
                    lane.condition.wait()
                if not lane.items:
                    return  # closing and drained
                item = lane.items.popleft()
            self._deliver(item)

    def _deliver(self, item: _Item) -> None:
        kind = item.destination.kind
        deadline = item.deadline
        policy = self._retry
        if deadline is not None:
            remaining = (deadline - self._now()).total_seconds()
            if remaining < 0:
                self._recorder.outcome(kind, Outcome.FAILED)
                self._lose(item, Loss.EXPIRED, "its retry horizon had passed before it could be sent", 0)
                return
            # Retried until the horizon, not for a number of attempts: the pauses may add up to what
            # is left of it, and no try starts after it.
            policy = replace(self._retry, attempts=sys.maxsize, budget=remaining)

        def again(tried: _Try) -> bool:
            return tried.retryable and (deadline is None or self._now() < deadline)

        def before_pause(tried: _Try, attempt: int, delay: float) -> None:
            self._recorder.retry(kind)
            self._log.warning(
                "notification delivery failed; retrying",
                **self._fields(item),
                attempt=attempt,
                retry_in_seconds=round(delay, 3),
                error=tried.message,
            )

        # One idiom for every retry (canary.retrying): backoff with jitter, Retry-After honoured.
        tried, attempts = retrying(
            policy,
            lambda _: self._try_once(item),
            again=again,
            retry_after=lambda tried: tried.retry_after,
            before_pause=before_pause,
            sleep=self._sleep,
            rng=self._rng,
        )
        if tried.cancelled:
            self._log.info("notification not sent: dropped from the outbox", **self._fields(item))
            return
        if tried.abandoned:
            if item.entry is not None:
                # Not lost: the outbox keeps it for whoever leads next (or this replica, later).
                with self._lock:
                    self._seen.pop(item.entry.key, None)
                self._log.info("notification left in the outbox", **self._fields(item), attempts=attempts - 1)
                return
            self._recorder.outcome(kind, Outcome.DROPPED)
            self._log.warning("notification dropped: shutdown", **self._fields(item), attempts=attempts - 1)
            return
        if tried.delivered:
            self._recorder.outcome(kind, Outcome.DELIVERED)
            self._log.info("notification delivered", **self._fields(item), attempts=attempts)
            self._forget(item)
            return
        self._recorder.outcome(kind, Outcome.FAILED)
        self._log.error(
            "notification delivery failed", **self._fields(item), attempts=attempts, error=tried.message
        )
        if tried.retryable and deadline is not None:
            reason, why = Loss.EXPIRED, f"still failing when its retry horizon ran out: {tried.message}"
        elif tried.retryable:
            reason, why = Loss.EXPIRED, f"still failing after its last retry: {tried.message}"
        else:
            reason, why = Loss.REJECTED, tried.message
        self._lose(item, reason, why, attempts)

    def _forget(self, item: _Item) -> None:
        """Remove a delivered (or given up) item from the outbox."""
        if self._outbox is None or item.entry is None:
            return
        try:
            self._outbox.remove(item.entry)
        except Exception as error:
            # It stays stored: a restart or a takeover sends it once more (at least once).
            self._log.warning(
                "notification outbox could not be updated; it may be sent again after a restart",
                **self._fields(item),
                error=self._redactor.scrub(f"{type(error).__name__}: {error}"),
            )

    def _lose(self, item: _Item, reason: Loss, message: str, attempts: int) -> None:
        """A notification people will never get: counted, logged, told as an Event, forgotten."""
        self._recorder.lost(item.destination.kind, reason)
        self._log.error(
            "notification lost", **self._fields(item), reason=reason.value, attempts=attempts, error=message
        )
        self._forget(item)
        self._report_failure(item, message, attempts)

    def _lose_entry(self, entry: OutboxEntry, reason: Loss, message: str, *, remove: bool = False) -> None:
        destination = Destination(entry.destination, TargetKind(entry.kind), _Unsendable())
        item = _Item(entry.notification, destination, entry.deadline, entry if remove else None)
        self._lose(item, reason, message, 0)

    def _try_once(self, item: _Item) -> _Try:
        """One delivery attempt; what it says about trying again. Never raises."""
        if self._abandon.is_set():
            return _Try(abandoned=True)
        if item.entry is not None:
            with self._lock:
                cancelled = item.entry.key in self._cancelled
                self._cancelled.discard(item.entry.key)
            if cancelled:
                return _Try(abandoned=True, cancelled=True)
            if not self._may_deliver():
                return _Try(abandoned=True)  # only the leader sends what is in an outbox
        # What it says goes to the Events of the notification's namespace: scrubbed with its values.
        scrub = self._redactor.for_namespace(item.notification.namespace).scrub
        try:
            item.destination.sender.send(item.notification)
        except DeliveryError as error:
            return _Try(
                message=scrub(str(error)),
                retryable=error.retryable,
                retry_after=error.retry_after,
            )
        except SecretUnavailable as error:
            # A missing or unreadable secret is configuration; the message names the reference.
            return _Try(message=scrub(str(error)))
        except Exception as error:  # a bug in a sender must not kill the lane
            self._log.error(
                "notification sender raised unexpectedly",
                **self._fields(item),
                traceback=self._redactor.scrub("".join(traceback.format_exception(error))),
            )
            return _Try(message=scrub(f"{type(error).__name__}: {error}"))
        return _Try(delivered=True)

    def _report_failure(self, item: _Item, message: str, attempts: int) -> None:
        """Tell the InferenceService's Events that its people were not told (without the secret)."""
        if (
            item.destination.kind is TargetKind.KUBERNETES_EVENT
            or item.notification.action is NotificationAction.NOTIFICATION_FAILED
        ):
            return
        events = [d for d in self._defaults if d.kind is TargetKind.KUBERNETES_EVENT]
        if not events or self._closed:
            return
        original = item.notification
        failure = replace(
            original,
            id=f"{original.id}/failed/{item.destination.key}",
            action=NotificationAction.NOTIFICATION_FAILED,
            reason="",  # the default for the action: NotificationFailed
            severity=Severity.WARNING,
            summary=(
                f"The {original.action.value} notification for decision {original.id} was not delivered to "
                f"{item.destination.key} after {attempts} attempt(s) and is given up: {message}"
            ),
            reasons=(),
            checks=(),
        )
        self._submit_to(failure, events)

    def _fields(self, item: _Item) -> dict[str, str]:
        notification = item.notification
        return {
            "destination": item.destination.key,
            "target_kind": item.destination.kind.value,
            "decision_id": notification.id,
            "action": notification.action.value,
            "inference_service": notification.model,
        }

    # -- shutdown -------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, in_flight_grace: float = 2.0) -> bool:
        """Stop accepting, deliver what is queued for up to ``timeout`` seconds, drop the rest.

        Past ``timeout`` no new attempt starts, and close waits up to ``in_flight_grace`` more seconds
        for the attempts already on the wire: one that lands after close returned would be a second
        sender beside whoever resumes the outbox next (the same message twice, minutes apart).

        Returns True if every lane drained in time.
        """
        with self._lock:
            self._closed = True
            lanes = list(self._lanes.values())
        deadline = time.monotonic() + max(0.0, timeout)
        for lane in lanes:
            with lane.condition:
                lane.closing = True
                lane.condition.notify_all()
        for lane in lanes:
            if lane.thread is not None:
                lane.thread.join(max(0.0, deadline - time.monotonic()))
        if all(lane.thread is None or not lane.thread.is_alive() for lane in lanes):
            return True
        self._abandon.set()
        grace_deadline = time.monotonic() + max(0.0, in_flight_grace)
        for lane in lanes:
            if lane.thread is not None:
                lane.thread.join(max(0.0, grace_deadline - time.monotonic()))
        for lane in lanes:
            with lane.condition:
                leftovers = list(lane.items)
                lane.items.clear()
            for item in leftovers:
                if item.entry is not None:
                    self._log.info("notification left in the outbox: shutdown", **self._fields(item))
                    continue
                self._recorder.outcome(item.destination.kind, Outcome.DROPPED)
                self._log.warning("notification dropped: shutdown", **self._fields(item), attempts=0)
        return False

    @property
    def closed(self) -> bool:
        return self._closed
