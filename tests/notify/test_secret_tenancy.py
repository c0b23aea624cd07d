"""Tenant Secret values in the redactor: each namespace's values scrub only its own Events and
statuses, each value has a size cap, and rotations cost a bounded, flat amount (issue #34, finding 2).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from canary.notify.events import KubernetesEventSender
from canary.notify.secrets import (
    MASK,
    MAX_KEY_BYTES,
    MAX_REFERENCES_PER_NAMESPACE,
    MAX_URL_BYTES,
    Redactor,
    SecretResolver,
    SecretUnavailable,
)
from canary.policy.model import SecretRef
from tests.notify.support import EventApiServer, rollback_notification

SECRET_NAME = "kserve-canary-notifications"
# Team A's signing key happens to be ordinary words that team B's messages carry.
TEAM_A_KEY = "rolled back to the stable revision"


def _resolver(redactor: Redactor, namespace: str, data: Mapping[str, str]) -> SecretResolver:
    """A PromotionPolicy object's resolver: keys of its namespace's Secret, as the controller reads them."""

    def read(secret_namespace: str, name: str) -> Mapping[str, str] | None:
        assert (secret_namespace, name) == (namespace, SECRET_NAME)
        return data

    return SecretResolver(redactor, {}).from_namespace_secret(namespace, read, SECRET_NAME)


def test_one_namespaces_value_never_masks_another_namespaces_event(apiserver: EventApiServer) -> None:
    redactor = Redactor()  # the process-wide one, as the controller has it
    _resolver(redactor, "team-a", {"GATE_KEY": TEAM_A_KEY}).resolve_key(SecretRef(env="GATE_KEY"))
    sender = KubernetesEventSender(apiserver.api_client(), redactor=redactor, reporting_instance="r")

    team_b = rollback_notification(namespace="team-b")
    sender.send(team_b)
    (event,) = [event for (namespace, _), event in apiserver.events.items() if namespace == "team-b"]
    assert "rolled back to the stable revision" in event["message"]
    assert MASK not in event["message"]

    # Team A's own Event is masked with its value, and so is every log line (all namespaces').
    sender.send(rollback_notification(namespace="team-a"))
    (own,) = [event for (namespace, _), event in apiserver.events.items() if namespace == "team-a"]
    assert TEAM_A_KEY not in own["message"]
    assert MASK in own["message"]
    assert redactor.scrub(f"log: {TEAM_A_KEY}") == f"log: {MASK}"


def test_a_namespaces_status_is_scrubbed_with_its_values_only() -> None:
    redactor = Redactor()
    _resolver(redactor, "team-a", {"GATE_KEY": TEAM_A_KEY}).resolve_key(SecretRef(env="GATE_KEY"))
    line = f"fraud-predictor-00007 {TEAM_A_KEY}: error-rate 7.1% > 1%"
    assert redactor.for_namespace("team-b").scrub(line) == line
    assert (
        redactor.for_namespace("team-a").scrub(line) == f"fraud-predictor-00007 {MASK}: error-rate 7.1% > 1%"
    )


def test_values_over_their_caps_are_refused_naming_the_reference_and_the_cap() -> None:
    url = "https://hooks.example.com/" + "a" * MAX_URL_BYTES
    key = "k" * (MAX_KEY_BYTES + 1)
    redactor = Redactor()
    resolver = _resolver(redactor, "team-a", {"URL": url, "KEY": key})
    with pytest.raises(SecretUnavailable) as too_long_url:
        resolver.resolve(SecretRef(env="URL"))
    assert str(too_long_url.value) == (
        f"key URL of Secret team-a/{SECRET_NAME} is {len(url)} bytes, over the {MAX_URL_BYTES} bytes "
        "a URL may have: store only the URL in it"
    )
    with pytest.raises(SecretUnavailable, match=f"over the {MAX_KEY_BYTES} bytes a signing key may have"):
        resolver.resolve_key(SecretRef(env="KEY"))
    # Nothing of a refused value is kept.
    assert url not in redactor
    assert key not in redactor
    with pytest.raises(SecretUnavailable, match="shorter than 16 characters"):
        _resolver(redactor, "team-a", {"KEY": "rolled back"}).resolve_key(SecretRef(env="KEY"))


def test_rotations_drop_old_values_and_each_read_costs_the_same() -> None:
    """3,000 rotations of one key: only the current and previous values are kept, and the last reads
    cost what the first did (with one regex over every value ever seen, each read recompiled it)."""
    redactor = Redactor()
    data = {"KEY": ""}
    resolver = _resolver(redactor, "team-a", data)
    ref = SecretRef(env="KEY")
    took: list[float] = []
    for rotation in range(3000):
        data["KEY"] = f"signing-key-{rotation:06d}-" + "x" * 200
        start = time.perf_counter()
        resolver.resolve_key(ref)
        took.append(time.perf_counter() - start)
    assert f"signing-key-{2999:06d}-" + "x" * 200 in redactor
    assert f"signing-key-{2998:06d}-" + "x" * 200 in redactor
    assert f"signing-key-{2997:06d}-" + "x" * 200 not in redactor
    first, last = sorted(took[:200])[100], sorted(took[-200:])[100]
    assert last < max(5 * first, 0.0005), (first, last)  # medians: flat, and well under a millisecond


def test_a_namespace_keeps_a_bounded_number_of_references() -> None:
    redactor = Redactor()
    data = {f"KEY_{index}": f"signing-key-number-{index:04d}" for index in range(200)}
    resolver = _resolver(redactor, "team-a", data)
    for index in range(200):
        resolver.resolve_key(SecretRef(env=f"KEY_{index}"))
    kept = [index for index in range(200) if f"signing-key-number-{index:04d}" in redactor]
    assert kept == list(range(200 - MAX_REFERENCES_PER_NAMESPACE, 200))


def test_the_logs_are_scrubbed_with_every_namespaces_values_longest_first_at_a_flat_cost() -> None:
    """Logs belong to no namespace: every value masks them, the longest first across namespaces (team
    A's value, a prefix of team B's URL, must not leave B's token in sight), and a line costs about the
    same with 1,000 namespaces' values as with 10."""
    redactor = Redactor()
    team_b_url = "https://hooks.example.com/deploy/b-token-0123456789abcdef"
    _resolver(redactor, "team-b", {"URL": team_b_url}).resolve(SecretRef(env="URL"))
    _resolver(redactor, "team-a", {"URL": "https://hooks.example.com/deploy"}).resolve(SecretRef(env="URL"))
    assert redactor.scrub(f"POST {team_b_url} failed") == f"POST {MASK} failed"
    line = "notification delivery failed: fraud-predictor-00007 error-rate 7.1% > 1%; " * 4

    def cost() -> float:
        took = []
        for _ in range(200):
            start = time.perf_counter()
            redactor.scrub(line)
            took.append(time.perf_counter() - start)
        return sorted(took)[100]

    for index in range(8):
        _resolver(
            redactor, f"team-{index}", {"URL": f"https://hooks.example.com/t/{index:04d}/abcdef"}
        ).resolve(SecretRef(env="URL"))
    few = cost()
    for index in range(8, 1000):
        _resolver(
            redactor, f"team-{index}", {"URL": f"https://hooks.example.com/t/{index:04d}/abcdef"}
        ).resolve(SecretRef(env="URL"))
    many = cost()
    assert redactor.scrub("https://hooks.example.com/t/0999/abcdef") == MASK
    assert many < max(3 * few, 0.0005), (few, many)
