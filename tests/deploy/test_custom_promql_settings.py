"""The controller's custom-PromQL options as deploy settings (issue #34, Build item 6): Helm values
`customPromql.*` rendered into the Deployment's args, and the Kustomize component
deploy/components/custom-promql, which hands a generated ConfigMap to the controller as environment
variables. Each is read back by the controller's own option parser (``kserve-canary run``) and by
``validate``, which takes the same two tenancy options: what an install sets is what the controller
enforces."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from canary.cli import app
from tests.deploy.manifests import (
    CHART_VARIANTS,
    KUSTOMIZATIONS,
    controller_container,
    kustomize,
    one,
    render_chart,
)
from tests.policy.support import valid_policy

SETTINGS = CHART_VARIANTS["custom-promql"]
FLAGS = (
    "--allow-custom-promql-from-crds",
    "--custom-promql-allow-metric",
    "--custom-promql-tenancy-label",
    "--namespace-query-budget",
)


def _run_command() -> Any:
    """``kserve-canary run`` as its option parser (typer's own click)."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return group.commands["run"]


def _option(flag: str) -> Any:
    return next(param for param in _run_command().params if flag in param.opts)


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in (
            "ALLOW_CUSTOM_PROMQL_FROM_CRDS",
            "CUSTOM_PROMQL_ALLOW_METRIC",
            "CUSTOM_PROMQL_TENANCY_LABEL",
        ):
            patch.delenv(name, raising=False)
        patch.delenv("NAMESPACE_QUERY_BUDGET", raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        yield


def _parsed(args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``kserve-canary run ARGS`` (with ``env``) reads for each custom-PromQL option."""
    with _environment(env or {}):
        context = _run_command().make_context("run", list(args))
    return {flag: context.params[_option(flag).name or ""] for flag in FLAGS}


def _validates(root: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> int:
    with _environment(env or {}):
        return CliRunner().invoke(app, ["validate", str(root), *args]).exit_code


def _policies(tmp_path: Path) -> tuple[Path, Path]:
    """Two policy roots of namespace ml: one reads the shared gateway's series of namespace edge (needs
    ``ml=gateway_*`` allowed), one a recording rule whose namespace label is ``tenant`` naming
    another namespace (refused once ``job:*=tenant`` says that is its tenancy label)."""
    roots = []
    for name, promql in (
        ("gateway", 'sum(rate(gateway_requests_total{namespace="edge", route="ml"}[5m]))'),
        ("recorded", 'sum(job:requests:rate5m{tenant="payments"})'),
    ):
        root = tmp_path / name
        (root / "ml").mkdir(parents=True)
        check = f"    - {{name: {name}, promql: '{promql}', max: 100}}\n"
        (root / "ml" / f"{name}.yaml").write_text(valid_policy(name) + check)
        roots.append(root)
    return roots[0], roots[1]


def _chart_flags(values: Mapping[str, Any]) -> list[str]:
    args = controller_container(render_chart(values))["args"]
    return [arg for arg in args if arg.startswith(FLAGS)]


def test_the_chart_renders_the_custom_promql_values_into_the_controllers_args() -> None:
    assert _chart_flags(SETTINGS) == [
        "--allow-custom-promql-from-crds",
        "--custom-promql-allow-metric=kube_node_status_allocatable",
        "--custom-promql-allow-metric=ml=gateway_*",
        "--custom-promql-tenancy-label=job:*=tenant",
        "--custom-promql-tenancy-label=kn_*=k8s_namespace_name",
        "--namespace-query-budget=1.5",
    ]
    args = controller_container(render_chart(SETTINGS))["args"]
    assert _parsed(args) == {
        "--allow-custom-promql-from-crds": True,
        "--custom-promql-allow-metric": ["kube_node_status_allocatable", "ml=gateway_*"],
        "--custom-promql-tenancy-label": ["job:*=tenant", "kn_*=k8s_namespace_name"],
        "--namespace-query-budget": 1.5,
    }


def test_the_charts_defaults_are_the_controllers() -> None:
    defaults = controller_container(render_chart())["args"]
    assert [arg for arg in defaults if arg.startswith(FLAGS)] == [
        f"--namespace-query-budget={_option('--namespace-query-budget').default:g}"
    ]
    assert _parsed(defaults) == _parsed()


def test_what_the_chart_sets_is_what_validate_and_the_controller_enforce(tmp_path: Path) -> None:
    gateway, recorded = _policies(tmp_path)
    flags = [arg for arg in _chart_flags(SETTINGS) if arg.startswith("--custom-promql-")]
    # Without the settings: the gateway query is refused (another namespace), the recording rule's
    # `tenant` is an ordinary label.
    assert (_validates(gateway), _validates(recorded)) == (1, 0)
    assert (_validates(gateway, flags), _validates(recorded, flags)) == (0, 1)


def test_the_chart_refuses_malformed_custom_promql_values() -> None:
    for wrong in (
        {"allowMetrics": ["ml=gateway_* extra"]},
        {"allowMetrics": ["Team_A=gateway_*"]},  # not a namespace name
        {"tenancyLabels": ["job:*"]},  # no label
        {"tenancyLabels": ["job:*=k8s.namespace.name"]},  # not a Prometheus label name
        {"namespaceQueryBudget": 0},
        {"allowMetric": ["up"]},  # misspelt key
    ):
        with pytest.raises(Exception, match="(?i)customPromql|additional"):
            render_chart({"customPromql": wrong})


def test_the_kustomize_component_hands_the_settings_to_the_controller(tmp_path: Path) -> None:
    manifests = kustomize(KUSTOMIZATIONS["custom-promql"])
    container = controller_container(manifests)
    (reference,) = [
        source["configMapRef"]["name"] for source in container["envFrom"] if "configMapRef" in source
    ]
    settings = one(manifests, "ConfigMap", reference)
    assert settings["metadata"]["namespace"] == one(manifests, "Deployment")["metadata"]["namespace"]
    assert reference.startswith("kserve-canary-custom-promql-")  # a content hash: a change rolls the pods
    env = settings["data"]
    assert _parsed(env=env) == {
        "--allow-custom-promql-from-crds": False,
        "--custom-promql-allow-metric": ["kube_node_status_allocatable,ml=gateway_*"],
        "--custom-promql-tenancy-label": ["job:*=namespace,kn_*=k8s_namespace_name"],
        "--namespace-query-budget": 2.0,
    }
    gateway, _ = _policies(tmp_path)
    assert (_validates(gateway), _validates(gateway, env=env)) == (1, 0)
    # Without the component, nothing of it.
    plain = controller_container(kustomize(KUSTOMIZATIONS["cluster-wide"]))
    assert not [source for source in plain["envFrom"] if "configMapRef" in source]
