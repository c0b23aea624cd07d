"""A notification is never lost silently (issue 11, item 3): it waits in an outbox ConfigMap and is
retried until its horizon; giving it up is an Event, a metric and a log line.

Real HTTP throughout: a loopback receiver that fails on purpose (tests/notify/outage.py) and the API
emulator, over HTTP, for the outbox ConfigMaps and the Events. The retry schedule is the product's
shape (five attempts of doubling, jittered pauses is what used to be the whole budget) at a tenth of
a second, and the horizons are seconds, so every test takes a few seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.stack import inference_service
from kubernetes import client, config
from prometheus_client import CollectorRegistry

from canary.kserve.admitted import list_states
from canary.kserve.outbox import OUTBOX_KEY, ConfigMapOutboxStore, outbox_configmap_name
from canary.notify.delivery import TargetKind
from canary.notify.destinations import destination_for, destinations_for, events_destination
from canary.notify.dispatcher import Destination, NotificationDispatcher
from canary.notify.message import Notification, NotificationAction, Severity
from canary.notify.metrics import PrometheusDeliveryRecorder
from canary.notify.outbox import Outbox, OutboxEntry, RetryHorizon
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.webhook import IDEMPOTENCY_HEADER
from canary.policy.model import NotifyTarget, SecretRef, SlackTarget, WebhookTarget
from canary.retrying import RetryPolicy
from canary.rollout.artefact import Artefact
from canary.rollout.vocabulary import decision_id
from tests.notify.outage import OutageReceiver
from tests.notify.support import make_notification, rollback_notification

NS = "ml"
MODEL = "llama-chat"
HOOK = "/hooks/deploy"
SLACK = "/services/T0/B0/slack-secret-token"
# What the old dispatcher did in total (5 attempts, doubling jittered pauses), ten times faster.
FIVE_ATTEMPTS = RetryPolicy(attempts=5, backoff=0.1, max_backoff=0.2, jitter=True)
OLD_BUDGET_SECONDS = 0.1 + 0.2 + 0.2 + 0.2  # the most those five attempts could wait in all
UID: list[str] = [""]  # the InferenceService's, set by the `api` fixture: it owns the outbox


@pytest.fixture
def api(tmp_path: Path) -> Iterator[client.ApiClient]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace(NS)
        api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        # The outbox is owned by the InferenceService (a ConfigMap owned by nothing is collected).
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", NS, "inferenceservices", inference_service(NS, MODEL, "s3://m/v1")
        )
        UID[0] = created["metadata"]["uid"]
        yield api


@pytest.fixture
def receiver() -> Iterator[OutageReceiver]:
    started = OutageReceiver()
    yield started
    started.stop()


class World:
    """One controller's notification side: a dispatcher, its outbox and its metrics."""

    def __init__(self, api: client.ApiClient, receiver: OutageReceiver, **options: Any) -> None:
        self.api = api
        self.redactor = Redactor()
        self.resolver = SecretResolver(
            self.redactor, {"HOOK_URL": receiver.url + HOOK, "SLACK_URL": receiver.url + SLACK}
        )
        self.targets = [
            NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(env="HOOK_URL"))),
            NotifyTarget(slack=SlackTarget(webhook_url_from=SecretRef(env="SLACK_URL"))),
        ]
        # Short timeouts: a slow receiver is a timed-out attempt, retried.
        self.destinations = destinations_for(self.targets, resolver=self.resolver, timeout=(0.5, 0.5))
        self.registry = CollectorRegistry()
        self.outbox = options.pop("outbox", None) or Outbox(ConfigMapOutboxStore(api))
        self.events = events_destination(api, resolver=self.resolver)
        self.dispatcher = NotificationDispatcher(
            [self.events],
            retry=options.pop("retry", FIVE_ATTEMPTS),
            horizon=options.pop("horizon", RetryHorizon(30.0, 30.0)),
            outbox=self.outbox,
            recorder=PrometheusDeliveryRecorder(self.registry),
            redactor=self.redactor,
            **options,
        )

    def resolve(self, entry: OutboxEntry) -> Destination | None:
        return next((d for d in self.destinations if d.ref == entry.ref), None)

    def lost(self, channel: TargetKind, reason: str) -> float:
        value = self.registry.get_sample_value(
            "kserve_canary_notifications_lost_total", {"channel": channel.value, "reason": reason}
        )
        return value or 0.0

    def stored(self) -> list[dict[str, Any]]:
        """The outbox ConfigMap's entries, as stored."""
        try:
            found = client.CoreV1Api(self.api).read_namespaced_config_map(outbox_configmap_name(MODEL), NS)
        except client.ApiException:
            return []
        return list(json.loads((found.data or {}).get(OUTBOX_KEY) or '{"entries": []}')["entries"])

    def failure_events(self) -> list[client.CoreV1Event]:
        items = client.CoreV1Api(self.api).list_namespaced_event(NS).items
        return [event for event in items if event.reason == "NotificationFailed"]


def eventually(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def uid() -> str:
    return UID[0]


def started(**overrides: Any) -> Notification:
    values: dict[str, Any] = {
        "inference_service_uid": uid(),
        "id": decision_id(NS, MODEL, "llama-chat-predictor-00002", "started"),
        "action": NotificationAction.STARTED,
        "summary": "Canary llama-chat-predictor-00002 started at 10%.",
        "from_weight": None,
        "to_weight": 10,
    }
    return make_notification(**(values | overrides))


def rollback(**overrides: Any) -> Notification:
    return rollback_notification(**({"inference_service_uid": uid()} | overrides))


def test_a_receiver_down_for_longer_than_the_old_retry_budget_still_gets_the_message(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    world = World(api, receiver)
    receiver.status = 500
    notification = started()
    world.dispatcher.submit(notification, world.destinations)
    assert eventually(lambda: len(world.stored()) == 2), "stored before it is sent, one entry per destination"

    outage_started = time.monotonic()
    receiver.wait_requests(2)
    time.sleep(3 * OLD_BUDGET_SECONDS)  # 500s for longer than the five attempts would have lasted
    receiver.go_down()  # then connection refused
    time.sleep(1.0)
    receiver.come_up(status=503, delay=1.0)  # then overloaded: slower than the sender's 0.5s timeout
    time.sleep(1.2)
    receiver.come_up(status=200, delay=0.0)  # and healthy again

    hooks = receiver.wait_accepted(HOOK)
    slacks = receiver.wait_accepted(SLACK)
    assert time.monotonic() - outage_started > 4 * OLD_BUDGET_SECONDS
    assert eventually(lambda: world.stored() == []), "delivered: taken out of the outbox"
    time.sleep(0.3)
    # Delivered once to each, after many more attempts than the old budget allowed ...
    assert len(receiver.accepted(HOOK)) == len(hooks) == 1
    assert len(receiver.accepted(SLACK)) == len(slacks) == 1
    attempts = [r for r in receiver.requests if r.path.startswith(HOOK)]
    assert len([r for r in attempts if not r.accepted]) > FIVE_ATTEMPTS.attempts
    # ... every attempt with the same idempotency key, the decision id, in the header and the payload.
    assert {r.headers[IDEMPOTENCY_HEADER] for r in attempts} == {notification.id}
    assert json.loads(hooks[0].body)["id"] == notification.id
    assert world.failure_events() == []
    assert world.lost(TargetKind.WEBHOOK, "expired") == world.lost(TargetKind.SLACK, "expired") == 0
    world.dispatcher.close(timeout=2)


def test_the_outbox_survives_a_dispatcher_restart_and_keeps_the_idempotency_key(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    """The in-process half of the restart guarantee (the controller process: tests/e2e)."""
    receiver.status = 503
    first = World(api, receiver)
    # What each revision serves is stored with it: a resumed message names it as the first would have.
    notification = rollback(
        canary_artefact=Artefact("s3://m/llama/v2", runtime="kserve-vllm", model_format="huggingface"),
        stable_artefact=Artefact(image="ghcr.io/acme/llama:1"),
    )
    first.dispatcher.submit(notification, first.destinations)
    receiver.wait_requests(2)
    first.dispatcher.close(timeout=0.2)  # gives up waiting: what is in flight stays in the outbox
    assert len(first.stored()) == 2

    receiver.come_up(status=200)
    second = World(api, receiver)
    pending = second.outbox.pending(NS, MODEL)
    assert [entry.notification for entry in pending] == [notification, notification]
    assert second.dispatcher.resume(pending, second.resolve) == 2
    hooks = receiver.wait_accepted(HOOK)
    assert hooks[0].headers[IDEMPOTENCY_HEADER] == notification.id
    assert json.loads(hooks[0].body)["artefacts"]["stable"]["image"] == "ghcr.io/acme/llama:1"
    assert eventually(lambda: second.stored() == [])
    # Resumed twice (a second leader, an overlapping tick): still sent once.
    assert second.dispatcher.resume(pending, second.resolve) == 0
    second.dispatcher.close(timeout=2)
    assert len(receiver.accepted(HOOK)) == 1


def test_nothing_is_sent_after_close_returns(api: client.ApiClient, receiver: OutageReceiver) -> None:
    """An attempt on the wire when close gives up is waited for: a message that landed after close
    returned would be sent a second time by whoever resumes the outbox (the CI failure of the test
    above: its in-flight attempt reached a receiver that had come up in the meantime)."""
    receiver.come_up(status=200, delay=0.3)  # slow, but inside the sender's 0.5 s timeout
    world = World(api, receiver)
    world.dispatcher.submit(rollback(), world.destinations[:1])
    receiver.wait_arrivals(1)  # the attempt is on the wire, its answer 0.3 s away
    world.dispatcher.close(timeout=0.0)
    at_close = len(receiver.accepted(HOOK))
    time.sleep(1.0)
    assert len(receiver.accepted(HOOK)) == at_close == 1
    assert world.stored() == [], "delivered before close returned: taken out of the outbox"


def test_a_notification_past_its_retry_horizon_is_reported_lost(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    receiver.go_down()
    logs = structlog.testing.CapturingLogger()
    world = World(api, receiver, horizon=RetryHorizon(important=1.5, informational=1.0), logger=logs)
    notification = rollback()
    world.dispatcher.submit(notification, world.destinations[:1])

    assert eventually(lambda: world.lost(TargetKind.WEBHOOK, "expired") == 1, 15)
    (line,) = [call for call in logs.calls if call.args == ("notification lost",)]
    assert line.method_name == "error"
    assert (line.kwargs["reason"], line.kwargs["decision_id"]) == ("expired", notification.id)
    assert HOOK not in str(line.kwargs)
    assert eventually(lambda: len(world.failure_events()) == 1, 10)
    (event,) = world.failure_events()
    assert event.type == "Warning"
    assert notification.id in event.message
    assert "retry horizon" in event.message
    # Redacted: the scheme and host of the receiver, never its path (where a token lives).
    assert "ConnectionError" in event.message
    assert HOOK not in event.message and "HOOK_URL" in event.message
    assert world.stored() == [], "given up: out of the outbox"
    world.dispatcher.close(timeout=2)


def test_a_permanent_rejection_is_reported_lost_at_once(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    receiver.status = 404
    world = World(api, receiver)
    world.dispatcher.submit(rollback(), world.destinations[:1])
    assert eventually(lambda: world.lost(TargetKind.WEBHOOK, "rejected") == 1)
    assert len(receiver.requests) == 1, "a 404 is not retried"
    assert eventually(lambda: len(world.failure_events()) == 1)
    assert eventually(lambda: world.stored() == [])
    world.dispatcher.close(timeout=2)


def test_the_outbox_is_bounded(api: client.ApiClient, receiver: OutageReceiver) -> None:
    receiver.go_down()
    world = World(api, receiver, outbox=Outbox(ConfigMapOutboxStore(api), max_entries=3))
    important = rollback()
    world.dispatcher.submit(important, world.destinations[:1])
    infos = [started(id=f"advance-{n}", action=NotificationAction.ADVANCED) for n in range(4)]
    for info in infos:
        world.dispatcher.submit(info, world.destinations[:1])

    stored = [entry["notification"]["id"] for entry in world.stored()]
    # Three entries at most; the oldest informational ones made room, the rollback stayed.
    assert stored == [important.id, infos[2].id, infos[3].id]
    assert world.lost(TargetKind.WEBHOOK, "dropped") == 2
    assert eventually(lambda: len(world.failure_events()) == 2)
    assert all("no room in the outbox" in (e.message or "") for e in world.failure_events())
    # Full of important ones: an arriving one replaces the oldest, an informational one is refused.
    for n in range(3):
        world.dispatcher.submit(rollback(id=f"rollback-{n}"), world.destinations[:1])
    assert [entry["notification"]["id"] for entry in world.stored()] == [f"rollback-{n}" for n in range(3)]
    submission = world.dispatcher.submit(started(id="late-info"), world.destinations[:1])
    assert submission.dropped == (world.destinations[0].key,)
    assert [entry["notification"]["id"] for entry in world.stored()] == [f"rollback-{n}" for n in range(3)]
    assert world.lost(TargetKind.WEBHOOK, "dropped") == 2 + 3 + 1
    world.dispatcher.close(timeout=0.2)


def test_the_outbox_is_bounded_in_bytes_too(api: client.ApiClient, receiver: OutageReceiver) -> None:
    receiver.go_down()
    world = World(api, receiver, outbox=Outbox(ConfigMapOutboxStore(api), max_bytes=8 * 1024))
    for n in range(40):
        world.dispatcher.submit(started(id=f"advance-{n}", summary="x" * 500), world.destinations[:1])
    text = client.CoreV1Api(api).read_namespaced_config_map(outbox_configmap_name(MODEL), NS).data[OUTBOX_KEY]
    assert len(text.encode()) <= 8 * 1024
    assert 0 < len(world.stored()) < 40
    assert world.lost(TargetKind.WEBHOOK, "dropped") == 40 - len(world.stored())
    world.dispatcher.close(timeout=0.2)


def test_the_stored_form_holds_references_not_secret_urls(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    receiver.go_down()
    world = World(api, receiver)
    world.dispatcher.submit(started(), world.destinations)
    assert eventually(lambda: len(world.stored()) == 2)
    found = client.CoreV1Api(api).read_namespaced_config_map(outbox_configmap_name(MODEL), NS)
    text = json.dumps(found.data)
    assert receiver.url not in text and "slack-secret-token" not in text
    assert [entry["ref"] for entry in world.stored()] == ["notify[0]", "notify[1]"]
    # Next to the state, owned by the InferenceService (without blocking its deletion), and not a
    # state itself.
    assert found.metadata.labels == {
        "app.kubernetes.io/managed-by": "kserve-canary",
        "kserve-canary.dev/inference-service": MODEL,
    }
    (owner,) = found.metadata.owner_references
    assert (owner.kind, owner.name, owner.block_owner_deletion) == ("InferenceService", MODEL, False)
    assert list_states(api, NS, ignored=lambda *_: None) == []
    world.dispatcher.close(timeout=0.2)


def test_a_replica_that_is_not_the_leader_leaves_the_outbox_alone(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    leading = [True]
    receiver.status = 500
    world = World(api, receiver, may_deliver=lambda: leading[0])
    world.dispatcher.submit(started(), world.destinations[:1])
    receiver.wait_requests(1)
    leading[0] = False  # the Lease went to another replica
    count = len(receiver.requests)
    time.sleep(1.0)
    assert len(receiver.requests) <= count + 1, "at most the attempt in flight"
    assert len(world.stored()) == 1, "left for the next leader, not lost"
    assert world.lost(TargetKind.WEBHOOK, "expired") == 0
    world.dispatcher.close(timeout=0.2)


def test_a_stored_destination_the_policy_no_longer_names_is_reported_lost(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    receiver.go_down()
    first = World(api, receiver)
    first.dispatcher.submit(started(), first.destinations[:1])
    first.dispatcher.close(timeout=0.2)
    second = World(api, receiver)
    other = destination_for(
        NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(env="OTHER_URL"))),
        resolver=second.resolver,
        ref="notify[0]",
    )
    assert second.dispatcher.resume(second.outbox.pending(NS, MODEL), lambda entry: other) == 0
    assert second.lost(TargetKind.WEBHOOK, "unconfigured") == 1
    assert eventually(lambda: second.stored() == [])
    second.dispatcher.close(timeout=0.2)


def test_informational_notifications_have_the_shorter_horizon() -> None:
    horizon = RetryHorizon(important=3600, informational=600)
    assert horizon.for_notification(started()) == 600
    assert horizon.for_notification(rollback()) == 3600
    promoted = started(action=NotificationAction.PROMOTED, severity=Severity.INFO)
    assert horizon.for_notification(promoted) == 3600


def test_teams_and_discord_are_kept_in_the_outbox_like_slack(
    api: client.ApiClient, receiver: OutageReceiver
) -> None:
    teams, discord = (
        "/workflows/abc/triggers/manual?sig=teams-secret-sig",
        "/api/webhooks/1/discord-secret-token",
    )
    world = World(api, receiver)
    world.resolver = SecretResolver(
        world.redactor, {"TEAMS_URL": receiver.url + teams, "DISCORD_URL": receiver.url + discord}
    )
    targets = [
        NotifyTarget.model_validate({"teams": {"webhookUrlFrom": {"env": "TEAMS_URL"}}}),
        NotifyTarget.model_validate({"discord": {"webhookUrlFrom": {"env": "DISCORD_URL"}}}),
    ]
    destinations = destinations_for(targets, resolver=world.resolver, timeout=(0.5, 0.5))
    assert [d.durable for d in destinations] == [True, True]
    receiver.go_down()
    world.dispatcher.submit(started(), destinations)
    assert eventually(lambda: len(world.stored()) == 2)
    stored = json.dumps(world.stored())
    assert "teams-secret-sig" not in stored and "discord-secret-token" not in stored
    receiver.come_up()
    assert receiver.wait_accepted("/workflows/abc")[0].body.startswith(b'{"type": "message"')
    assert b'"embeds"' in receiver.wait_accepted("/api/webhooks/1")[0].body
    assert eventually(lambda: world.stored() == []), "delivered: taken out of the outbox"
    world.dispatcher.close(timeout=0.5)
