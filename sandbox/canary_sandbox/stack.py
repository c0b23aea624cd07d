"""A whole kserve-canary world on one machine: for the end-to-end tests and ``kserve-canary demo``.

* the Kubernetes API emulator with its KServe behaviour layer, served over HTTP (real time);
* a simulated serving fleet that follows the emulator's traffic split and exports production-shaped
  metrics (Knative queue-proxy, kube-state-metrics, DCGM) on loopback;
* Debian's real Prometheus scraping that exporter every second;
* a loopback webhook receiver;
* the policies as files in a policy directory, or (``policy_objects=True``) as PromotionPolicy
  objects: the CRD installed from the product's own generator, each policy created in its namespace,
  and the environment it reads (``{env: NAME}``) published as each namespace's Secret
  ``kserve-canary-notifications``, as a tenant's policy reads it;
* the controller itself, as separate ``kserve-canary run`` processes (so tests can SIGKILL them).

Everything listens on free loopback ports and is torn down by :meth:`Stack.close` (also on errors).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, cast

import yaml
from kubernetes import client, config

from canary.policy.crd import crd_manifest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.emulator import RevisionBehaviour as RevisionReadiness
from canary_sandbox.fleet.world import ModelTraffic, SimulatedFleet
from canary_sandbox.prometheus import PrometheusServer, free_port
from canary_sandbox.receiver import WebhookReceiver

__all__ = ["ControllerProcess", "Stack", "inference_service"]

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "kserve-canary.dev", "v1alpha1", "promotionpolicies"
# The one Secret a PromotionPolicy object's {env: NAME} references read, in the object's namespace.
NOTIFICATION_SECRET = "kserve-canary-notifications"  # noqa: S105 - a Secret's name, not a secret


def inference_service(
    namespace: str,
    name: str,
    storage_uri: str,
    *,
    canary_percent: int | None = None,
    model_format: str = "sklearn",
) -> dict[str, Any]:
    predictor: dict[str, Any] = {"model": {"modelFormat": {"name": model_format}, "storageUri": storage_uri}}
    if canary_percent is not None:
        predictor["canaryTrafficPercent"] = canary_percent
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"predictor": predictor},
    }


@dataclass
class ControllerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metrics(self, timeout: float = 2.0) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies."""
        if self.alive:
            self.process.kill()
        self.process.wait(timeout=10)

    def terminate(self, timeout: float = 20.0) -> int:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=5)


DEFAULT_POLICY_NAMESPACE = "default"


def _policy_namespace(text: str) -> str:
    """``metadata.namespace`` of the first document, if the text is YAML that has one."""
    try:
        document = next(iter(yaml.safe_load_all(text)), None)
    except yaml.YAMLError:
        return DEFAULT_POLICY_NAMESPACE
    metadata = document.get("metadata") if isinstance(document, dict) else None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) and namespace else DEFAULT_POLICY_NAMESPACE


@dataclass
class Stack:
    models: list[ModelTraffic]
    # file name -> policy YAML; written to policy_dir/<metadata.namespace>/ (a policy root holds one
    # directory per namespace), or to the path given when the name has a directory ("ml/a.yaml").
    policies: Mapping[str, str] = field(default_factory=dict)
    reconcile_delay: float = 0.3
    fleet_tick: float = 0.25
    seed: int = 7
    workdir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    scrape_interval: float = 1.0  # Prometheus' (the scale benchmark scrapes thousands of pods less often)
    # Seconds before Prometheus holds a sample (remote write, Thanos, Mimir): the fleet's samples
    # arrive that late, with their own timestamps (canary_sandbox.exporter.IngestionLag).
    ingestion_lag: float = 0.0
    request_log_size: int = 10_000  # the emulator's request log
    # PromotionPolicy objects instead of files (the controller then runs with --policy-source crd).
    policy_objects: bool = False
    # The Knative generation the fleet's queue-proxies export (knative-otel-*: both >= 1.19 histograms).
    requests_profile: str = "knative-opencensus"

    def __post_init__(self) -> None:
        self._owned_workdir = self.workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="kserve-canary-stack-")) if self.workdir is None else self.workdir
        )
        self.policy_dir = self.workdir / "policies"
        self.policy_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.workdir / "kubeconfig.yaml"
        self.emulator = Emulator(
            KServeConfig(reconcile_delay=self.reconcile_delay),
            seed=self.seed,
            request_log_size=self.request_log_size,
        )
        self.server = EmulatorServer(self.emulator)
        self.receiver = WebhookReceiver()
        self.controllers: list[ControllerProcess] = []
        self._stop = threading.Event()
        self._fleet_thread: threading.Thread | None = None
        self._closers: list[Callable[[], None]] = []
        self.prometheus: PrometheusServer | None = None
        self.api: client.ApiClient | None = None
        self.fleet: SimulatedFleet | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Self:
        try:
            self.server.start()
            self._closers.append(self.server.stop)
            self.server.write_kubeconfig(self.kubeconfig)
            self.api = cast(client.ApiClient, config.new_client_from_config(config_file=str(self.kubeconfig)))  # type: ignore[no-untyped-call]
            self.receiver.start()
            self._closers.append(self.receiver.stop)
            for namespace in sorted({model.namespace for model in self.models} - {"default"}):
                self.emulator.create_namespace(namespace)
            self.fleet = SimulatedFleet(
                self.api,
                self.models,
                seed=self.seed,
                on_new_revision=self._on_new_revision,
                requests_profile=self.requests_profile,
            )
            exporter = self.fleet.serve(ingestion_lag=self.ingestion_lag)
            self._closers.append(exporter.shutdown)
            self._fleet_thread = threading.Thread(target=self._run_fleet, name="fleet", daemon=True)
            self._fleet_thread.start()
            port = exporter.server_address[1]
            self.prometheus = PrometheusServer(
                scrape_targets=[f"127.0.0.1:{port}"], scrape_interval=self.scrape_interval
            ).start()
            self._closers.append(self.prometheus.stop)
            if self.policy_objects:
                self.install_policy_crd()
                for text in self.policies.values():
                    self.apply_policy(text)
            else:
                for name, text in self.policies.items():
                    self.write_policy(name, text)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self._stop.set()
        for controller in self.controllers:
            controller.kill()
        if self._fleet_thread is not None:
            self._fleet_thread.join(timeout=5)
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception:  # noqa: S112 - best effort teardown: keep closing the rest
                continue
        if (
            self._owned_workdir
            and self.workdir is not None
            and not os.environ.get("KSERVE_CANARY_KEEP_STACK")
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_fleet(self) -> None:
        assert self.fleet is not None
        last = time.monotonic()
        while not self._stop.wait(self.fleet_tick):
            now = time.monotonic()
            try:
                self.fleet.tick(now - last)
            except Exception:  # noqa: S112 - the emulator may be going away during teardown
                continue
            finally:
                last = now

    def _on_new_revision(self, namespace: str, name: str, revision: str, behaviour: Any) -> None:
        readiness = RevisionReadiness(ready_after_seconds=behaviour.ready_after_s)
        self.emulator.set_revision_behaviour(namespace, revision, readiness)

    # -- the controller ------------------------------------------------------------------------

    def start_controller(
        self,
        name: str = "controller",
        *,
        extra_args: Sequence[str] = (),
        leader_elect: bool = False,
        wait_ready: bool = True,
        prometheus_url: str | None = None,
        kubeconfig: Path | None = None,
    ) -> ControllerProcess:
        """``prometheus_url`` and ``kubeconfig`` put something between the controller and the stack's
        Prometheus or API (the fault suite's :class:`~canary_sandbox.faultproxy.FaultProxy`)."""
        assert self.workdir is not None
        assert self.prometheus is not None
        port = free_port()
        log_path = self.workdir / f"{name}-{len(self.controllers)}.log"
        args = [
            sys.executable,
            "-m",
            "canary",
            "run",
            "--kubeconfig",
            str(kubeconfig or self.kubeconfig),
            "--policies",
            str(self.policy_dir),
            "--prometheus-url",
            prometheus_url or self.prometheus.url,
            "--scrape-interval",
            f"{self.scrape_interval:g}",
            "--metrics-port",
            str(port),
            "--log-format",
            "json",
            "--leader-elect" if leader_elect else "--no-leader-elect",
            "--lease-namespace",
            "default",
            # The stack's webhook receiver listens on loopback, which the controller refuses by default.
            "--notify-allow-host",
            "127.0.0.1",
            # Policies may read the stack's environment variables, in every namespace it runs models in.
            *self._secret_env_allow(),
            *(["--policy-source", "crd"] if self.policy_objects else []),
            *extra_args,
        ]
        if self.policy_objects:
            self.publish_env_secrets()
        environment = {**os.environ, "POD_NAME": name, **self.env}
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=environment)
        controller = ControllerProcess(name, process, log_path, port)
        self.controllers.append(controller)
        if wait_ready and not wait_until(controller.ready, 30):
            raise RuntimeError(f"controller {name} did not become ready:\n{controller.log()[-4000:]}")
        return controller

    # -- the cluster -----------------------------------------------------------------------------

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def _secret_env_allow(self) -> list[str]:
        """The sandbox trusts its own policies with its own environment: every variable, in every
        namespace it runs models in (the allow-list itself is tested in tests/notify)."""
        namespaces = sorted({model.namespace for model in self.models} | {DEFAULT_POLICY_NAMESPACE})
        return [argument for namespace in namespaces for argument in ("--secret-env-allow", f"{namespace}=*")]

    def write_policy(self, name: str, text: str) -> Path:
        """Write ``text`` to ``policy_dir/<namespace>/<name>``: the namespace is the policy's
        ``metadata.namespace`` (``default`` when the text has none), unless ``name`` has a directory."""
        relative = Path(name) if "/" in name else Path(_policy_namespace(text)) / name
        path = self.policy_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic, as a ConfigMap or git-sync update is
        return path

    # -- PromotionPolicy objects -------------------------------------------------------------------

    def install_policy_crd(self) -> None:
        """Create the PromotionPolicy CRD (the product's generator, as ``make schema`` writes it) and
        wait until it is served."""
        assert self.api is not None
        # The client sends a plain dict as it is (its typed models would drop nothing here either).
        client.ApiextensionsV1Api(self.api).create_custom_resource_definition(crd_manifest())  # type: ignore[arg-type]
        served = wait_until(self._lists_policies, 10)
        if not served:
            raise RuntimeError("the PromotionPolicy CRD was created but is not served")

    def _lists_policies(self) -> bool:
        try:
            self.custom.list_cluster_custom_object(POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, limit=1)
        except client.ApiException:
            return False
        return True

    def apply_policy(self, text: str) -> dict[str, Any]:
        """Create the PromotionPolicy object ``text`` holds, or replace its spec (as ``kubectl apply``)."""
        body = cast(dict[str, Any], yaml.safe_load(text))
        metadata = body.setdefault("metadata", {})
        namespace = str(metadata.get("namespace") or DEFAULT_POLICY_NAMESPACE)
        metadata["namespace"] = namespace
        name = str(metadata["name"])
        try:
            current = self.policy_object(namespace, name)
        except client.ApiException as error:
            if error.status != 404:
                raise
            return cast(
                dict[str, Any],
                self.custom.create_namespaced_custom_object(
                    POLICY_GROUP, POLICY_VERSION, namespace, POLICY_PLURAL, body
                ),
            )
        metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return cast(
            dict[str, Any],
            self.custom.replace_namespaced_custom_object(
                POLICY_GROUP, POLICY_VERSION, namespace, POLICY_PLURAL, name, body
            ),
        )

    def policy_object(self, namespace: str, name: str) -> dict[str, Any]:
        return cast(
            dict[str, Any],
            self.custom.get_namespaced_custom_object(
                POLICY_GROUP, POLICY_VERSION, namespace, POLICY_PLURAL, name
            ),
        )

    def publish_env_secrets(self) -> None:
        """``env`` as the Secret ``kserve-canary-notifications`` of every namespace with models: what a
        PromotionPolicy object's ``{env: NAME}`` reads (never the controller's own environment)."""
        core = client.CoreV1Api(self.api)
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=NOTIFICATION_SECRET), string_data=dict(self.env)
        )
        for namespace in sorted({model.namespace for model in self.models} | {DEFAULT_POLICY_NAMESPACE}):
            try:
                core.replace_namespaced_secret(NOTIFICATION_SECRET, namespace, body)
            except client.ApiException as error:
                if error.status != 404:
                    raise
                core.create_namespaced_secret(namespace, body)

    # -- InferenceServices ---------------------------------------------------------------------------

    def apply(self, isvc: dict[str, Any]) -> dict[str, Any]:
        meta = isvc["metadata"]
        self._announce_readiness(meta["namespace"], meta["name"], isvc)
        return cast(
            dict[str, Any],
            self.custom.create_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, isvc),
        )

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return cast(
            dict[str, Any], self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._announce_readiness(namespace, name, body)
        return cast(
            dict[str, Any],
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body, _content_type="application/merge-patch+json"
            ),
        )

    def set_storage_uri(self, namespace: str, name: str, storage_uri: str) -> dict[str, Any]:
        """A new model version, the GitOps way: only the spec changes, no percentage."""
        return self.patch(namespace, name, {"spec": {"predictor": {"model": {"storageUri": storage_uri}}}})

    def _announce_readiness(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Tell the emulator how the revision this spec change creates will load, before it exists.

        (Learning it from the fleet afterwards races with the emulator's default readiness delay: a
        never-Ready version could be Ready before the fleet has seen it.)
        """
        uri = (((body.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri")
        model = next(
            (m for m in self.models if (m.namespace, m.inference_service) == (namespace, name)), None
        )
        if uri is None or model is None:
            return
        behaviour = model.behaviours.get(str(uri), model.default)
        self.emulator.set_default_behaviour(
            namespace, name, RevisionReadiness(ready_after_seconds=behaviour.ready_after_s)
        )

    def canary_percent(self, namespace: str, name: str) -> int | None:
        value = self.get(namespace, name)["spec"]["predictor"].get("canaryTrafficPercent")
        return None if value is None else int(value)

    def predictor_status(self, namespace: str, name: str) -> dict[str, Any]:
        status = self.get(namespace, name).get("status") or {}
        return cast(dict[str, Any], (status.get("components") or {}).get("predictor") or {})

    def state(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = client.CoreV1Api(self.api).read_namespaced_config_map(f"kserve-canary-{name}", namespace)
        except client.ApiException:
            return None
        text = (found.data or {}).get("state.json")
        return None if text is None else cast(dict[str, Any], json.loads(text))

    def events(self, namespace: str) -> list[client.CoreV1Event]:
        return list(client.CoreV1Api(self.api).list_namespaced_event(namespace).items)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return True
        except Exception:  # noqa: S110 - a transient read error is "not yet"
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
