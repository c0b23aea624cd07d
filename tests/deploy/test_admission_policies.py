"""The shipped ValidatingAdmissionPolicies, evaluated (issue 17, item 5).

RBAC grants the controller ``update`` on every ConfigMap and ``patch`` on every InferenceService;
two policies narrow what those verbs can do, for the controller's service account only. Their CEL
runs here in cel-python (tests/deploy/admission.py) against concrete requests, for the Kustomize
component and for the Helm chart (which fills in the release's namespace and service account).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import helm_python as helm
import pytest

from canary.kserve.store import LABEL_INFERENCE_SERVICE, LABEL_MANAGED_BY, MANAGED_BY, state_configmap_name
from tests.deploy.admission import Request, Verdict, admit, kubernetes_extensions_used
from tests.deploy.manifests import (
    CHART,
    DEPLOY,
    INSTALLABLE,
    KUSTOMIZATIONS,
    Manifest,
    kustomize,
    of_kind,
    parse,
    render_chart,
)
from tests.deploy.scenario import ScenarioResult

CONTROLLER = "system:serviceaccount:kserve-canary:kserve-canary"
SOMEONE_ELSE = "system:serviceaccount:ml-team:argo-cd"
MODEL = "iris"

RENDERS: dict[str, Callable[[], list[Manifest]]] = {
    "kustomize component": lambda: [
        *parse((DEPLOY / "components" / "admission-policies" / "admission-policies.yaml").read_text()),
        *parse((DEPLOY / "components" / "admission-policies" / "command-issuer.yaml").read_text()),
    ],
    "kustomize cluster-wide": lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]),
    "helm defaults": render_chart,
}


def policy(manifests: list[Manifest], suffix: str) -> Manifest:
    (found,) = [
        p for p in of_kind(manifests, "ValidatingAdmissionPolicy") if p["metadata"]["name"].endswith(suffix)
    ]
    return found


@pytest.fixture(params=sorted(RENDERS))
def manifests(request: pytest.FixtureRequest) -> list[Manifest]:
    return RENDERS[request.param]()


# -- ConfigMaps ---------------------------------------------------------------------------------


def state(name: str = MODEL, **labels: str) -> dict[str, Any]:
    """A state ConfigMap as canary/kserve/store.py writes it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": state_configmap_name(name),
            "namespace": "models",
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INFERENCE_SERVICE: name, **labels},
        },
        "data": {"state.json": "{}"},
    }


def configmap(
    name: str, namespace: str = "kube-system", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"mapRoles": "- rolearn: x"}}


def cm(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None, user: str = CONTROLLER
) -> Request:
    return Request(operation, user, "", "v1", "configmaps", new, old)


def test_the_controller_writes_its_state_configmaps(manifests: list[Manifest]) -> None:
    configmaps = policy(manifests, "-state-configmaps")
    written = copy.deepcopy(state())
    written["data"]["explain.json"] = "{}"
    # Its notification outbox, beside the state: the same labels, its own name.
    outbox = state() | {"metadata": {**state()["metadata"], "name": f"{MODEL}-kserve-canary-outbox"}}
    # Its rollback ledger: a state ConfigMap of its own ("<model>.ledger").
    ledger = state(f"{MODEL}.ledger")
    for request in (
        cm("CREATE", state(), None),
        cm("UPDATE", written, state()),
        cm("DELETE", None, state()),
        cm("CREATE", outbox, None),
        cm("UPDATE", outbox, outbox),
        cm("CREATE", ledger, None),
    ):
        verdict = admit(configmaps, request)
        assert verdict.applies and verdict.admitted, (request.operation, verdict)


@pytest.mark.parametrize(
    ("label", "request_"),
    [
        ("update kube-system/aws-auth", cm("UPDATE", configmap("aws-auth"), configmap("aws-auth"))),
        ("update coredns", cm("UPDATE", configmap("coredns"), configmap("coredns"))),
        ("create an unlabelled ConfigMap", cm("CREATE", configmap("kserve-canary-iris", "models"), None)),
        ("delete an unlabelled ConfigMap", cm("DELETE", None, configmap("aws-auth"))),
        # Claiming a foreign ConfigMap by adding the label to it.
        ("claim aws-auth", cm("UPDATE", state("x") | {"metadata": {**state("x")["metadata"], "name": "aws-auth"}},
                              configmap("aws-auth"))),
        ("claim by adding the label", cm("UPDATE", state(), configmap("kserve-canary-iris", "models"))),
        # Removing (or changing) the state label.
        ("remove the label", cm("UPDATE", configmap("kserve-canary-iris", "models", {}), state())),
        ("change managed-by", cm("UPDATE", state(**{LABEL_MANAGED_BY: "helm"}), state())),
        # A label that does not match the name: no state ConfigMap of another name.
        ("name and label disagree", cm("CREATE", state() | {"metadata": {**state()["metadata"], "name": "coredns"}}, None)),
        ("labels, but not ours", cm("CREATE", configmap("kserve-canary-iris", "models", {"app": "x"}), None)),
        ("an outbox of another model", cm("CREATE", state() | {"metadata": {**state()["metadata"], "name": "x-kserve-canary-outbox"}}, None)),
    ],
)  # fmt: skip
def test_the_controller_cannot_touch_other_configmaps(
    manifests: list[Manifest], label: str, request_: Request
) -> None:
    verdict = admit(policy(manifests, "-state-configmaps"), request_)
    assert verdict.applies and not verdict.admitted, label


def test_the_configmap_policy_applies_to_the_controller_only(manifests: list[Manifest]) -> None:
    configmaps = policy(manifests, "-state-configmaps")
    for user in (SOMEONE_ELSE, "system:serviceaccount:kserve-canary:default", "alice@example.com"):
        verdict = admit(configmaps, cm("UPDATE", configmap("aws-auth"), configmap("aws-auth"), user=user))
        assert verdict == Verdict(applies=False), user
    (condition,) = configmaps["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{CONTROLLER}"'
    # Events and Leases are not ConfigMaps: the policy does not even look at them.
    event = Request("CREATE", CONTROLLER, "", "v1", "events", {"metadata": {"name": "e"}}, None)
    assert admit(configmaps, event) == Verdict(applies=False)


# -- InferenceServices ----------------------------------------------------------------------------


def isvc(**predictor: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": MODEL,
            "namespace": "models",
            "labels": {"team": "ml"},
            "annotations": {"serving.kserve.io/deploymentMode": "Serverless"},
            "resourceVersion": "41",
            "generation": 3,
        },
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "serviceAccountName": "iris-reader",
                "model": {"modelFormat": {"name": "sklearn"}, "storageUri": "s3://models/iris/v2"},
                **predictor,
            }
        },
        "status": {"observedGeneration": 3},
    }


def patched(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    changed = copy.deepcopy(base)
    change(changed)
    # What the apiserver changes itself on every write.
    changed["metadata"]["resourceVersion"] = "42"
    changed["metadata"]["generation"] = 4
    return changed


def update(new: dict[str, Any], old: dict[str, Any], user: str = CONTROLLER) -> Request:
    return Request("UPDATE", user, "serving.kserve.io", "v1beta1", "inferenceservices", new, old)


def set_weight(weight: int) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["spec"]["predictor"].__setitem__("canaryTrafficPercent", weight)


ADMITTED = {
    "start a canary (field added)": (isvc(), set_weight(10)),
    "next step": (isvc(canaryTrafficPercent=10), set_weight(50)),
    "roll back (0)": (isvc(canaryTrafficPercent=50), set_weight(0)),
    "promote (field removed, merge patch null)": (
        isvc(canaryTrafficPercent=50),
        lambda o: o["spec"]["predictor"].pop("canaryTrafficPercent"),
    ),
    "unchanged": (isvc(canaryTrafficPercent=10), lambda o: None),
}

DENIED = {
    "image changed": (
        isvc(containers=[{"name": "kserve-container", "image": "ghcr.io/acme/iris:1"}]),
        lambda o: o["spec"]["predictor"]["containers"][0].__setitem__("image", "evil.example/miner:latest"),
    ),
    "storageUri changed": (
        isvc(canaryTrafficPercent=10),
        lambda o: o["spec"]["predictor"]["model"].__setitem__("storageUri", "s3://attacker/model"),
    ),
    "storageUri changed with the weight": (
        isvc(canaryTrafficPercent=10),
        lambda o: (set_weight(50)(o), o["spec"]["predictor"]["model"].__setitem__("storageUri", "s3://x")),
    ),
    "predictor field added": (isvc(), lambda o: o["spec"]["predictor"].__setitem__("nodeName", "gpu-node-1")),
    "predictor field removed": (isvc(), lambda o: o["spec"]["predictor"].pop("serviceAccountName")),
    "transformer added": (isvc(), lambda o: o["spec"].__setitem__("transformer", {"containers": [{"image": "x"}]})),
    "annotation added": (isvc(), lambda o: o["metadata"]["annotations"].__setitem__("sidecar.istio.io/inject", "false")),
    "annotations removed": (isvc(), lambda o: o["metadata"].pop("annotations")),
    "label added": (isvc(), lambda o: o["metadata"]["labels"].__setitem__("networking.kserve.io/visibility", "exposed")),
    "finalizer removed": (
        isvc() | {"metadata": {**isvc()["metadata"], "finalizers": ["inferenceservice.finalizers"]}},
        lambda o: o["metadata"].pop("finalizers"),
    ),
    "weight out of range": (isvc(canaryTrafficPercent=10), set_weight(250)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ADMITTED))
def test_the_controller_may_move_traffic(manifests: list[Manifest], case: str) -> None:
    old, change = ADMITTED[case]
    verdict = admit(policy(manifests, "-traffic-only"), update(patched(old, change), old))
    assert verdict.applies and verdict.admitted, verdict


@pytest.mark.parametrize("case", sorted(DENIED))
def test_the_controller_may_change_nothing_else(manifests: list[Manifest], case: str) -> None:
    old, change = DENIED[case]
    verdict = admit(policy(manifests, "-traffic-only"), update(patched(old, change), old))
    assert verdict.applies and not verdict.admitted, case


def test_the_controller_never_creates_or_deletes_inference_services(manifests: list[Manifest]) -> None:
    traffic = policy(manifests, "-traffic-only")
    for operation, new, old in (("CREATE", isvc(), None), ("DELETE", None, isvc())):
        request = Request(
            operation, CONTROLLER, "serving.kserve.io", "v1beta1", "inferenceservices", new, old
        )
        verdict = admit(traffic, request)
        assert verdict.applies and verdict.denials == (
            "kserve-canary never creates or deletes InferenceServices",
        )


def test_the_traffic_policy_applies_to_the_controller_only(manifests: list[Manifest]) -> None:
    traffic = policy(manifests, "-traffic-only")
    old, change = DENIED["image changed"]
    assert admit(traffic, update(patched(old, change), old, user=SOMEONE_ELSE)) == Verdict(applies=False)
    (condition,) = traffic["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{CONTROLLER}"'
    # Status is its own subresource ("inferenceservices/status"), not matched, and not granted by RBAC.
    assert all(
        rule["resources"] == ["inferenceservices"]
        for rule in traffic["spec"]["matchConstraints"]["resourceRules"]
    )


# -- both -----------------------------------------------------------------------------------------


def test_policies_fail_closed_deny_and_use_no_kubernetes_only_cel(manifests: list[Manifest]) -> None:
    policies = of_kind(manifests, "ValidatingAdmissionPolicy")
    bindings = of_kind(manifests, "ValidatingAdmissionPolicyBinding")
    assert len(policies) == 3 and len(bindings) == 3
    assert {b["spec"]["policyName"] for b in bindings} == {p["metadata"]["name"] for p in policies}
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert (
            "paramRef" not in binding["spec"] and "matchResources" not in binding["spec"]
        )  # every namespace
    for found in policies:
        assert found["spec"]["failurePolicy"] == "Fail"
        # cel-python has none of Kubernetes' CEL libraries; the policies need none, so every
        # expression above was really evaluated.
        assert kubernetes_extensions_used(found) == set()


def test_kustomize_and_helm_ship_the_same_policies() -> None:
    component = [
        *parse((DEPLOY / "components" / "admission-policies" / "admission-policies.yaml").read_text()),
        *parse((DEPLOY / "components" / "admission-policies" / "command-issuer.yaml").read_text()),
    ]
    chart = render_chart()

    def specs(manifests: list[Manifest]) -> dict[str, Any]:
        return {
            m["metadata"]["name"]: m["spec"] for m in manifests if m["kind"].startswith("ValidatingAdmission")
        }

    assert specs(component) == specs(chart)
    for name in INSTALLABLE:
        assert specs(kustomize(KUSTOMIZATIONS[name])) == specs(component), name


def test_helm_names_the_release_service_account() -> None:
    manifests = render_chart({"serviceAccount": {"name": "canary-bot"}}, name="canary", namespace="platform")
    for found in of_kind(manifests, "ValidatingAdmissionPolicy"):
        # The controller only, or (the command-issuer policy) everyone but the controller.
        condition = found["spec"]["matchConditions"][0]
        assert condition["expression"] in {
            f'request.userInfo.username {operator} "system:serviceaccount:platform:canary-bot"'
            for operator in ("==", "!=")
        }
    sa = next(m for m in manifests if m["kind"] == "ServiceAccount")
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == ("platform", "canary-bot")


def test_the_kustomize_username_is_the_service_account_the_overlays_bind() -> None:
    for name in INSTALLABLE:
        manifests = kustomize(KUSTOMIZATIONS[name])
        sa = next(m for m in manifests if m["kind"] == "ServiceAccount")
        user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
        for found in of_kind(manifests, "ValidatingAdmissionPolicy"):
            assert found["spec"]["matchConditions"][0]["expression"] in {
                f'request.userInfo.username {operator} "{user}"' for operator in ("==", "!=")
            }


def test_helm_admission_policies_follow_the_cluster_version(capfd: pytest.CaptureFixture[str]) -> None:
    assert len(of_kind(render_chart(), "ValidatingAdmissionPolicy")) == 3  # auto; Helm's default is >= 1.30
    assert not of_kind(render_chart({"admissionPolicies": {"enabled": False}}), "ValidatingAdmissionPolicy")
    # helm-python-sdk renders only for Helm's default version; lint takes a version, and reports a
    # template's fail() in Helm's log (lint mode), not as an error. The version test that gates
    # "auto" is the one that makes "true" fail on 1.29:
    capfd.readouterr()
    assert helm.lint(CHART, namespace="kserve-canary", kube_version="v1.29.0")["errors"] == []
    assert "needs Kubernetes >= 1.30" not in capfd.readouterr().err
    helm.lint(
        CHART, {"admissionPolicies": {"enabled": True}}, namespace="kserve-canary", kube_version="v1.29.0"
    )
    assert (
        "admissionPolicies.enabled=true needs Kubernetes >= 1.30 (this is v1.29.0)" in capfd.readouterr().err
    )
    helm.lint(
        CHART, {"admissionPolicies": {"enabled": True}}, namespace="kserve-canary", kube_version="v1.30.0"
    )
    assert "needs Kubernetes >= 1.30" not in capfd.readouterr().err


# -- the controller's real writes -----------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the apiserver applies the controller's patches."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def test_every_write_the_controller_really_makes_is_admitted(cluster_wide_run: ScenarioResult) -> None:
    """The controller as deployed, against the emulator (tests/deploy/scenario.py): each of its
    InferenceService patches and ConfigMap writes passes the shipped policies, so they deny only
    what the controller never does."""
    manifests = kustomize(KUSTOMIZATIONS["cluster-wide"])
    traffic, configmaps = policy(manifests, "-traffic-only"), policy(manifests, "-state-configmaps")
    writes = [e for e in cluster_wide_run.controller if e.method in {"POST", "PUT", "PATCH", "DELETE"}]
    patches = [e for e in writes if "/inferenceservices/" in e.path]
    state_writes = [e for e in writes if "/configmaps" in e.path]
    assert patches and state_writes, "the run wrote the first step and its state"
    for entry in patches:
        assert entry.method == "PATCH" and isinstance(entry.body, dict), entry
        for old in (isvc(), isvc(canaryTrafficPercent=10)):
            new = merge_patch(old, entry.body)
            assert admit(traffic, update(new, old)).admitted, entry.body
        # What the emulator saw change in the stored object: the weight alone.
        assert {p for p in entry.changed_paths if not p.startswith("metadata.")} <= {
            "spec.predictor.canaryTrafficPercent"
        }, entry.changed_paths
    for entry in state_writes:
        body = entry.body
        assert isinstance(body, dict), entry
        operation = {"POST": "CREATE", "PUT": "UPDATE"}[entry.method]
        verdict = admit(configmaps, cm(operation, body, body if operation == "UPDATE" else None))
        assert verdict.applies and verdict.admitted, (entry.method, entry.path, verdict)
