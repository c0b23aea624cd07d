"""The reconciler keeps the record of past rollouts (rollouts.json) through every write of the state
ConfigMap, and never overwrites one it cannot read (against the API emulator over HTTP)."""

from __future__ import annotations

from canary_sandbox.emulator import Emulator
from kubernetes import client

from canary.controller.reconciler import Reconciler
from canary.kserve.store import ROLLOUTS_KEY, STATE_KEY, ConfigMapStateStore
from canary.notify import NotificationDispatcher
from canary.rollout.past import PastRollouts, RolloutOutcome
from canary.rollout.state import Phase, RolloutState
from tests.controller.test_reconciler import policy_for_llama, world  # noqa: F401 - the fixture
from tests.rollout.test_past_rollouts import _entry

# A state of an earlier object of that name (deleted and re-created): the reconciler replaces it, a write.
EARLIER = RolloutState(inference_service_uid="uid-of-an-earlier-object", phase=Phase.SUCCEEDED, revision="x")

World = tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher]


def _stored_text(api: client.ApiClient) -> str | None:
    return ConfigMapStateStore(api).load("ml", "llama").rollouts_json


def test_a_recorded_rollout_survives_the_writes_of_decisions_that_end_none(world: World) -> None:  # noqa: F811
    _, api, reconciler, _ = world
    record = PastRollouts().with_rollout(_entry(1))
    ConfigMapStateStore(api).save_files(
        "ml", "llama", {STATE_KEY: EARLIER.to_json(), ROLLOUTS_KEY: record.to_json()},
        resource_version=None, owner_uid=None,
    )  # fmt: skip
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.wrote_state and outcome.store_reason == "uid", outcome  # the state is replaced
    assert ConfigMapStateStore(api).load("ml", "llama").state().phase is Phase.IDLE
    assert _stored_text(api) == record.to_json()
    (kept,) = ConfigMapStateStore(api).load("ml", "llama").past_rollouts().rollouts
    assert kept.outcome is RolloutOutcome.PROMOTED


def test_an_unreadable_record_is_kept_as_it_is(world: World) -> None:  # noqa: F811
    _, api, reconciler, _ = world
    ConfigMapStateStore(api).save_files(
        "ml", "llama", {STATE_KEY: EARLIER.to_json(), ROLLOUTS_KEY: '{"schemaVersion": 1, "rollouts": 7'},
        resource_version=None, owner_uid=None,
    )  # fmt: skip
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is None and outcome.wrote_state
    assert _stored_text(api) == '{"schemaVersion": 1, "rollouts": 7'


def test_a_removed_policy_pauses_and_keeps_the_record(world: World) -> None:  # noqa: F811
    _, api, reconciler, _ = world
    record = PastRollouts().with_rollout(_entry(1)).with_rollout(_entry(2))
    active = RolloutState(phase=Phase.PROGRESSING, revision="llama-predictor-00002")
    ConfigMapStateStore(api).save_files(
        "ml", "llama", {STATE_KEY: active.to_json(), ROLLOUTS_KEY: record.to_json()},
        resource_version=None, owner_uid=None,
    )  # fmt: skip
    reconciler.pause_removed(policy_for_llama().policy)  # type: ignore[attr-defined]
    stored = ConfigMapStateStore(api).load("ml", "llama")
    assert stored.state().phase is Phase.PAUSED
    assert stored.past_rollouts() == record
