"""The chart as a subchart of an umbrella chart, and on clusters with and without the
prometheus-operator: the values every `helm create` chart accepts (global, nameOverride,
fullnameOverride, commonLabels), monitoring objects only where their API is served, the icon, and
NOTES that say how to get the CLI and bind its roles for any release name."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.manifests import CHART, of_kind, one, render_chart, render_notes
from tests.deploy.release import package_chart
from tests.deploy.test_manifests import validate_all

PROMETHEUS = {"prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090"}}

# What an umbrella chart passes down: its globals and its naming and labelling conventions.
UMBRELLA: dict[str, Any] = {
    **PROMETHEUS,
    "global": {"imageRegistry": "registry.example.com", "storageClass": "fast"},
    "fullnameOverride": "canary",
    "commonLabels": {"team": "ml-platform", "cost-center": 42},
}


def _names(manifests: list[dict[str, Any]]) -> set[str]:
    return {m["metadata"]["name"] for m in manifests if m.get("kind") not in {"CustomResourceDefinition"}}


def test_an_umbrella_chart_s_values_are_accepted_and_followed() -> None:
    manifests = render_chart(UMBRELLA, name="platform")
    assert validate_all(manifests) == []
    deployment = one(manifests, "Deployment")
    assert deployment["metadata"]["name"] == "canary"
    assert {"canary-operator", "canary-viewer"} <= {
        m["metadata"]["name"] for m in of_kind(manifests, "ClusterRole")
    }
    for manifest in manifests:
        labels = manifest["metadata"].get("labels", {})
        if "helm.sh/chart" in labels:  # every object the chart labels gets the common labels
            assert labels["team"] == "ml-platform", manifest["metadata"]["name"]
            assert labels["cost-center"] == "42"
    # Never in a selector: it cannot change after installation.
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "platform"


def test_name_override_renames_the_objects_and_the_name_label() -> None:
    manifests = render_chart({**PROMETHEUS, "nameOverride": "canary"}, name="kc")
    assert validate_all(manifests) == []
    deployment = one(manifests, "Deployment")
    assert deployment["metadata"]["name"] == "kc-canary"
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "canary"
    # The alerts select the job label, which is the name label: they follow it.
    rule = one(manifests, "PrometheusRule")
    assert 'job="canary"' in yaml.safe_dump(rule)


def test_a_release_name_containing_the_chart_name_is_not_repeated() -> None:
    assert one(render_chart(PROMETHEUS, name="kserve-canary-prod"), "Deployment")["metadata"]["name"] == (
        "kserve-canary-prod"
    )


def test_monitoring_objects_only_where_the_cluster_serves_their_api() -> None:
    served = render_chart(PROMETHEUS)
    assert {m["kind"] for m in served} >= {"ServiceMonitor", "PrometheusRule"}
    bare = render_chart(PROMETHEUS, api_versions=())
    assert not of_kind(bare, "ServiceMonitor")
    assert not of_kind(bare, "PrometheusRule")
    assert validate_all(bare) == []
    # The rest is the same install.
    kept = {
        (m["kind"], m["metadata"]["name"])
        for m in served
        if m["kind"] not in {"ServiceMonitor", "PrometheusRule"}
    }
    assert kept == {(m["kind"], m["metadata"]["name"]) for m in bare}
    assert "were NOT created" in render_notes(PROMETHEUS, api_versions=())
    assert "were NOT created" not in render_notes(PROMETHEUS)
    # Turned off, they stay off whatever the cluster serves, and the NOTES do not mention them.
    off = {**PROMETHEUS, "serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}}
    assert not of_kind(render_chart(off), "ServiceMonitor")
    assert "Monitoring:" not in render_notes(off)


def _cli_lines(notes: str) -> list[str]:
    """The indented commands under NOTES' "The CLI ..." paragraph."""
    tail = notes[notes.index("The CLI (status, explain") :].split("\n\n", 1)[0]
    return [line.strip() for line in tail.splitlines()[2:]]


def test_notes_say_how_to_get_the_cli_for_a_development_and_a_released_chart(tmp_path: Path) -> None:
    """A released chart (packaged as the release workflow does: `helm package --version X
    --app-version X`) points at PyPI at its own version; a development chart (X.Y.Z-dev.N) has no
    PyPI package of its version, so its NOTES say to install from a clone, and never `pipx install`."""
    released = render_notes(PROMETHEUS, chart=package_chart(tmp_path / "released", version="0.1.0"))
    assert _cli_lines(released) == [
        "pipx install kserve-canary==0.1.0    # or: uv tool install kserve-canary==0.1.0",
        "kserve-canary status",
    ]
    dev = render_notes(PROMETHEUS, chart=package_chart(tmp_path / "dev", version="0.2.0-dev.3"))
    assert _cli_lines(dev) == [
        "git clone https://github.com/kserve-canary/kserve-canary && pip install ./kserve-canary",
        "(this chart, 0.2.0-dev.3, is a development build: no kserve-canary of its version is on PyPI)",
        "kserve-canary status",
    ]
    # The chart in this checkout says one or the other, by its version.
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    expected = (
        "pip install ./kserve-canary" if "-dev." in version else f"pipx install kserve-canary=={version}"
    )
    assert expected in _cli_lines(render_notes(PROMETHEUS))[0]


def test_notes_bind_this_release_s_roles() -> None:
    notes = render_notes(PROMETHEUS, name="kc")
    assert "--clusterrole=kc-kserve-canary-operator" in notes
    assert "--clusterrole=kc-kserve-canary-viewer" in notes
    # The roles named are the ones the release creates.
    roles = {m["metadata"]["name"] for m in of_kind(render_chart(PROMETHEUS, name="kc"), "ClusterRole")}
    assert {"kc-kserve-canary-operator", "kc-kserve-canary-viewer"} <= roles
    assert "--clusterrole=canary-operator" in render_notes(UMBRELLA, name="platform")
    # Without the roles, no command that would fail.
    assert "--clusterrole" not in render_notes({**PROMETHEUS, "rbac": {"operatorRoles": False}})


def test_the_chart_has_an_icon_and_lints_without_a_single_message() -> None:
    metadata = yaml.safe_load((CHART / "Chart.yaml").read_text())
    scheme, _, data = metadata["icon"].partition(",")
    assert scheme == "data:image/svg+xml;base64"
    assert base64.b64decode(data).startswith(b"<svg ")
    report = helm.lint(CHART, strict=True, namespace="kserve-canary", kube_version="v1.29.0")
    assert report["messages"] == [] and report["errors"] == []
    # The umbrella's values pass the schema and lint as well.
    assert helm.lint(CHART, UMBRELLA, strict=True, namespace="kserve-canary")["errors"] == []


def test_the_cluster_name_and_dashboard_reach_the_controller_s_flags() -> None:
    from tests.deploy.manifests import controller_container, render_chart_text
    from tests.deploy.test_manifests import run_flags

    values = {
        **PROMETHEUS,
        "notifications": {"clusterName": "prod-eu", "dashboardUrl": "https://canary.example.com"},
    }
    args = controller_container(render_chart(values))["args"]
    assert "--cluster-name=prod-eu" in args
    assert "--dashboard-url=https://canary.example.com" in args
    flags = run_flags()
    assert {"--cluster-name", "--dashboard-url"} <= set(flags)
    assert not any(
        arg.startswith("--cluster-name") for arg in controller_container(render_chart(PROMETHEUS))["args"]
    )
    with pytest.raises(helm.HelmError, match="does not match pattern"):
        render_chart_text({**PROMETHEUS, "notifications": {"dashboardUrl": "canary.example.com"}})
