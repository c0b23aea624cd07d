"""The controller as deployed, against the API emulator: which requests does it really make?

``run_controller`` starts ``kserve-canary run`` as a separate process with the container arguments
of a rendered Deployment (only the policy path, the port and the kubeconfig differ from a pod),
inside an interpreter where the distributions the Dockerfile prunes cannot be imported — the
image's own runtime. It then drives one rollout start: the controller acquires the Lease, lists
and watches InferenceServices and its ConfigMaps, sees a new revision, stores its state (create,
then replace; one replace and one patch are refused with 409, and the objects read again),
writes the first step, records Events, finds Prometheus unreachable, and on SIGTERM releases the
Lease. People's CLI commands (status, explain, pause, resume, approve, abort, promote) run next,
in-process with their own client. Event aggregation (an identical event within ten minutes
patches the first one's count) runs at component level with the controller's own sender.

Every request the emulator logged is kept, so tests can map it to RBAC attributes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, LoggedRequest, RevisionBehaviour
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service, wait_until
from kubernetes import client, config
from typer.testing import CliRunner

from canary.cli import app
from canary.kserve.store import COMMAND_ISSUER_KEY, COMMAND_KEY
from canary.notify.events import KubernetesEventSender
from canary.notify.secrets import Redactor
from tests.deploy.image import blocking_launcher
from tests.deploy.manifests import Manifest, controller_container
from tests.notify.support import make_notification

NAMESPACE = "models"
MODEL = "sklearn-iris"
CONTROLLER_NAMESPACE = "kserve-canary"
IDENTITY = "kserve-canary-5d8f7c9b4-x7k2p"
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
# A second model governed by a PromotionPolicy object (the CRD installed): its status is written
# (one write refused with 409, so the object is read again), and its webhook's URL is a key of the
# namespace's kserve-canary-notifications Secret, read through the API when the notification is sent.
MODEL_CR = "iris-cr"
POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "kserve-canary.dev", "v1alpha1", "promotionpolicies"
CRD_FILE = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "promotionpolicies.yaml"

POLICY = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata:
  name: {MODEL}
  namespace: {NAMESPACE}
spec:
  target:
    inferenceService: {MODEL}
  steps: [10, 50, 100]
  window: 1m
  interval: 1s
  minRequests: 10
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: 500ms, maxIncrease: 20%}}
    - {{name: errors, metric: error-rate, max: 1%}}
"""

CLI_COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "status -n": ["status", "-n", NAMESPACE],
    "status NAME": ["status", f"{NAMESPACE}/{MODEL}"],
    "explain": ["explain", f"{NAMESPACE}/{MODEL}"],
    # The controller is stopped by then: nobody answers, so no command waits for an answer.
    "pause": ["pause", f"{NAMESPACE}/{MODEL}", "--reason", "looking at a dashboard", "--no-wait"],
    "resume": ["resume", f"{NAMESPACE}/{MODEL}", "--no-wait"],
    "approve": ["approve", f"{NAMESPACE}/{MODEL}", "--no-wait"],
    "abort": ["abort", f"{NAMESPACE}/{MODEL}", "--no-wait"],
    "promote": ["promote", f"{NAMESPACE}/{MODEL}", "--no-wait"],
}
READ_ONLY_COMMANDS = ("status", "status -n", "status NAME", "explain")
# What one rollout's status and explanation read: its state ConfigMap, by name (docs/install.md).
ONE_ROLLOUT_COMMANDS = ("status NAME", "explain")
# The pause was never carried out (no controller): the CLI refuses to resume what is not paused.
CLI_EXIT_CODES = {"resume": 1}


@dataclass
class ScenarioResult:
    controller: list[LoggedRequest]  # everything the controller process asked
    events_component: list[LoggedRequest]  # the controller's event sender, aggregating a repeat
    cli: dict[str, list[LoggedRequest]] = field(default_factory=dict)  # per command
    health: dict[str, int] = field(default_factory=dict)  # probe path -> HTTP status
    metrics: str = ""  # the controller's /metrics while leading
    exit_code: int | None = None
    log: str = ""
    lease_after_stop: dict[str, Any] = field(default_factory=dict)
    first_step: int | None = None
    state_owner_references: list[dict[str, Any]] = field(default_factory=list)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except OSError:
        return 0, ""


def controller_argv(
    deployment: list[Manifest], *, policy_dir: Path, port: int
) -> tuple[list[str], dict[str, str]]:
    """The Deployment's container arguments and environment, with the pod's paths swapped for local ones."""
    container = controller_container(deployment)
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env.update(POD_NAMESPACE=CONTROLLER_NAMESPACE, POD_NAME=IDENTITY)
    args = []
    for argument in container["args"]:
        option = argument.partition("=")[0]
        if option == "--policies":
            argument = f"--policies={policy_dir}"
        elif option == "--metrics-port":
            argument = f"--metrics-port={port}"
        args.append(argument.replace("$(POD_NAMESPACE)", env["POD_NAMESPACE"]))
    return args, env


def run_controller(deployment: list[Manifest], workdir: Path) -> ScenarioResult:
    emulator = Emulator(KServeConfig(reconcile_delay=0.2, revision_ready_delay=0.3))
    emulator.create_namespace(NAMESPACE)
    emulator.create_namespace(CONTROLLER_NAMESPACE)
    policy_dir = workdir / "policies"
    # <policy root>/<namespace>/*.yaml: the directory decides which namespace a policy governs.
    (policy_dir / NAMESPACE).mkdir(parents=True)
    (policy_dir / NAMESPACE / f"{MODEL}.yaml").write_text(POLICY)
    # Short bookmarks: the emulator notices a watch whose client went away (and logs it) quickly.
    with EmulatorServer(emulator, bookmark_interval=0.5) as server:
        kubeconfig = server.write_kubeconfig(workdir / "kubeconfig.yaml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, inference_service(NAMESPACE, MODEL, "s3://models/iris/v1")
        )
        client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text()))
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, inference_service(NAMESPACE, MODEL_CR, "s3://models/cr/v1")
        )
        policy_object = yaml.safe_load(POLICY.replace(MODEL, MODEL_CR))
        policy_object["spec"]["notify"] = [{"webhook": {"urlFrom": {"env": "HOOK_URL"}}}]
        custom.create_namespaced_custom_object(
            POLICY_GROUP, POLICY_VERSION, NAMESPACE, POLICY_PLURAL, policy_object
        )
        client.CoreV1Api(api).create_namespaced_secret(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "kserve-canary-notifications", "namespace": NAMESPACE},
                "stringData": {"HOOK_URL": f"http://127.0.0.1:{free_port()}/hook"},
            },
        )

        def predictor() -> dict[str, Any]:
            found = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
            return dict(((found.get("status") or {}).get("components") or {}).get("predictor") or {})

        assert wait_until(lambda: bool(predictor().get("latestRolledoutRevision")), 20), "v1 never rolled out"

        port = free_port()
        args, env = controller_argv(deployment, policy_dir=policy_dir, port=port)
        # Nothing listens there: every evidence query fails as "unreachable".
        env["PROMETHEUS_URL"] = f"http://127.0.0.1:{free_port()}"
        args += ["--kubeconfig", str(kubeconfig), "--prometheus-timeout", "1"]
        log_path = workdir / "controller.log"
        environment = {**os.environ, **env, "PYTHONDONTWRITEBYTECODE": "1"}
        environment.pop("KUBECONFIG", None)
        start = emulator.requests.next_sequence()
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-c", blocking_launcher(), "run", *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=workdir,
            )
        result = ScenarioResult(controller=[], events_component=[])
        try:
            base = f"http://127.0.0.1:{port}"
            container = controller_container(deployment)
            probes = {
                container["livenessProbe"]["httpGet"]["path"],
                container["readinessProbe"]["httpGet"]["path"],
            }
            assert wait_until(lambda: _get(base + "/readyz")[0] == 200, 30), log_path.read_text()[-3000:]
            result.health = {path: _get(base + path)[0] for path in sorted(probes)}

            def lease_holder() -> str | None:
                lease = client.CoordinationV1Api(api).read_namespaced_lease(
                    "kserve-canary", CONTROLLER_NAMESPACE
                )
                return lease.spec.holder_identity if lease.spec else None

            assert wait_until(lambda: lease_holder() == IDENTITY, 30), log_path.read_text()[-3000:]
            time.sleep(0.5)  # the watch is established after the first list
            # A new model version, the GitOps way: only the predictor spec changes.
            emulator.set_default_behaviour(NAMESPACE, MODEL, RevisionBehaviour(ready_after_seconds=2.0))
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL,
                {"spec": {"predictor": {"model": {"storageUri": "s3://models/iris/v2"}}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            # Reads come from watch caches; a write refused with 409 re-reads the object with a GET.
            # One refused write of each kind makes the run exercise those GETs.
            emulator.faults.add(
                f"/namespaces/{NAMESPACE}/configmaps/kserve-canary-{MODEL}$", method="PUT", status=409
            )
            emulator.faults.add(f"/namespaces/{NAMESPACE}/{PLURAL}/{MODEL}$", method="PATCH", status=409)
            emulator.faults.add(
                f"/namespaces/{NAMESPACE}/{POLICY_PLURAL}/{MODEL_CR}/status$", method="PUT", status=409
            )
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL_CR,
                {"spec": {"predictor": {"model": {"storageUri": "s3://models/cr/v2"}}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip

            def controller_wrote(method: str, fragment: str) -> bool:
                return any(
                    e.user_agent.endswith(f"({IDENTITY})") and e.status < 300 and fragment in e.path
                    for e in emulator.requests.entries(method=method, since=start)
                )

            def controller_asked(method: str, fragment: str) -> bool:
                # Whatever the answer (the Secret holds a URL of nothing that listens).
                return any(
                    e.user_agent.endswith(f"({IDENTITY})") and fragment in e.path
                    for e in emulator.requests.entries(method=method, since=start)
                )

            def started() -> bool:
                spec = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)["spec"]
                return (
                    spec["predictor"].get("canaryTrafficPercent") is not None
                    and controller_wrote("PUT", "/configmaps/")
                    and controller_wrote("POST", "/events")
                    and "PrometheusUnavailable" in log_path.read_text()
                    and controller_wrote("PUT", f"/{POLICY_PLURAL}/{MODEL_CR}/status")
                    and controller_asked("GET", "/secrets/kserve-canary-notifications")
                )

            assert wait_until(started, 45), log_path.read_text()[-4000:]
            result.first_step = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)[
                "spec"
            ]["predictor"]["canaryTrafficPercent"]
            result.metrics = _get(base + "/metrics")[1]
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                result.exit_code = process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                result.exit_code = process.wait(timeout=5)
            result.log = log_path.read_text(errors="replace")

        def mine() -> list[LoggedRequest]:
            return [
                e for e in emulator.requests.entries(since=start) if e.user_agent.endswith(f"({IDENTITY})")
            ]

        # A watch is logged when it ends: the emulator sees the stopped controller's connection close.
        # Every watch: InferenceServices, ConfigMaps and PromotionPolicies each end on their own.
        def watches_ended() -> bool:
            watched = {e.path.rsplit("/", 1)[-1] for e in mine() if "watch=true" in e.query}
            return {PLURAL, "configmaps", POLICY_PLURAL} <= watched

        wait_until(watches_ended, 15)
        result.controller = mine()
        lease = client.CoordinationV1Api(api).read_namespaced_lease("kserve-canary", CONTROLLER_NAMESPACE)
        result.lease_after_stop = {"holder": lease.spec.holder_identity if lease.spec else None}
        state = client.CoreV1Api(api).read_namespaced_config_map(f"kserve-canary-{MODEL}", NAMESPACE)
        result.state_owner_references = [
            api.sanitize_for_serialization(owner) for owner in (state.metadata.owner_references or [])
        ]

        # The controller's Event sender, as the controller builds it, with an event repeated.
        uid = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)["metadata"]["uid"]
        events_api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        events_api.user_agent = f"kserve-canary/events-component ({IDENTITY})"
        sender = KubernetesEventSender(events_api, reporting_instance=IDENTITY, redactor=Redactor())
        notification = make_notification(
            namespace=NAMESPACE, inference_service=MODEL, inference_service_uid=uid
        )
        before = emulator.requests.next_sequence()
        sender.send(notification)
        sender.send(notification)  # identical, within the aggregation window: a patch of the count
        result.events_component = emulator.requests.entries(since=before)

        # People, with their own credentials (here: the same kubeconfig), in-process.
        runner = CliRunner()
        for label, command in CLI_COMMANDS.items():
            before = emulator.requests.next_sequence()
            invoked = runner.invoke(app, [*command, "--kubeconfig", str(kubeconfig)], catch_exceptions=False)
            expected = CLI_EXIT_CODES.get(label, 0)
            assert invoked.exit_code == expected, f"kserve-canary {' '.join(command)}: {invoked.output}"
            result.cli[label] = emulator.requests.entries(since=before)
            # Consumed, as the controller would: the next command does not find this one waiting.
            client.CoreV1Api(api).patch_namespaced_config_map(
                f"kserve-canary-{MODEL}",
                NAMESPACE,
                {"data": {COMMAND_KEY: None, COMMAND_ISSUER_KEY: None}},
                _content_type="application/merge-patch+json",
            )
    return result


def bodies(entries: list[LoggedRequest], fragment: str, method: str) -> list[Any]:
    return [json.loads(json.dumps(e.body)) for e in entries if fragment in e.path and e.method == method]
