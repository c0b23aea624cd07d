"""Delivering notifications without ever making a rollout wait for them.

:meth:`NotificationDispatcher.submit` only puts the notification into memory and returns; the
network happens on worker threads. The shape, and why:

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
  timeouts, 408/425/429, 5xx), a bounded number of attempts; 429/503 ``Retry-After`` is honoured
  (up to ``max_retry_after``). Other answers (400, 403, 404, a missing secret) fail at once. The
  loop is :func:`canary.retrying.retrying`, the same idiom and :class:`RetryPolicy` shape as the
  Prometheus client's; the budget (attempts, backoff, a total pause ``budget``) is the ``retry``
  parameter, :data:`~canary.retrying.NOTIFICATION_RETRY` by default.
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
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from canary.notify.delivery import DeliveryError, Sender, TargetKind
from canary.notify.message import Notification, NotificationAction, Severity
from canary.notify.metrics import DeliveryRecorder, Outcome, default_recorder
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


@dataclass(slots=True)
class _Item:
    notification: Notification
    destination: Destination


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

    def _wait_unless_abandoned(self, seconds: float) -> None:
        self._abandon.wait(seconds)

    # -- intake ---------------------------------------------------------------------------------

    def submit(self, notification: Notification, destinations: Iterable[Destination] = ()) -> Submission:
        """Queue ``notification`` for the default destinations and ``destinations``. Never blocks on I/O."""
        return self._submit_to(notification, (*self._defaults, *destinations))

    def _submit_to(self, notification: Notification, destinations: Iterable[Destination]) -> Submission:
        accepted: list[str] = []
        duplicates: list[str] = []
        filtered: list[str] = []
        dropped: list[str] = []
        evicted: list[_Item] = []
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
                lane = None if closed else self._lane_for(destination)
                if lane is None:
                    dropped.append(destination.key)
                    self._recorder.outcome(destination.kind, Outcome.DROPPED)
                    continue
                self._remember(seen_key)
                # Offered under the dispatcher lock so close() cannot slip in between the check
                # above and the enqueue and strand the item in a lane whose worker has exited.
                victim = lane.offer(_Item(notification, destination))
                if victim is not None and victim.notification is notification:
                    # Refused at the door (its queue holds only warnings): it was never accepted,
                    # so a later re-submission is not a duplicate.
                    del self._seen[seen_key]
                    dropped.append(destination.key)
                else:
                    accepted.append(destination.key)
                if victim is not None:
                    evicted.append(victim)
        for victim in evicted:
            self._recorder.outcome(victim.destination.kind, Outcome.DROPPED)
            self._log.warning(
                "notification dropped: queue full",
                **self._fields(victim),
                severity=victim.notification.severity.value,
                queue_capacity=self._queue_capacity,
            )
        if closed and dropped:
            self._log.warning(
                "notification dropped: dispatcher closed", destinations=dropped, decision_id=notification.id
            )
        return Submission(tuple(accepted), tuple(duplicates), tuple(filtered), tuple(dropped))

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
            self._retry,
            lambda _: self._try_once(item),
            again=lambda tried: tried.retryable,
            retry_after=lambda tried: tried.retry_after,
            before_pause=before_pause,
            sleep=self._sleep,
            rng=self._rng,
        )
        if tried.abandoned:
            self._recorder.outcome(kind, Outcome.DROPPED)
            self._log.warning("notification dropped: shutdown", **self._fields(item), attempts=attempts - 1)
            return
        if tried.delivered:
            self._recorder.outcome(kind, Outcome.DELIVERED)
            self._log.info("notification delivered", **self._fields(item), attempts=attempts)
            return
        self._recorder.outcome(kind, Outcome.FAILED)
        self._log.error(
            "notification delivery failed", **self._fields(item), attempts=attempts, error=tried.message
        )
        self._report_failure(item, tried.message, attempts)

    def _try_once(self, item: _Item) -> _Try:
        """One delivery attempt; what it says about trying again. Never raises."""
        if self._abandon.is_set():
            return _Try(abandoned=True)
        try:
            item.destination.sender.send(item.notification)
        except DeliveryError as error:
            return _Try(
                message=self._redactor.scrub(str(error)),
                retryable=error.retryable,
                retry_after=error.retry_after,
            )
        except SecretUnavailable as error:
            # A missing or unreadable secret is configuration; the message names the reference.
            return _Try(message=self._redactor.scrub(str(error)))
        except Exception as error:  # a bug in a sender must not kill the lane
            self._log.error(
                "notification sender raised unexpectedly",
                **self._fields(item),
                traceback=self._redactor.scrub("".join(traceback.format_exception(error))),
            )
            return _Try(message=self._redactor.scrub(f"{type(error).__name__}: {error}"))
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
                f"{item.destination.key} after {attempts} attempt(s): {message}"
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

    def close(self, timeout: float = 10.0) -> bool:
        """Stop accepting, deliver what is queued for up to ``timeout`` seconds, drop the rest.

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
        for lane in lanes:
            with lane.condition:
                leftovers = list(lane.items)
                lane.items.clear()
            for item in leftovers:
                self._recorder.outcome(item.destination.kind, Outcome.DROPPED)
                self._log.warning("notification dropped: shutdown", **self._fields(item), attempts=0)
        return False

    @property
    def closed(self) -> bool:
        return self._closed
