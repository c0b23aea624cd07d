"""``kserve-canary run``'s flags, parsed by the real command, land in their settings groups, and the
flags' defaults are the settings' own (one source of truth each, checked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.main import get_command

from canary.cli import app
from canary.cli.controller import controller_settings, headers
from canary.controller.settings import (
    ClusterSettings,
    ControllerSettings,
    LeaseSettings,
    NotifySettings,
    PolicyObjectSettings,
    PolicySource,
    PrometheusSettings,
    TickSettings,
)
from canary.policy.scope import NamespaceSource


def settings(*args: str) -> ControllerSettings:
    command = get_command(app).commands["run"]  # type: ignore[attr-defined]
    with command.make_context("run", list(args)) as context:
        return controller_settings(context.params)


def test_every_flag_lands_in_its_settings_group(tmp_path: Path) -> None:
    chosen = settings(
        *("--policies", "/p1", "--policies", "/p2", "--policy-source", "files,crd"),
        *("--policy-namespaces", "metadata", "--secret-file-root", str(tmp_path)),
        *("--secret-env-allow", "ml=ML_*", "--custom-promql-allow-metric", "up"),
        *("--custom-promql-tenancy-label", "kn_*=k8s_namespace_name", "--allow-custom-promql-from-crds"),
        *("--prometheus-url", "http://p:9", "--prometheus-header", "X-Scope-OrgID=t"),
        *("--prometheus-token-file", "/t", "--prometheus-ca-file", "/ca", "--prometheus-timeout", "3"),
        *("--scrape-interval", "15", "--namespace-query-budget", "1.5", "--min-samples", "7"),
        *("--no-leader-elect", "--lease-name", "L", "--lease-namespace", "LN", "--lease-duration", "9"),
        *(
            "--renew-deadline",
            "8",
            "--retry-period",
            "1",
            "--shards",
            "3",
            "--tick",
            "2",
            "--max-workers",
            "3",
        ),
        *("--notify-allow-host", "h1", "--notify-allow-host", "h2", "--notify-retry-for", "30m"),
        *("--notify-info-retry-for", "90s", "--cluster-name", "C", "--dashboard-url", "http://d"),
        *("--metrics-port", "9", "--metrics-bind-address", "10.0.0.1", "-n", "a", "-n", "b", "--dry-run"),
    )
    policies = chosen.policies
    assert policies.paths == (Path("/p1"), Path("/p2"))
    assert policies.sources == {PolicySource.FILES, PolicySource.CRD}
    assert policies.namespaces is NamespaceSource.METADATA
    assert (policies.secrets.file_root, policies.secrets.env_allow) == (tmp_path, {"ml": ("ML_*",)})
    assert (policies.promql.allow, policies.promql.labels) == (
        {"*": ("up",)},
        (("kn_*", "k8s_namespace_name"),),
    )
    assert chosen.objects == PolicyObjectSettings(allow_custom_promql=True)
    assert chosen.prometheus == PrometheusSettings(
        url="http://p:9",
        headers={"X-Scope-OrgID": "t"},
        token_file="/t",
        ca_file="/ca",
        timeout=3.0,
        scrape_interval=15.0,
        min_samples=7.0,
        namespace_query_budget=1.5,
    )
    identity = chosen.leasing.identity
    assert chosen.leasing == LeaseSettings(False, "L", "LN", identity, 9.0, 8.0, 1.0, 3)
    assert (chosen.tick.period, chosen.tick.max_workers) == (2.0, 3)
    assert chosen.notify == NotifySettings(("h1", "h2"), 1800.0, 90.0, "C", "http://d")
    assert (chosen.serving.port, chosen.serving.host) == (9, "10.0.0.1")
    assert chosen.cluster == ClusterSettings(namespaces=("a", "b"), dry_run=True)


def test_the_flags_defaults_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TICK_SECONDS", "PROMETHEUS_URL", "WATCH_NAMESPACES", "LEADER_ELECT", "POLICY_SOURCE"):
        monkeypatch.delenv(variable, raising=False)
    chosen = settings()
    assert chosen.objects == PolicyObjectSettings()
    assert chosen.prometheus == PrometheusSettings()
    assert chosen.leasing == LeaseSettings(identity=chosen.leasing.identity)
    assert chosen.tick == TickSettings()
    assert chosen.notify == NotifySettings()
    assert chosen.cluster == ClusterSettings()
    assert chosen.policies.sources == {PolicySource.AUTO}


def test_a_flag_it_cannot_read_names_the_flag() -> None:
    with pytest.raises(typer.BadParameter) as refused:
        settings("--notify-info-retry-for", "soon")
    assert refused.value.param_hint == "--notify-info-retry-for"


@pytest.mark.parametrize("header", ["Authorization: Bearer s3cr3t-t0ken", "=s3cr3t-t0ken"])
def test_a_malformed_prometheus_header_is_refused_without_quoting_it(header: str) -> None:
    """A header is where a credential travels: the error (stderr, the pod's log) names the flag and
    the shape expected, never the value given."""
    with pytest.raises(typer.BadParameter) as refused:
        headers([header])
    assert refused.value.param_hint == "--prometheus-header"
    assert "NAME=VALUE" in str(refused.value) and "s3cr3t" not in str(refused.value)
