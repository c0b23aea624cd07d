"""PromotionPolicy objects against the API emulator over HTTP, with the controller running in-process
(canary.controller.runtime.Controller) and the official ``kubernetes`` client (docs/design.md §5):

* a valid object governs its InferenceService, and its status follows the rollout — written only
  when it changes (counted in the emulator's request log);
* an invalid object gets PolicyValid=False with the ``field: message`` text and one Event, and the
  other policies keep running;
* a file and an object for one model hold it (neither acts, both told); removing one hands it over;
* an object's secret reference reads a Secret of its own namespace, never the controller's env;
* custom PromQL from an object is refused without the flag;
* operator commands never write the object's spec.

Prometheus is unreachable: auto-start writes the first step without evidence, which is what these
tests need; later steps hold (query errors), so nothing moves on by itself.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import free_port
from canary_sandbox.receiver import WebhookReceiver
from canary_sandbox.stack import inference_service
from kubernetes import client, config
from typer.testing import CliRunner

from canary.cli import app
from canary.controller.runtime import Controller, build_controller
from canary.controller.settings import (
    ClusterSettings,
    ControllerSettings,
    LeaseSettings,
    NotifySettings,
    PolicyObjectSettings,
    PolicySettings,
    PolicySource,
    PrometheusSettings,
    ServingSettings,
    TickSettings,
)
from canary.kserve.file_status import FILE_STATUS_CONFIGMAP, FILE_STATUS_KEY
from canary.kserve.store import ConfigMapStateStore, state_configmap_name
from canary.policy.scope import SecretScope
from canary.rollout.state import Phase
from tests.policy.support import valid_policy

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy" / "crds" / "promotionpolicies.yaml"
GROUP, VERSION, PLURAL = "kserve-canary.dev", "v1alpha1", "promotionpolicies"
KSERVE = ("serving.kserve.io", "v1beta1")


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


@dataclass
class Stack:
    emulator: Emulator
    api: client.ApiClient
    kubeconfig: Path
    policies: Path
    controllers: list[tuple[Controller, threading.Thread]] = field(default_factory=list)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def model(self, name: str, namespace: str = "ml") -> None:
        self.custom.create_namespaced_custom_object(
            *KSERVE, namespace, "inferenceservices", inference_service(namespace, name, f"s3://m/{name}/v1")
        )
        assert wait_until(lambda: bool(self.predictor(name, namespace).get("latestRolledoutRevision")))

    def predictor(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(*KSERVE, namespace, "inferenceservices", name)
        return dict(((found.get("status") or {}).get("components") or {}).get("predictor") or {})

    def push(self, name: str, version: str, namespace: str = "ml") -> None:
        """A new predictor spec (a new revision), as a GitOps tool pushes it."""
        self.custom.patch_namespaced_custom_object(
            *KSERVE,
            namespace,
            "inferenceservices",
            name,
            {"spec": {"predictor": {"model": {"storageUri": f"s3://m/{name}/{version}"}}}},
        )

    def canary_percent(self, name: str, namespace: str = "ml") -> object:
        found = self.custom.get_namespaced_custom_object(*KSERVE, namespace, "inferenceservices", name)
        return found["spec"]["predictor"].get("canaryTrafficPercent")

    def apply_policy(self, document: dict[str, Any]) -> None:
        namespace = document["metadata"]["namespace"]
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, document)

    def policy(self, name: str, namespace: str = "ml") -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        return found

    def condition(self, name: str, kind: str, namespace: str = "ml") -> dict[str, Any] | None:
        conditions = (self.policy(name, namespace).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), None)

    def events_about(self, name: str, namespace: str = "ml") -> list[Any]:
        events = client.CoreV1Api(self.api).list_namespaced_event(namespace).items
        return [
            e
            for e in events
            if e.involved_object.kind == "PromotionPolicy" and e.involved_object.name == name
        ]

    def status_writes(self, name: str | None = None, since: int = 0) -> list[Any]:
        fragment = f"/{PLURAL}/{name}/status" if name else f"/{PLURAL}/"
        return [
            e
            for e in self.emulator.requests.entries(since=since)
            if e.method in {"PUT", "PATCH"} and fragment in e.path and e.path.endswith("/status")
        ]

    def spec_writes(self) -> list[Any]:
        return [
            e
            for e in self.emulator.requests.entries()
            if e.method in {"PUT", "PATCH", "POST", "DELETE"}
            and f"/{PLURAL}/" in e.path
            and not e.path.endswith("/status")
            and e.user_agent.startswith("kserve-canary/")
        ]

    def start(
        self,
        *,
        sources: frozenset[PolicySource] = frozenset({PolicySource.AUTO}),
        secrets: SecretScope | None = None,
        allow_custom_promql: bool = False,
        status_min_interval: float = 1.0,
        metrics_port: int = -1,
        tick: float = 0.3,
    ) -> Controller:
        settings = ControllerSettings(
            policies=PolicySettings(
                paths=(self.policies,), sources=sources, secrets=secrets or SecretScope(), reload_period=0.3
            ),
            objects=PolicyObjectSettings(
                allow_custom_promql=allow_custom_promql,
                crd_recheck=0.5,
                status_min_interval=status_min_interval,
            ),
            # Nothing listens there: every query fails, fast.
            prometheus=PrometheusSettings(
                url=f"http://127.0.0.1:{free_port()}", timeout=0.5, scrape_interval=1.0, min_samples=1.0
            ),
            leasing=LeaseSettings(elect=False, identity="controller-under-test"),
            tick=TickSettings(period=tick),
            notify=NotifySettings(allow_hosts=("127.0.0.1",)),
            serving=ServingSettings(port=metrics_port),
            cluster=ClusterSettings(watch_timeout=1),  # the watches end within a second of stop()
        )
        controller = build_controller(
            settings,
            api_client=config.new_client_from_config(config_file=str(self.kubeconfig)),  # type: ignore[no-untyped-call]
        )
        thread = threading.Thread(target=controller.run, daemon=True)
        thread.start()
        self.controllers.append((controller, thread))
        return controller

    def stop(self) -> None:
        for controller, thread in self.controllers:
            controller.stop()
            thread.join(20)
        self.controllers.clear()

    def state(self, name: str, namespace: str = "ml") -> Any:
        return ConfigMapStateStore(self.api).load(namespace, name).state()


def install_crd(api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD.read_text()))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.05, revision_ready_delay=0.1)).start()
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for namespace in ("ml", "team-b"):
            emulator.create_namespace(namespace)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        policies = tmp_path / "policies"
        (policies / "ml").mkdir(parents=True)
        world = Stack(emulator, api, kubeconfig, policies)
        try:
            yield world
        finally:
            world.stop()
            emulator.stop()


def policy_object(name: str, target: str, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    document = yaml.safe_load(valid_policy(name, target))
    document["metadata"] = {"name": name, "namespace": namespace}
    document["spec"].update({"window": "10m", "interval": "1s", **spec})
    return document


def first_step_written(stack: Stack, model: str, namespace: str = "ml") -> bool:
    return stack.canary_percent(model, namespace) == 10


# -- a valid object governs; its status follows, written on change only ---------------------------


def test_a_valid_object_governs_and_its_status_is_written_only_when_it_changes(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("llama", "llama"))
    stack.start(sources=frozenset({PolicySource.CRD}))
    assert wait_until(lambda: (stack.condition("llama", "Promoted") or {}).get("reason") == "NoRollout")
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama")), stack.canary_percent("llama")
    revision = "llama-predictor-00002"
    assert wait_until(lambda: (stack.policy("llama").get("status") or {}).get("canaryRevision") == revision)
    assert wait_until(lambda: (stack.policy("llama").get("status") or {}).get("weight") == 10)
    status = stack.policy("llama")["status"]
    assert status["phase"] in {"Pending", "Progressing"}
    assert status["observedGeneration"] == stack.policy("llama")["metadata"]["generation"]
    promoted = stack.condition("llama", "Promoted")
    assert promoted is not None and promoted["status"] == "False" and revision in promoted["message"]
    assert (stack.condition("llama", "Reconciling") or {}).get("status") == "True"
    assert (stack.condition("llama", "Ready") or {}).get("status") == "False"
    # Steady state (Prometheus unreachable: every evaluation holds): ticks go on, the status stays.
    time.sleep(1.0)
    before = len(stack.status_writes("llama"))
    mark = stack.emulator.requests.next_sequence()
    time.sleep(4.0)  # ~13 ticks and reloads
    later = stack.status_writes("llama", since=mark)
    stored = [
        e
        for e in stack.emulator.requests.entries(since=mark)
        if e.method in {"PUT", "POST"} and e.path.endswith("/configmaps/kserve-canary-llama")
    ]
    print(
        f"status writes: {before} until the first step settled; in the next 4 s {len(later)}, "
        f"state ConfigMap writes {len(stored)}"
    )
    # A status changes only with what it is projected from (state, explain.json: at most every
    # 5 intervals), never per tick.
    assert len(later) <= max(1, len(stored)), [(e.changed_paths) for e in later]
    assert 2 <= before <= 8, before  # NoRollout, the new revision, the first step (+ checks)
    assert stack.spec_writes() == [], "the controller never writes a PromotionPolicy's spec"


def test_a_policy_without_notify_targets_builds_its_destinations_once(stack: Stack) -> None:
    """Every reconcile asks for the policy's destinations; a policy that names none has none, and that
    is kept like any other answer (an empty list was taken for "not built yet" and rebuilt on every
    reconcile: a tenth of the controller's time at 1,000 rollouts, by py-spy)."""
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("llama", "llama"))
    controller = stack.start(sources=frozenset({PolicySource.CRD}))
    assert wait_until(lambda: (stack.condition("llama", "Promoted") or {}).get("reason") == "NoRollout")
    loaded = controller._registry.get("ml/llama")
    assert loaded is not None and not loaded.policy.spec.notify
    built = controller.delivery.destinations(loaded.policy)
    assert built == []
    assert controller.delivery.destinations(loaded.policy) is built


# -- an invalid object ----------------------------------------------------------------------------


def test_an_invalid_object_is_reported_once_and_the_others_keep_running(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.model("other")
    broken = policy_object("other", "other", maxIncrase="20%")
    broken["spec"]["checks"][0]["max"] = "soon"
    stack.apply_policy(broken)
    stack.apply_policy(policy_object("llama", "llama"))
    stack.start()
    assert wait_until(lambda: (stack.condition("other", "PolicyValid") or {}).get("status") == "False")
    valid = stack.condition("other", "PolicyValid")
    assert valid is not None and valid["reason"] == "InvalidSpec"
    assert "spec.checks[0].max:" in valid["message"]
    # The API server pruned the unknown field: it never reaches the controller (nor its cache).
    assert "maxIncrase" not in valid["message"]
    assert "maxIncrase" not in stack.policy("other")["spec"]
    assert (stack.condition("other", "Stalled") or {}).get("status") == "True"
    assert stack.policy("other")["status"]["phase"] == "Invalid"
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama"))
    assert wait_until(lambda: len(stack.events_about("other")) == 1)
    time.sleep(2.0)  # several reloads: still one Event, and no status rewrite
    [event] = stack.events_about("other")
    assert event.reason == "InvalidSpec" and event.type == "Warning"
    assert "promotionpolicy/ml/other: spec.checks[0].max:" in event.message
    mark = stack.emulator.requests.next_sequence()
    time.sleep(1.5)
    assert stack.status_writes("other", since=mark) == []
    # A new generation that is valid clears it.
    fixed = stack.policy("other")
    fixed["spec"]["checks"][0]["max"] = "800ms"
    stack.custom.replace_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "other", fixed)
    assert wait_until(lambda: (stack.condition("other", "PolicyValid") or {}).get("status") == "True")
    assert (stack.condition("other", "Stalled") or {}).get("status") == "False"


def test_custom_promql_from_an_object_is_refused_without_the_flag(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    custom = policy_object("llama", "llama")
    custom["spec"]["checks"] = [{"name": "queue", "promql": 'max(q{revision="{{ revision }}"})', "max": 5}]
    stack.apply_policy(custom)
    stack.start()
    assert wait_until(lambda: (stack.condition("llama", "PolicyValid") or {}).get("status") == "False")
    message = (stack.condition("llama", "PolicyValid") or {})["message"]
    assert "spec.checks[0].promql:" in message and "--allow-custom-promql-from-crds" in message
    stack.push("llama", "v2")
    time.sleep(2.0)
    assert stack.canary_percent("llama") is None, "a refused policy governs nothing"
    stack.stop()
    stack.start(allow_custom_promql=True)
    assert wait_until(lambda: (stack.condition("llama", "PolicyValid") or {}).get("status") == "True")


# -- conflicts across sources ---------------------------------------------------------------------


def test_a_file_and_an_object_for_one_model_hold_it_and_removing_one_hands_it_over(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    policy_file = stack.policies / "ml" / "llama.yaml"
    policy_file.write_text(
        valid_policy("from-file", target="llama").replace("steps:", "window: 10m\n  interval: 1s\n  steps:")
    )
    controller = stack.start()
    assert wait_until(lambda: stack.state("llama").revision == "llama-predictor-00001")
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama"))
    before = stack.state("llama")
    stack.apply_policy(policy_object("from-object", "llama"))
    assert wait_until(lambda: (stack.condition("from-object", "Conflict") or {}).get("status") == "True")
    conflict = stack.condition("from-object", "Conflict")
    assert conflict is not None and conflict["reason"] == "TargetClaimed"
    assert str(policy_file) in conflict["message"], "names the other claimant"
    assert wait_until(lambda: [e.reason for e in stack.events_about("from-object")] == ["TargetClaimed"])
    assert "ml/llama" in controller._registry.held
    # Held: not paused, not rolled back, nothing written to the model.
    mark = stack.emulator.requests.next_sequence()
    time.sleep(1.5)
    held = stack.state("llama")
    assert held.phase is not Phase.PAUSED and held.pause is None
    assert held.revision == before.revision
    writes = [
        e
        for e in stack.emulator.requests.entries(since=mark)
        if e.method in {"PATCH", "PUT"} and "/inferenceservices/" in e.path
    ]
    assert writes == []
    # The file goes: the object governs the same rollout, without a pause.
    policy_file.unlink()
    assert wait_until(lambda: (stack.condition("from-object", "Conflict") or {}).get("status") == "False")
    assert wait_until(lambda: (stack.policy("from-object").get("status") or {}).get("weight") == 10)
    after = stack.state("llama")
    assert after.phase is not Phase.PAUSED and after.revision == before.revision
    assert controller._registry.get("ml/llama") is not None


def test_a_file_policys_rollout_is_published_where_the_viewer_role_reads_it(stack: Stack) -> None:
    """A policy file has no object to carry its status: the controller writes its rollout's row into
    the one ConfigMap it names in its own namespace (canary/kserve/file_status.py)."""
    stack.emulator.create_namespace("kserve-canary")  # the controller's (LeaseSettings.namespace)
    stack.model("llama")
    policy_file = stack.policies / "ml" / "llama.yaml"
    policy_file.write_text(
        valid_policy("from-file", target="llama").replace("steps:", "window: 10m\n  interval: 1s\n  steps:")
    )
    stack.start()

    def published() -> list[dict[str, Any]]:
        try:
            found = client.CoreV1Api(stack.api).read_namespaced_config_map(
                FILE_STATUS_CONFIGMAP, "kserve-canary"
            )
        except client.ApiException:
            return []
        rows: list[dict[str, Any]] = json.loads(found.data[FILE_STATUS_KEY])["rollouts"]
        return rows

    assert wait_until(lambda: [row["revision"] for row in published()] == ["llama-predictor-00001"])
    stack.push("llama", "v2")
    assert wait_until(lambda: [row["weight"] for row in published()] == [10])
    (row,) = published()
    assert (row["namespace"], row["name"], row["policy"]) == ("ml", "llama", f"{policy_file}:1")
    assert (row["revision"], row["stableRevision"]) == ("llama-predictor-00002", "llama-predictor-00001")
    assert row["canaryArtefact"]["storageUri"] == "s3://m/llama/v2"
    assert row["stableArtefact"]["storageUri"] == "s3://m/llama/v1"


def test_two_objects_for_one_model_are_both_told(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("a", "llama"))
    stack.apply_policy(policy_object("b", "llama"))
    controller = stack.start()
    for name in ("a", "b"):
        assert wait_until(lambda name=name: (stack.condition(name, "Conflict") or {}).get("status") == "True")  # type: ignore[misc]
    time.sleep(1.5)
    assert ConfigMapStateStore(stack.api).load("ml", "llama").state_json is None, "neither acts"
    assert controller.metrics.registry.get_sample_value("kserve_canary_policies", {"state": "held"}) == 1
    stack.custom.delete_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "a")
    assert wait_until(lambda: (stack.condition("b", "Conflict") or {}).get("status") == "False")
    assert wait_until(lambda: (stack.condition("b", "Promoted") or {}).get("reason") == "NoRollout")
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama"))


# -- tenancy: an object's secrets come from its namespace's Secret ---------------------------------


def test_an_object_reads_its_namespace_secret_and_never_the_controller_environment(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_crd(stack.api)
    stack.model("llama")
    with WebhookReceiver() as team, WebhookReceiver() as controllers_own:
        monkeypatch.setenv("HOOK_URL", controllers_own.url + "/hook")
        client.CoreV1Api(stack.api).create_namespaced_secret(
            "ml",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "kserve-canary-notifications", "namespace": "ml"},
                "data": {"HOOK_URL": base64.b64encode(f"{team.url}/hook".encode()).decode()},
            },
        )
        stack.apply_policy(
            policy_object("llama", "llama", notify=[{"webhook": {"urlFrom": {"env": "HOOK_URL"}}}])
        )
        # The controller's own env would be allowed for file policies of ml; an object never reads it.
        stack.start(secrets=SecretScope(env_allow={"ml": ("*",)}))
        assert wait_until(lambda: stack.condition("llama", "PolicyValid") is not None)
        stack.push("llama", "v2")
        assert wait_until(lambda: first_step_written(stack, "llama"))
        team.wait_for(lambda request: True, timeout=20)
        time.sleep(1.0)
        assert controllers_own.requests == []
        reads = stack.emulator.requests.entries(method="GET", path_contains="/secrets/")
        assert reads and all(
            e.path == "/api/v1/namespaces/ml/secrets/kserve-canary-notifications" for e in reads
        )
    assert os.environ["HOOK_URL"]  # still set: it was there to be (not) read


# -- operator commands write their own channel, never the spec ------------------------------------


def test_operator_commands_never_write_the_policy_object(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("llama", "llama"))
    stack.start()
    assert wait_until(lambda: (stack.condition("llama", "Promoted") or {}).get("reason") == "NoRollout")
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama"))
    generation = stack.policy("llama")["metadata"]["generation"]
    mark = stack.emulator.requests.next_sequence()
    result = CliRunner().invoke(
        app, ["pause", "ml/llama", "--reason", "a look", "--kubeconfig", str(stack.kubeconfig)]
    )
    assert result.exit_code == 0, result.output
    assert wait_until(lambda: stack.state("llama").phase is Phase.PAUSED)
    assert wait_until(lambda: (stack.condition("llama", "Promoted") or {}).get("reason") == "Paused")
    touched = [
        (e.method, e.path)
        for e in stack.emulator.requests.entries(since=mark)
        if f"/{PLURAL}/" in e.path and e.method not in {"GET"} and not e.path.endswith("/status")
    ]
    assert touched == []
    assert stack.policy("llama")["metadata"]["generation"] == generation, "the spec is unchanged"
    assert stack.spec_writes() == []


# -- the status writer: 409 read again and retried once, 404 ignored, rate-limited -----------------


def test_a_refused_status_write_is_read_again_and_retried_once(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("llama", "llama"))
    status_path = f"/namespaces/ml/{PLURAL}/llama/status$"
    stack.emulator.faults.add(status_path, method="PUT", status=409)
    mark = stack.emulator.requests.next_sequence()
    stack.start()
    assert wait_until(lambda: (stack.condition("llama", "Promoted") or {}).get("reason") == "NoRollout")
    writes = [(e.method, e.status) for e in stack.status_writes("llama", since=mark)]
    assert writes[:2] == [("PUT", 409), ("PUT", 200)], writes
    gets = [
        e
        for e in stack.emulator.requests.entries(method="GET", since=mark)
        if e.path.endswith(f"/{PLURAL}/llama") and e.user_agent.startswith("kserve-canary/")
    ]
    assert len(gets) == 1, "the 409 reads the object once"
    # A 404 (the object deleted between the read and the write) is no error: written again later.
    stack.emulator.faults.add(status_path, method="PUT", status=404)
    stack.push("llama", "v2")
    assert wait_until(lambda: (stack.policy("llama").get("status") or {}).get("weight") == 10)
    assert ("PUT", 404) in [(e.method, e.status) for e in stack.status_writes("llama", since=mark)]


def test_status_writes_are_rate_limited_per_object(stack: Stack) -> None:
    install_crd(stack.api)
    stack.model("llama")
    stack.apply_policy(policy_object("llama", "llama"))
    mark = stack.emulator.requests.next_sequence()
    stack.start(status_min_interval=3.0)
    assert wait_until(lambda: stack.status_writes("llama", since=mark))
    stack.push("llama", "v2")  # the state changes at once; the status may follow 3 s later
    assert wait_until(lambda: (stack.policy("llama").get("status") or {}).get("weight") == 10, timeout=30)
    times = [e.time for e in stack.status_writes("llama", since=mark) if e.status < 300]
    assert len(times) >= 2
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 2.9, gaps


# -- the CRD not served ----------------------------------------------------------------------------


def readyz(port: int) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return 0, ""


def test_without_the_crd_files_still_govern_and_readyz_says_so(stack: Stack) -> None:
    stack.model("llama")
    (stack.policies / "ml" / "llama.yaml").write_text(
        valid_policy("from-file", target="llama").replace("steps:", "window: 10m\n  interval: 1s\n  steps:")
    )
    port = free_port()
    stack.start(metrics_port=port)
    assert wait_until(lambda: readyz(port)[0] == 200)
    _, text = readyz(port)
    assert "the PromotionPolicy CRD is not served" in text, text
    assert wait_until(lambda: stack.state("llama").revision == "llama-predictor-00001")
    stack.push("llama", "v2")
    assert wait_until(lambda: first_step_written(stack, "llama"))
    stack.stop()
    # Objects only, and no CRD: not ready, and it says why.
    port = free_port()
    stack.start(metrics_port=port, sources=frozenset({PolicySource.CRD}))
    assert wait_until(lambda: "the PromotionPolicy CRD is not served" in readyz(port)[1]), readyz(port)
    assert readyz(port)[0] == 503
    # Installed later: read without a restart.
    install_crd(stack.api)
    stack.apply_policy(policy_object("other", "llama"))
    assert wait_until(lambda: readyz(port)[0] == 200, timeout=20), readyz(port)
    assert wait_until(lambda: stack.condition("other", "PolicyValid") is not None)


# -- a policy that appears is evaluated at once, not at the next tick ------------------------------
# With a long tick period, the timer's first tick may have run before the policies were loaded (at
# startup), or a file lands between two ticks (a git-sync).


def stored(world: Stack, model: str) -> bool:
    names = [cm.metadata.name for cm in client.CoreV1Api(world.api).list_namespaced_config_map("ml").items]
    return state_configmap_name(model) in names


def test_a_policy_file_written_between_two_ticks_is_evaluated_before_the_next_tick(stack: Stack) -> None:
    stack.model("llama")
    controller = stack.start(sources=frozenset({PolicySource.FILES}), tick=60.0)
    assert wait_until(lambda: controller.ticks.last is not None, 10), "the first tick ran"
    (stack.policies / "ml" / "llama.yaml").write_text(valid_policy("llama", "llama"))
    # Its first evaluation stores the model's state: within seconds, not the 60 s tick period.
    assert wait_until(lambda: stored(stack, "llama"), 10), "evaluated only at the next tick"
