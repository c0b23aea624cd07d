"""The emulator's label styles follow the sources (issue #33, 5, 8 and 9).

* Knative's queue-proxy resource (knative/serving ``pkg/queue/sharedmain/otel.go``, ``res``, lines
  88-125): ``service.name`` is ``SERVING_SERVICE`` (lines 89-98), the attributes are
  ``k8s.namespace.name``, ``service.version``, ``service.name``, ``service.instance.id`` = the pod's
  name (lines 100-105), then ``kn.service.name``, ``kn.configuration.name``, ``kn.revision.name``
  (lines 107-115; the keys: ``pkg/metrics/newkey.go`` lines 25-30). No ``k8s.pod.name``.
* Prometheus' OTLP translation (``storage/remote/otlptranslator/prometheusremotewrite/helper.go`` at
  002042c9, ``createAttributes``): promoted resource attributes become labels, dots as underscores
  (lines 171-176); ``service.name`` becomes ``job`` (lines 189-196) and ``service.instance.id``
  ``instance`` (lines 197-200) on every series; the other resource attributes only on
  ``target_info`` (``addResourceTargetInfo``: identifying attributes left out, promotion off, one
  sample per batch at its latest timestamp).
* A prometheus-operator ServiceMonitor without ``honorLabels`` sets the target's ``namespace``,
  ``pod`` and ``container`` labels, so kube-state-metrics' own labels of the same names are stored as
  ``exported_namespace``, ``exported_pod``, ``exported_container`` (Prometheus ``honor_labels: false``,
  scrape/target.go ``resolveConflictingExposedLabels``; kube-prometheus sets ``honorLabels: true`` on
  its kube-state-metrics ServiceMonitor for this reason).
"""

from __future__ import annotations

from canary_sandbox.fleet.behaviour import PodSimulator, RevisionBehaviour
from canary_sandbox.fleet.world import _render
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import Pod, Revision, Simulation, otlp_labels, otlp_resource

REVISION = "mistral-predictor-00002"
POD = revision_pod_name(REVISION)


def _revision(**options: str) -> Revision:
    pod = Pod(POD, 0.0, 10.0)
    return Revision("llm", "mistral", REVISION, (pod,), requests_profile="knative-otel-invocation", **options)  # type: ignore[arg-type]


def _series(simulation: Simulation, name: str) -> list[dict[str, str]]:
    labels = []
    for line in simulation.openmetrics().splitlines():
        if line.startswith(name + "{"):
            body = line[len(name) + 1 : line.index("} ")]
            labels.append(dict(pair.split("=", 1) for pair in body.split(",")))
    return [{key: value.strip('"') for key, value in entry.items()} for entry in labels]


def test_the_queue_proxy_resource_as_prometheus_stores_it() -> None:
    resource = otlp_resource(_revision(request_labels="otlp"), POD)
    assert resource["job"] == "mistral-predictor"  # service.name = SERVING_SERVICE, the Knative Service
    assert resource["instance"] == POD  # service.instance.id = system.PodName()
    assert resource["k8s_namespace_name"] == "llm"
    assert resource["kn_revision_name"] == REVISION
    assert "k8s_pod_name" not in resource  # Knative sets no k8s.pod.name


def test_pushed_series_carry_job_and_instance_and_only_promoted_attributes() -> None:
    promoted = otlp_labels(_revision(request_labels="otlp"), POD)
    assert promoted == {"job": "mistral-predictor", "instance": POD, "k8s_namespace_name": "llm"}
    assert otlp_labels(_revision(request_labels="otlp-target-info"), POD) == {
        "job": "mistral-predictor",
        "instance": POD,
    }


def test_the_simulation_renders_otlp_series_without_namespace_or_pod_and_a_target_info() -> None:
    simulation = Simulation([_revision(request_labels="otlp-target-info")], start=0.0, end=60.0, step=5.0)
    counts = _series(simulation, "kn_serving_invocation_duration_seconds_count")
    assert counts
    assert all("namespace" not in s and "pod" not in s and "k8s_namespace_name" not in s for s in counts)
    assert all((s["job"], s["instance"]) == ("mistral-predictor", POD) for s in counts)
    info = _series(simulation, "target_info")
    assert len(info) == len(counts)  # a sample with every push
    assert all(entry == otlp_resource(_revision(), POD) for entry in info)  # one series per pod: its resource


def test_kube_state_metrics_without_honor_labels_are_exported_star() -> None:
    simulation = Simulation([_revision(ksm_labels="exported_pod")], start=0.0, end=60.0, step=5.0)
    restarts = _series(simulation, "kube_pod_container_status_restarts_total")
    assert restarts
    for series in restarts:
        assert (series["exported_namespace"], series["exported_pod"]) == ("llm", POD)
        assert series["exported_container"] in {"kserve-container", "queue-proxy"}
        # the target's own labels: kube-state-metrics' pod
        assert (series["namespace"], series["container"]) == ("monitoring", "kube-state-metrics")


def test_the_fleet_renders_kube_state_metrics_without_honor_labels() -> None:
    pods = {("llm", POD): PodSimulator(POD, REVISION, "llm", RevisionBehaviour(), seed=1)}
    text = _render(pods, {("llm", POD): ("uid-1", 0.0, 5.0)}, "pod", "exported_pod")
    created = next(line for line in text.splitlines() if line.startswith("kube_pod_created{"))
    assert f'exported_pod="{POD}"' in created and 'namespace="monitoring"' in created
    restarts = next(
        line for line in text.splitlines() if line.startswith("kube_pod_container_status_restarts")
    )
    assert 'exported_container="kserve-container"' in restarts
