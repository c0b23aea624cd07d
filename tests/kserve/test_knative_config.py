"""Knative's cluster-wide progress deadline, read over HTTP from the API emulator (issue #33, item 3).

Knative: ``progress-deadline`` of knative-serving/config-deployment, the legacy ``progressDeadline``
read first and overridden, 600 s when neither is set (knative/serving pkg/deployment/config.go lines
41-46 and ``NewConfigFromMap``). A refused read degrades to 600 s, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer
from kubernetes import client, config

from canary.kserve.knative_config import ClusterProgressDeadline, deadline_from_data


@pytest.fixture
def emulator() -> Emulator:
    return Emulator(seed=7)


@pytest.fixture
def api(emulator: Emulator, tmp_path: Path) -> Iterator[client.ApiClient]:
    with EmulatorServer(emulator) as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")
        api_client = config.new_client_from_config(config_file=str(path))
        yield api_client
        api_client.close()


def config_deployment(emulator: Emulator, data: dict[str, str]) -> None:
    emulator.create_namespace("knative-serving")
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "config-deployment", "namespace": "knative-serving"},
            "data": data,
        }
    )


def test_the_cluster_setting_is_read_by_name(emulator: Emulator, api: client.ApiClient) -> None:
    config_deployment(emulator, {"progress-deadline": "1800s", "queue-sidecar-image": "q"})
    deadline = ClusterProgressDeadline(api)()
    assert deadline.seconds == 1800
    assert deadline.source == 'knative-serving/config-deployment progress-deadline: "1800s"'
    (read,) = emulator.requests.entries(path_contains="/namespaces/knative-serving/")
    assert (read.method, read.path) == (
        "GET",
        "/api/v1/namespaces/knative-serving/configmaps/config-deployment",
    )


def test_a_forbidden_read_assumes_600_s_and_says_so(emulator: Emulator, api: client.ApiClient) -> None:
    config_deployment(emulator, {"progress-deadline": "1800s"})
    emulator.faults.add(r"/configmaps/config-deployment$", status=403, count=None)
    deadline = ClusterProgressDeadline(api)()
    assert deadline.seconds == 600
    assert "forbidden" in deadline.source and "Knative's default" in deadline.source


def test_no_config_deployment_is_knatives_default(api: client.ApiClient) -> None:
    deadline = ClusterProgressDeadline(api)()
    assert deadline.seconds == 600
    assert deadline.source == "Knative's default, no knative-serving/config-deployment"


def test_it_is_read_again_only_after_the_refresh(emulator: Emulator, api: client.ApiClient) -> None:
    clock = [0.0]
    reader = ClusterProgressDeadline(api, refresh=300, monotonic=lambda: clock[0])
    assert reader().seconds == 600
    config_deployment(emulator, {"progress-deadline": "20m"})
    clock[0] = 299
    assert reader().seconds == 600
    clock[0] = 300
    assert reader().seconds == 1200


@pytest.mark.parametrize(
    ("data", "seconds"),
    [
        ({}, 600),
        ({"progressDeadline": "900s"}, 900),
        ({"progressDeadline": "900s", "progress-deadline": "1200s"}, 1200),
        ({"progress-deadline": "-5s"}, 600),
        ({"progress-deadline": "soon"}, 600),
    ],
)
def test_the_keys_as_knative_reads_them(data: dict[str, str], seconds: float) -> None:
    assert deadline_from_data(data).seconds == seconds
