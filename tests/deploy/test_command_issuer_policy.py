"""The command-issuer ValidatingAdmissionPolicy, evaluated (issue 17, item 4).

Everyone who may edit ConfigMaps could rewrite a rollout's state or leave a command in someone
else's name; the policy lets people and tools change only ``command.json`` and ``command-issuer`` of
the controller's ConfigMaps, the issuer being their own username. Its CEL runs here in cel-python
(tests/deploy/admission.py) for the Kustomize component, the installable overlays and the Helm chart.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from canary.kserve.store import (
    COMMAND_ISSUER_KEY,
    COMMAND_KEY,
    COMMAND_RESULT_KEY,
    EXPLAIN_KEY,
    LABEL_INFERENCE_SERVICE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    STATE_KEY,
    state_configmap_name,
)
from tests.deploy.admission import Request, Verdict, admit, kubernetes_extensions_used
from tests.deploy.manifests import DEPLOY, KUSTOMIZATIONS, Manifest, kustomize, of_kind, parse, render_chart

CONTROLLER = "system:serviceaccount:kserve-canary:kserve-canary"
ALICE = "alice@example.com"
MALLORY = "mallory@example.com"
MODEL = "iris"

RENDERS: dict[str, Callable[[], list[Manifest]]] = {
    "kustomize component": lambda: parse(
        (DEPLOY / "components" / "admission-policies" / "command-issuer.yaml").read_text()
    ),
    "kustomize cluster-wide": lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]),
    "helm defaults": render_chart,
}


@pytest.fixture(params=sorted(RENDERS))
def issuer_policy(request: pytest.FixtureRequest) -> Manifest:
    (found,) = [
        p
        for p in of_kind(RENDERS[request.param](), "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-command-issuer")
    ]
    return found


def state(name: str = MODEL, **data: str) -> dict[str, Any]:
    """A state ConfigMap as canary/kserve/store.py writes it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": state_configmap_name(name),
            "namespace": "models",
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INFERENCE_SERVICE: name},
        },
        "data": {STATE_KEY: '{"phase":"Progressing"}', EXPLAIN_KEY: "{}", **data},
    }


def with_command(configmap: dict[str, Any], issuer: str | None, by: str = ALICE) -> dict[str, Any]:
    """``configmap`` with a command as ``kserve-canary pause`` leaves it (merge patch of two keys)."""
    changed = copy.deepcopy(configmap)
    changed["data"][COMMAND_KEY] = json.dumps({"command": "pause", "by": by, "id": "c1"})
    if issuer is not None:
        changed["data"][COMMAND_ISSUER_KEY] = issuer
    return changed


def edited(configmap: dict[str, Any], **data: str) -> dict[str, Any]:
    changed = copy.deepcopy(configmap)
    changed["data"].update(data)
    return changed


def update(new: dict[str, Any], old: dict[str, Any], user: str) -> Request:
    return Request("UPDATE", user, "", "v1", "configmaps", new, old)


def create(new: dict[str, Any], user: str) -> Request:
    return Request("CREATE", user, "", "v1", "configmaps", new, None)


def verdict(policy: Manifest, request: Request) -> Verdict:
    found = admit(policy, request)
    assert found.applies, "the policy must apply to the controller's ConfigMaps"
    return found


def test_a_command_issued_in_ones_own_name_is_admitted(issuer_policy: Manifest) -> None:
    answered = edited(state(), **{COMMAND_RESULT_KEY: '{"accepted":true}'})
    for request in (
        update(with_command(state(), ALICE), state(), ALICE),
        update(with_command(answered, ALICE), answered, ALICE),  # the last answer stays as it was
        # A second command by someone else, once the first was read.
        update(with_command(state(), MALLORY, by=MALLORY), with_command(state(), ALICE), MALLORY),
        # Withdrawing a waiting command (the controller would have consumed it the same way).
        update(state(), with_command(state(), ALICE), MALLORY),
        # Metadata only (the garbage collector's ownerReferences, a label added by a tool).
        update(state() | {"metadata": {**state()["metadata"], "annotations": {"x": "y"}}}, state(), MALLORY),
    ):
        assert verdict(issuer_policy, request).admitted, request


def test_a_forged_issuer_is_denied(issuer_policy: Manifest) -> None:
    for request in (
        update(with_command(state(), ALICE, by=ALICE), state(), MALLORY),  # in Alice's name
        update(with_command(state(), None, by=MALLORY), state(), MALLORY),  # no issuer key at all
        update(with_command(state(), "", by=MALLORY), state(), MALLORY),
        # Alice's waiting command re-attributed without touching command.json ...
        update(with_command(state(), ALICE), with_command(state(), MALLORY, by=MALLORY), MALLORY),
        # ... or one's own command replaced while the issuer key still names Alice.
        update(with_command(state(), ALICE, by=MALLORY) | {}, with_command(state(), ALICE), MALLORY),
        # A state ConfigMap created by hand with a command in it.
        create(with_command(state(), ALICE), MALLORY),
    ):
        found = verdict(issuer_policy, request)
        assert not found.admitted, request
    (message,) = verdict(issuer_policy, update(with_command(state(), ALICE), state(), MALLORY)).denials
    assert "cannot be left in someone else's name" in message


def test_a_non_controller_editing_the_state_is_denied(issuer_policy: Manifest) -> None:
    ledger = state(f"{MODEL}.ledger") | {"data": {"ledger.json": '{"rolledBack":["iris-predictor-00002"]}'}}
    outbox = state() | {"metadata": {"name": f"{MODEL}-kserve-canary-outbox", "namespace": "models"}}
    for label, request in {
        "rewrite state.json": update(edited(state(), **{STATE_KEY: '{"phase":"Succeeded"}'}), state(), ALICE),
        "delete state.json": update(state() | {"data": {EXPLAIN_KEY: "{}"}}, state(), ALICE),
        "forge the answer": update(
            edited(state(), **{COMMAND_RESULT_KEY: '{"accepted":true}'}), state(), ALICE
        ),
        "forge explain.json": update(edited(state(), **{EXPLAIN_KEY: "\x1b[2J"}), state(), ALICE),
        "empty the ledger": update(ledger | {"data": {"ledger.json": "{}"}}, ledger, ALICE),
        "rewrite the outbox": update(edited(outbox, entries="[]"), outbox, ALICE),
        "create a forged state": create(state(), ALICE),
        # Dropping the label does not take the ConfigMap out of the policy (the name still matches,
        # and an UPDATE is judged by the old object's labels too).
        "unlabel and rewrite": update(
            {**edited(state(), **{STATE_KEY: "{}"}), "metadata": {"name": "kserve-canary-iris"}},
            state(),
            ALICE,
        ),
        "command with a forged state": update(
            edited(with_command(state(), ALICE), **{STATE_KEY: "{}"}), state(), ALICE
        ),
    }.items():
        assert not verdict(issuer_policy, request).admitted, label


def test_the_controller_and_other_configmaps_are_not_concerned(issuer_policy: Manifest) -> None:
    rewritten = edited(with_command(state(), ALICE), **{STATE_KEY: '{"phase":"Paused"}'})
    # The controller consumes the command and writes the state and its answer.
    consumed = edited(state(), **{STATE_KEY: '{"phase":"Paused"}', COMMAND_RESULT_KEY: "{}"})
    for request in (update(consumed, rewritten, CONTROLLER), create(state(), CONTROLLER)):
        assert not admit(issuer_policy, request).applies
    other = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "app-config"},
        "data": {STATE_KEY: "x"},
    }
    assert not admit(issuer_policy, update(edited(other, **{STATE_KEY: "y"}), other, ALICE)).applies
    assert kubernetes_extensions_used(issuer_policy) == set()
    assert issuer_policy["spec"]["failurePolicy"] == "Fail"
    assert "DELETE" not in issuer_policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"]


def test_helm_names_the_release_service_account_in_the_issuer_policy() -> None:
    manifests = render_chart({"serviceAccount": {"name": "canary-bot"}}, name="canary", namespace="platform")
    (found,) = [
        p
        for p in of_kind(manifests, "ValidatingAdmissionPolicy")
        if "command-issuer" in p["metadata"]["name"]
    ]
    bot = "system:serviceaccount:platform:canary-bot"
    assert found["spec"]["matchConditions"][0]["expression"] == f'request.userInfo.username != "{bot}"'
    assert not admit(found, update(edited(state(), **{STATE_KEY: "{}"}), state(), bot)).applies
    assert not admit(found, update(edited(state(), **{STATE_KEY: "{}"}), state(), CONTROLLER)).admitted


def test_a_namespace_editor_cannot_fill_the_controllers_configmaps(issuer_policy: Manifest) -> None:
    """Issue #34, finding 3: the label alone let anyone store ConfigMaps of any size for the controller
    to list; people may now write only a command, of bounded size, under a state's name."""
    labelled = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INFERENCE_SERVICE: MODEL}

    def configmap(name: str, **parts: Any) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "models", "labels": labelled},
            **parts,
        }

    big = json.dumps({"command": "pause", "by": ALICE, "id": "c1", "reason": "x" * 5000})
    command = {
        COMMAND_KEY: json.dumps({"command": "pause", "by": ALICE, "id": "c1"}),
        COMMAND_ISSUER_KEY: ALICE,
    }
    for label, request in {
        "a command under a name the controller never reads": create(configmap("junk", data=command), ALICE),
        "a command under the ledger's name": create(
            configmap(f"kserve-canary-{MODEL}.ledger", data=command), ALICE
        ),
        "a 5 KB command": update(
            edited(state(), **{COMMAND_KEY: big, COMMAND_ISSUER_KEY: ALICE}), state(), ALICE
        ),
        "a long issuer": update(with_command(state(), "a" * 600, by=ALICE) | {}, state(), "a" * 600),
        "binaryData": create(configmap(state_configmap_name(MODEL), binaryData={"b": "eHh4"}), ALICE),
        "binaryData beside a command": update(
            with_command(state(), ALICE) | {"binaryData": {"b": "eA=="}}, state(), ALICE
        ),
    }.items():
        assert not verdict(issuer_policy, request).admitted, label
    # A command of its own under the state's name is still admitted, created or left.
    assert verdict(
        issuer_policy, create(configmap(state_configmap_name(MODEL), data=command), ALICE)
    ).admitted
    assert verdict(issuer_policy, update(with_command(state(), ALICE), state(), ALICE)).admitted
    # A waiting command left before the limits stays readable through metadata edits.
    old = edited(state(), **{COMMAND_KEY: big, COMMAND_ISSUER_KEY: ALICE})
    annotated = old | {"metadata": {**old["metadata"], "annotations": {"x": "y"}}}
    assert verdict(issuer_policy, update(annotated, old, MALLORY)).admitted
