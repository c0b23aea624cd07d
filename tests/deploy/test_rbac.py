"""Least privilege, checked against what the controller really does.

The controller runs as deployed (the rendered Deployment's arguments, the image's pruned runtime)
against the API emulator; every request it makes is mapped to RBAC attributes the way the apiserver
does, and compared with the rendered Roles and ClusterRoles in both directions:

* a request the RBAC does not allow fails the test (the code needs a verb RBAC lacks);
* a rule verb no request used fails the test (RBAC grants what the code never uses).

A static scan of the shipped code (every Kubernetes API method it calls or watches) must find
exactly the (group, resource, verb) set the runs observed, so a new API call that no run exercises
fails here too — add it to the scenario and, if the controller makes it, to the RBAC.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import LoggedRequest

from tests.deploy.api_calls import scan
from tests.deploy.manifests import (
    CHART_VARIANTS,
    INSTALLABLE,
    KUSTOMIZATIONS,
    Manifest,
    kustomize,
    render_chart,
)
from tests.deploy.rbac import Attributes, Authorizer, Rule, attributes, implied_by_body, rules_of
from tests.deploy.scenario import (
    CONTROLLER_NAMESPACE,
    IDENTITY,
    MODEL,
    NAMESPACE,
    ONE_ROLLOUT_COMMANDS,
    READ_ONLY_COMMANDS,
    ScenarioResult,
)

SERVICE_ACCOUNT = ("kserve-canary", "kserve-canary")
NAMESPACED_CHART = {"watchNamespaces": [NAMESPACE]}


def requested(entries: Iterable[LoggedRequest]) -> list[Attributes]:
    """RBAC attributes of logged requests, with what their bodies imply (owner finalizers)."""
    found = []
    for entry in entries:
        request = attributes(entry.method, entry.path, entry.query)
        if request is None:
            continue  # non-resource URLs (discovery): granted to every authenticated user
        found.append(request)
        found.extend(implied_by_body(request, entry.body))
    return found


def controller_requests(run: ScenarioResult) -> list[Attributes]:
    return requested([*run.controller, *run.events_component])


def problems(manifests: list[Manifest], requests: list[Attributes]) -> list[str]:
    """Denied requests and unused grants of the controller's service account."""
    authorizer = Authorizer.for_service_account(manifests, *SERVICE_ACCOUNT)
    found = [f"denied: {r}" for r in sorted(set(requests)) if not authorizer.allows(r)]
    for grant in authorizer.grants:
        for group, resource, verb in sorted(grant.rule.grants()):
            used = any(r.triple == (group, resource, verb) and grant.allows(r) for r in requests)
            if not used:
                found.append(f"unused: {verb} {resource} ({grant})")
    return found


INSTALLS = {
    "kustomize cluster-wide": (lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]), "cluster_wide_run"),
    "kustomize prometheus-auth example": (
        lambda: kustomize(KUSTOMIZATIONS["prometheus-auth"]),
        "cluster_wide_run",
    ),
    "helm defaults": (lambda: render_chart(), "cluster_wide_run"),
    "kustomize single-namespace": (
        lambda: kustomize(KUSTOMIZATIONS["single-namespace"]),
        "single_namespace_run",
    ),
    "helm watchNamespaces": (lambda: render_chart(NAMESPACED_CHART), "single_namespace_run"),
}


@pytest.mark.e2e  # its run fixture is chosen per install, so the conftest cannot see it
@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_rbac_allows_exactly_the_requests_the_controller_makes(
    install: str, request: pytest.FixtureRequest
) -> None:
    render, run_fixture = INSTALLS[install]
    run: ScenarioResult = request.getfixturevalue(run_fixture)
    assert problems(render(), controller_requests(run)) == []


def test_the_comparison_fails_on_missing_and_extra_permissions(cluster_wide_run: ScenarioResult) -> None:
    manifests = kustomize(KUSTOMIZATIONS["cluster-wide"])
    requests = controller_requests(cluster_wide_run)
    lacking = yaml.safe_load(yaml.safe_dump(manifests))
    role = next(m for m in lacking if m["kind"] == "ClusterRole" and m["metadata"]["name"] == "kserve-canary")
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["events"]]
    assert "denied: create events in models" in problems(lacking, requests)
    generous = yaml.safe_load(yaml.safe_dump(manifests))
    role = next(
        m for m in generous if m["kind"] == "ClusterRole" and m["metadata"]["name"] == "kserve-canary"
    )
    role["rules"].append(
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete", "deletecollection"]}
    )
    found = problems(generous, requests)
    assert any(p.startswith("unused: delete configmaps") for p in found)
    assert any(p.startswith("unused: deletecollection configmaps") for p in found)
    # A new request the code would make (here: deleting its state) is denied.
    new = Attributes("", "configmaps", "delete", NAMESPACE, f"kserve-canary-{MODEL}")
    assert f"denied: {new}" in problems(manifests, [*requests, new])


def test_the_runs_exercise_what_the_rbac_is_about(
    cluster_wide_run: ScenarioResult, single_namespace_run: ScenarioResult
) -> None:
    for run in (cluster_wide_run, single_namespace_run):
        triples = {r.triple for r in controller_requests(run)}
        assert triples == {
            ("serving.kserve.io", "inferenceservices", "get"),
            ("serving.kserve.io", "inferenceservices", "list"),
            ("serving.kserve.io", "inferenceservices", "watch"),
            ("serving.kserve.io", "inferenceservices", "patch"),
            ("", "configmaps", "get"),
            ("", "configmaps", "list"),
            ("", "configmaps", "watch"),
            ("", "configmaps", "create"),
            ("", "configmaps", "update"),
            ("", "events", "create"),
            ("", "events", "patch"),
            ("kserve-canary.dev", "promotionpolicies", "get"),
            ("kserve-canary.dev", "promotionpolicies", "list"),
            ("kserve-canary.dev", "promotionpolicies", "watch"),
            ("kserve-canary.dev", "promotionpolicies/status", "update"),
            ("", "secrets", "get"),
            ("coordination.k8s.io", "leases", "get"),
            ("coordination.k8s.io", "leases", "create"),
            ("coordination.k8s.io", "leases", "update"),
        }
    # Cluster-wide: the list and watch span every namespace; single-namespace: nothing outside.
    assert {r.triple for r in controller_requests(cluster_wide_run) if r.namespace is None} == {
        ("serving.kserve.io", "inferenceservices", "list"),
        ("serving.kserve.io", "inferenceservices", "watch"),
        ("", "configmaps", "list"),
        ("", "configmaps", "watch"),
        ("kserve-canary.dev", "promotionpolicies", "list"),
        ("kserve-canary.dev", "promotionpolicies", "watch"),
    }
    # Secrets: the one named Secret of a PromotionPolicy's namespace, nothing else.
    secrets = [r for r in controller_requests(cluster_wide_run) if r.resource == "secrets"]
    assert secrets and {(r.namespace, r.name) for r in secrets} == {
        (NAMESPACE, "kserve-canary-notifications")
    }
    assert {r.namespace for r in controller_requests(single_namespace_run)} == {
        NAMESPACE,
        CONTROLLER_NAMESPACE,
        "knative-serving",
    }
    # knative-serving: Knative's progress deadline, one ConfigMap read by name, nothing else.
    for run in (cluster_wide_run, single_namespace_run):
        knative = {(r.triple, r.name) for r in controller_requests(run) if r.namespace == "knative-serving"}
        assert knative == {(("", "configmaps", "get"), "config-deployment")}
    leases = [r for r in controller_requests(cluster_wide_run) if r.resource == "leases"]
    assert {r.namespace for r in leases} == {CONTROLLER_NAMESPACE}
    assert {r.name for r in leases if r.verb != "create"} == {"kserve-canary"}


def test_static_scan_of_the_code_finds_exactly_the_requests_the_runs_made(
    cluster_wide_run: ScenarioResult,
) -> None:
    # The Lease calls only the sharded elector makes (list, delete of member Leases) run only with
    # --shards > 1, which these single-Lease runs do not use; their RBAC is checked against what sharded
    # replicas request in tests/controller/test_shards.py::test_the_chart_and_the_kustomize_component_grant_...
    sharded_only = {"list_namespaced_lease", "delete_namespaced_lease"}
    calls = [call for call in scan() if call.api_method not in sharded_only]
    static = set().union(*(call.triples for call in calls))
    observed = {r.triple for r in controller_requests(cluster_wide_run)}
    observed |= {r.triple for entries in cluster_wide_run.cli.values() for r in requested(entries)}
    sites = "\n".join(str(call) for call in calls)
    assert static == observed, (
        f"in the code but never exercised: {sorted(static - observed)}\n"
        f"exercised but not found in the code: {sorted(observed - static)}\ncall sites:\n{sites}"
    )
    # Calls without a namespace in their path are the cluster-wide lists (and watches) the runs saw.
    cluster_scoped = set().union(*(c.triples for c in calls if not c.namespaced))
    seen_cluster_wide = {r.triple for r in controller_requests(cluster_wide_run) if r.namespace is None}
    seen_cluster_wide |= {
        r.triple
        for entries in cluster_wide_run.cli.values()
        for r in requested(entries)
        if r.namespace is None
    }
    assert cluster_scoped == seen_cluster_wide


def test_state_configmaps_need_no_finalizers_permission(cluster_wide_run: ScenarioResult) -> None:
    """blockOwnerDeletion: false — so no update on inferenceservices/finalizers (OwnerReferences-
    PermissionEnforcement would demand it for true). If the code flipped it, the RBAC test would fail:
    the implied request is denied."""
    owners = cluster_wide_run.state_owner_references
    assert owners and owners[0]["kind"] == "InferenceService" and owners[0]["name"] == MODEL
    assert owners[0]["blockOwnerDeletion"] is False
    writes = [
        e for e in cluster_wide_run.controller if "/configmaps" in e.path and e.method in {"POST", "PUT"}
    ]
    assert writes and all(
        owner.get("blockOwnerDeletion") is False
        for e in writes
        for owner in (e.body.get("metadata") or {}).get("ownerReferences") or []
    )
    blocking: dict[str, Any] = {"metadata": {"ownerReferences": [{**owners[0], "blockOwnerDeletion": True}]}}
    write = Attributes("", "configmaps", "update", NAMESPACE, f"kserve-canary-{MODEL}")
    (implied,) = implied_by_body(write, blocking)
    assert implied == Attributes(
        "serving.kserve.io", "inferenceservices/finalizers", "update", NAMESPACE, MODEL
    )
    for name in INSTALLABLE:
        manifests = kustomize(KUSTOMIZATIONS[name])
        assert not Authorizer.for_service_account(manifests, *SERVICE_ACCOUNT).allows(implied)
        assert all("inferenceservices/finalizers" not in rule.resources for _, rule in rules_of(manifests))


def role_grants(manifests: list[Manifest], name: str) -> set[tuple[str, str, str]]:
    role = next(m for m in manifests if m["kind"] == "ClusterRole" and m["metadata"]["name"] == name)
    return set().union(*(Rule.parse(rule).grants() for rule in role["rules"]))


@pytest.mark.parametrize(
    "render", [lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]), render_chart], ids=["kustomize", "helm"]
)
def test_people_roles_match_what_the_cli_does(render: Any, cluster_wide_run: ScenarioResult) -> None:
    manifests = render()
    everything = {r.triple for entries in cluster_wide_run.cli.values() for r in requested(entries)}
    # Commands ask the apiserver who is issuing them (SelfSubjectReview): every authenticated user
    # may, through the system:basic-user ClusterRole of Kubernetes >= 1.28; no role of ours grants it.
    whoami = ("authentication.k8s.io", "selfsubjectreviews", "create")
    assert whoami in everything
    everything.discard(whoami)
    read_only = {r.triple for label in READ_ONLY_COMMANDS for r in requested(cluster_wide_run.cli[label])}
    assert role_grants(manifests, "kserve-canary-operator") == everything
    # The viewer reads no ConfigMap of a team's namespace: `status` falls back to the PromotionPolicy
    # statuses and the one named ConfigMap of file policies (tests/cli/test_viewer_role.py checks
    # those requests against the role, names included); `explain` needs the state ConfigMap itself.
    narrowed = {("", "configmaps", "list"), ("", "configmaps", "watch")}
    objects = {("kserve-canary.dev", "promotionpolicies", verb) for verb in ("get", "list", "watch")}
    assert role_grants(manifests, "kserve-canary-viewer") == (read_only - narrowed) | objects
    # Commands change only the state ConfigMap, never the InferenceService.
    for label, entries in cluster_wide_run.cli.items():
        for request in requested(entries):
            if request.verb not in {"get", "list", "watch"} and request.triple != whoami:
                assert (request.resource, request.name) == ("configmaps", f"kserve-canary-{MODEL}"), label
    # The controller's service account is not one of them.
    for binding in (m for m in manifests if m["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        assert binding["roleRef"]["name"] not in {"kserve-canary-operator", "kserve-canary-viewer"}


def test_one_rollout_is_readable_with_a_role_for_its_state_configmap_alone(
    cluster_wide_run: ScenarioResult,
) -> None:
    """docs/install.md: a Role with resourceNames [kserve-canary-<model>] and get is enough for
    `status NS/NAME` and `explain` of that model's rollout (a file policy's status lives there);
    explain also lists the InferenceService's Warning Events, and says so when it may not."""
    state_reader = Rule.parse(
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get"],
            "resourceNames": [f"kserve-canary-{MODEL}"],
        }
    )
    for label in ONE_ROLLOUT_COMMANDS:
        requests = requested(cluster_wide_run.cli[label])
        assert requests, label
        events = ("", "events", "list")
        refused = [
            r
            for r in requests
            if not (r.namespace == NAMESPACE and (state_reader.allows(r) or r.triple == events))
        ]
        assert not refused, f"{label}: {refused}"


def all_renders() -> dict[str, list[Manifest]]:
    renders = {f"kustomize {name}": kustomize(path) for name, path in KUSTOMIZATIONS.items()}
    renders.update({f"helm {name}": render_chart(values) for name, values in CHART_VARIANTS.items()})
    return renders


def test_no_wildcards_and_nothing_dangerous() -> None:
    dangerous_verbs = {"*", "escalate", "bind", "impersonate", "deletecollection"}
    for label, manifests in all_renders().items():
        for role in (m for m in manifests if m["kind"] in {"Role", "ClusterRole"}):
            assert "aggregationRule" not in role, label
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in (rule.get(key) or []), (
                        f"{label}: wildcard in {key} of {role['metadata']['name']}"
                    )
                assert "nonResourceURLs" not in rule, label
                assert not set(rule["verbs"]) & dangerous_verbs, label
                assert not {"pods/exec", "serviceaccounts/token"} & set(rule["resources"]), label
                if "secrets" in rule["resources"]:
                    # Only the one Secret a PromotionPolicy's secret references name, read.
                    assert rule["resources"] == ["secrets"], label
                    assert rule.get("resourceNames") == ["kserve-canary-notifications"], label
                    assert rule["verbs"] == ["get"], label
        for binding in (m for m in manifests if m["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
            assert binding["roleRef"]["name"] not in {"cluster-admin", "admin", "edit"}, label


def test_controller_runs_as_deployed(
    cluster_wide_run: ScenarioResult, single_namespace_run: ScenarioResult
) -> None:
    for run in (cluster_wide_run, single_namespace_run):
        assert run.exit_code == 0, run.log[-3000:]
        assert run.health == {"/healthz": 200, "/readyz": 200}
        assert run.first_step == 10
        assert run.lease_after_stop == {"holder": None}, "SIGTERM releases the Lease for the standby"
        assert "kserve_canary_leader 1.0" in run.metrics
        assert "is not in the kserve-canary image" not in run.log
        agents = {e.user_agent for e in run.controller}
        assert agents and all(agent.endswith(f"({IDENTITY})") for agent in agents)


def test_the_static_scan_sees_a_new_call(tmp_path: Any) -> None:
    """What a new API call in the code looks like to the scan (and so to the comparison above)."""
    module = tmp_path / "new_feature.py"
    module.write_text(
        "from kubernetes import client, watch\n"
        "def tidy(api):\n"
        "    core = client.CoreV1Api(api)\n"
        "    core.delete_namespaced_config_map('kserve-canary-x', 'models')\n"
        "    for pod in watch.Watch().stream(core.list_namespaced_pod, 'models'):\n"
        "        pass\n"
        "    client.CustomObjectsApi(api).get_cluster_custom_object('serving.kserve.io', 'v1alpha1', 'servingruntimes', 'x')\n"
    )
    found = {(call.api_method, call.resource, call.verbs, call.namespaced) for call in scan([module])}
    assert found == {
        ("delete_namespaced_config_map", "configmaps", ("delete",), True),
        ("list_namespaced_pod", "pods", ("list", "watch"), True),
        ("get_cluster_custom_object", "servingruntimes", ("get",), False),
    }
    ambiguous = tmp_path / "ambiguous.py"
    ambiguous.write_text("def f(events_api):\n    events_api.create_namespaced_event('ns', {})\n")
    with pytest.raises(AssertionError, match="cannot tell which API class"):
        scan([ambiguous])
