"""One team's receivers cannot starve another team's notifications (docs/security.md, "Fairness
between namespaces"): the real dispatcher, the real Slack sender and loopback receivers over HTTP.

Team A is hostile or just unlucky: its receiver answers 503 for the whole test (an outage retried
until the notification's horizon), or its policies name more destinations than its namespace may
have lanes. Team B's rollback must reach team B's receiver within a second or two all the same —
even when both teams name the documented reference ``env SLACK_WEBHOOK_URL`` (each reads its own
value), which before made them share one lane."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from canary.notify.destinations import destination_for
from canary.notify.dispatcher import Destination, NotificationDispatcher
from canary.notify.outbox import RetryHorizon
from canary.notify.secrets import Redactor, SecretResolver
from canary.policy.model import NotifyTarget, SecretRef, SlackTarget, WebhookTarget
from canary.rollout.vocabulary import decision_id
from tests.notify.support import Receiver, Reply, rollback_notification

# Team B's rollback is told within this long of its decision (its receiver answers at once).
TOLD_WITHIN = 3.0


def slack(resolver: SecretResolver, env: str = "SLACK_WEBHOOK_URL") -> Destination:
    target = NotifyTarget(slack=SlackTarget(webhook_url_from=SecretRef(env=env)))
    return destination_for(target, resolver=resolver, timeout=(2.0, 5.0), ref="notify[0]")


def team_resolver(url: str, **more: str) -> SecretResolver:
    return SecretResolver(Redactor(), {"SLACK_WEBHOOK_URL": url, **more})


def rollback_of(namespace: str, model: str) -> object:
    return rollback_notification(
        id=decision_id(namespace, model, f"{model}-predictor-00002", "rolled-back"),
        namespace=namespace,
        inference_service=model,
    )


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    team_a, team_b = Receiver(), Receiver()
    yield team_a, team_b
    team_a.stop()
    team_b.stop()


def test_a_receiver_outage_in_one_namespace_does_not_hold_another_namespaces_rollback_notice(
    receivers: tuple[Receiver, Receiver],
) -> None:
    team_a, team_b = receivers
    team_a.reply(*[Reply(status=503, body=b"down") for _ in range(200)])
    dispatcher = NotificationDispatcher(horizon=RetryHorizon(20.0, 20.0))
    try:
        a_slack = slack(team_resolver(team_a.url + "/services/T0/A0/team-a-token"))
        b_slack = slack(team_resolver(team_b.url + "/services/T0/B0/team-b-token"))
        assert a_slack.key == b_slack.key  # the same documented reference, two values
        assert dispatcher.submit(rollback_of("team-a", "fraud"), [a_slack]).accepted
        team_a.wait_for(1)  # team A's outage has begun: its notification is being retried
        started = time.monotonic()
        assert dispatcher.submit(rollback_of("team-b", "fraud"), [b_slack]).accepted
        (told,) = team_b.wait_for(1, timeout=TOLD_WITHIN + 2)
        took = time.monotonic() - started
        assert took < TOLD_WITHIN, f"team B's rollback was told after {took:.1f}s"
        assert "team-b" in told.body.decode()
        assert all(r.path.startswith("/services/T0/A0/") for r in team_a.requests)  # never crossed
    finally:
        dispatcher.close(timeout=0.5, in_flight_grace=0.5)


def test_one_namespace_naming_many_destinations_takes_only_its_own_lanes(
    receivers: tuple[Receiver, Receiver],
) -> None:
    """Team A's policies name 64 destinations (more than a policy may, over several policies): its
    namespace gets its share of lanes, the rest of its notices are refused and reported, and team
    B's rollback is still accepted and told."""
    team_a, team_b = receivers
    hooks = {f"HOOK_{index}": f"{team_a.url}/hook/{index}" for index in range(64)}
    a_resolver = team_resolver(team_a.url, **hooks)
    a_hooks = [
        destination_for(NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(env=env))), resolver=a_resolver)
        for env in hooks
    ]
    dispatcher = NotificationDispatcher(horizon=RetryHorizon(20.0, 20.0))
    try:
        submitted = dispatcher.submit(rollback_of("team-a", "spam"), a_hooks)
        assert 0 < len(submitted.accepted) < 64 and submitted.dropped  # its own share, no more
        started = time.monotonic()
        told = dispatcher.submit(rollback_of("team-b", "fraud"), [slack(team_resolver(team_b.url + "/s/B"))])
        assert told.accepted and not told.dropped, told
        team_b.wait_for(1, timeout=TOLD_WITHIN + 2)
        assert time.monotonic() - started < TOLD_WITHIN
    finally:
        dispatcher.close(timeout=0.5, in_flight_grace=0.5)
