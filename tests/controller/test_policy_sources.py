"""PromotionPolicy objects as a policy source (docs/design.md §5): parsing, the conflict rule across
sources, and what an object may reach (tenancy). Pure: no API server."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from canary.controller.policies import PolicyRegistry
from canary.notify.secrets import Redactor, SecretResolver, SecretUnavailable
from canary.policy.loader import load_text
from canary.policy.model import SecretRef
from canary.policy.objects import ObjectRules, load_object
from canary.policy.scope import SecretScope
from tests.policy.support import valid_policy


def policy_object(
    name: str = "llama", target: str | None = None, namespace: str = "ml", **spec: Any
) -> dict[str, Any]:
    """A PromotionPolicy as the API server serves it: server-set metadata and a status included."""
    document = yaml.safe_load(valid_policy(name, target))
    document["metadata"] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "generation": 3,
        "resourceVersion": "812",
        "creationTimestamp": "2026-12-01T12:00:00Z",
        "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
    }
    document["spec"].update(spec)
    document["status"] = {"phase": "Progressing", "observedGeneration": 2}
    return document


def test_an_object_parses_with_the_same_model_as_a_file() -> None:
    loaded, errors = load_object(policy_object())
    assert errors == []
    assert loaded is not None
    assert loaded.origin == "promotionpolicy/ml/llama"
    assert loaded.object is not None and (loaded.object.uid, loaded.object.generation) == ("uid-llama", 3)
    [from_file] = load_text(valid_policy("llama"), "ml/llama.yaml").policies
    assert loaded.policy.spec == from_file.policy.spec
    assert loaded.policy.key == "ml/llama"


def test_an_invalid_object_reports_what_validate_prints_for_a_file() -> None:
    broken = policy_object()
    broken["spec"]["checks"][0]["max"] = "soon"
    broken["spec"]["maxIncrase"] = "20%"
    loaded, errors = load_object(broken)
    assert loaded is None
    as_file = {**broken, "metadata": {"name": "llama", "namespace": "ml"}}
    as_file.pop("status")
    file_errors = load_text(yaml.safe_dump(as_file), "ml/llama.yaml").errors
    assert {(e.field, e.message) for e in errors} == {(e.field, e.message) for e in file_errors}
    fields = {e.field for e in errors}
    assert fields == {"spec.checks[0].max", "spec.maxIncrase"}
    assert all(str(e).startswith("promotionpolicy/ml/llama: spec.") for e in errors)
    assert all(e.line is None for e in errors)
    unknown = next(e for e in errors if e.field == "spec.maxIncrase")
    assert "unknown field 'maxIncrase'" in unknown.message


def test_the_object_namespace_is_the_policy_namespace() -> None:
    loaded, errors = load_object(policy_object(target="llama", namespace="team-b"))
    assert errors == [] and loaded is not None and loaded.policy.key == "team-b/llama"
    same = policy_object()
    same["spec"]["target"]["namespace"] = "ml"
    assert load_object(same)[1] == []
    other = policy_object()
    other["spec"]["target"]["namespace"] = "prod"
    loaded, errors = load_object(other)
    assert loaded is None
    assert [e.field for e in errors] == ["spec.target.namespace"]
    assert "own namespace" in errors[0].message


def test_custom_promql_from_an_object_is_refused_unless_the_platform_allows_it() -> None:
    custom = policy_object()
    custom["spec"]["checks"].append(
        {"name": "queue", "promql": 'max(queue{revision="{{ revision }}"})', "max": 5}
    )
    custom["spec"]["metrics"] = {"queries": {"request-count": 'sum(x{revision="{{ revision }}"})'}}
    loaded, errors = load_object(custom)
    assert loaded is None
    assert sorted(e.field or "" for e in errors) == [
        "spec.checks[1].promql",
        "spec.metrics.queries.request-count",
    ]
    assert all("--allow-custom-promql-from-crds" in e.message for e in errors)
    allowed, errors = load_object(custom, rules=ObjectRules(allow_custom_promql=True))
    assert errors == [] and allowed is not None


def test_an_object_names_keys_of_its_namespace_secret_never_files() -> None:
    slack = policy_object()
    slack["spec"]["notify"] = [{"slack": {"webhookUrlFrom": {"env": "SLACK_URL"}}}]
    assert load_object(slack)[1] == []
    by_file = policy_object()
    by_file["spec"]["notify"] = [{"webhook": {"urlFrom": {"file": "hooks/url"}}}]
    loaded, errors = load_object(by_file)
    assert loaded is None
    assert [e.field for e in errors] == ["spec.notify[0].webhook.urlFrom.file"]
    assert "Secret kserve-canary-notifications in namespace ml" in errors[0].message


def test_hostile_objects_are_errors_not_exceptions() -> None:
    for bad in (None, [], {"metadata": "x"}, {"metadata": {"name": "x", "namespace": "ml"}, "spec": []}):
        loaded, errors = load_object(bad)
        assert loaded is None and errors


# -- the conflict rule across sources ------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ml").mkdir()
    return tmp_path


def objects(*documents: dict[str, Any]) -> list[Any]:
    found = []
    for document in documents:
        loaded, errors = load_object(document)
        assert loaded is not None, errors
        found.append(loaded)
    return found


def test_a_file_and_an_object_for_one_model_hold_it_and_both_are_told(root: Path) -> None:
    (root / "ml" / "llama.yaml").write_text(valid_policy("from-file", target="llama"))
    registry = PolicyRegistry([root])
    assert registry.reload().added == ["ml/llama"]
    registry.set_objects(objects(policy_object("from-object", target="llama")))
    report = registry.reload()
    assert (report.held, report.removed, report.added) == (["ml/llama"], [], [])
    assert registry.get("ml/llama") is None
    [conflict] = report.conflicts
    assert {c.origin for c in conflict.claimants} == {
        "promotionpolicy/ml/from-object",
        f"{root}/ml/llama.yaml:1",
    }
    assert {e.path for e in report.errors} == {"promotionpolicy/ml/from-object", f"{root}/ml/llama.yaml"}
    # Removing the file hands the model over to the object, without a pause (nothing removed).
    (root / "ml" / "llama.yaml").unlink()
    report = registry.reload()
    assert (report.added, report.removed, report.conflicts) == (["ml/llama"], [], [])
    governing = registry.get("ml/llama")
    assert governing is not None and governing.origin == "promotionpolicy/ml/from-object"


def test_two_objects_for_one_model_hold_it(root: Path) -> None:
    registry = PolicyRegistry([root], files=False)
    registry.set_objects(objects(policy_object("a", target="llama"), policy_object("b", target="llama")))
    report = registry.reload()
    assert report.held == ["ml/llama"] and registry.active == {}
    registry.set_objects(objects(policy_object("b", target="llama")))
    assert registry.reload().added == ["ml/llama"]


def test_objects_alone_never_read_the_policy_directory(root: Path) -> None:
    (root / "ml" / "llama.yaml").write_text(valid_policy("from-file", target="llama"))
    registry = PolicyRegistry([root], files=False)
    registry.set_objects(objects(policy_object("other")))
    registry.reload()
    assert sorted(registry.active) == ["ml/other"]


def test_an_unchanged_set_of_objects_is_no_reload(root: Path) -> None:
    registry = PolicyRegistry([root], files=False)
    registry.set_objects(objects(policy_object("a")))
    assert registry.reload().changed
    registry.set_objects(objects(policy_object("a")))
    assert not registry.reload().changed
    edited = policy_object("a")
    edited["spec"]["window"] = "20m"
    registry.set_objects(objects(edited))
    assert registry.reload().updated == ["ml/a"]


# -- secrets of an object: its namespace's Secret, through the API only --------------------------


def test_an_object_resolver_reads_its_namespace_secret_and_never_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLACK_URL", "https://hooks.slack.com/services/T0/B0/controller-own")
    asked: list[tuple[str, str]] = []
    secrets = {("ml", "kserve-canary-notifications"): {"SLACK_URL": "https://example.com/ml-team-hook-123\n"}}

    def reader(namespace: str, name: str) -> dict[str, str] | None:
        asked.append((namespace, name))
        return secrets.get((namespace, name))

    redactor = Redactor()
    base = SecretResolver(redactor, scope=SecretScope(env_allow={"ml": ("*",)}))
    resolver = base.from_namespace_secret("ml", reader, "kserve-canary-notifications")
    assert resolver.resolve(SecretRef(env="SLACK_URL")) == "https://example.com/ml-team-hook-123"
    assert asked == [("ml", "kserve-canary-notifications")]
    assert "https://example.com/ml-team-hook-123" in redactor
    # A key the Secret lacks is not looked up in the controller's environment (which has it).
    with pytest.raises(
        SecretUnavailable, match="key OTHER of Secret ml/kserve-canary-notifications is not set"
    ):
        resolver.resolve(SecretRef(env="OTHER"))
    monkeypatch.setenv("OTHER", "controller-value-xyz")
    with pytest.raises(SecretUnavailable):
        resolver.resolve(SecretRef(env="OTHER"))
    with pytest.raises(SecretUnavailable, match="not files"):
        resolver.resolve(SecretRef(file="url"))
    team_b = base.from_namespace_secret("team-b", reader, "kserve-canary-notifications")
    with pytest.raises(SecretUnavailable, match="no Secret kserve-canary-notifications in namespace team-b"):
        team_b.resolve(SecretRef(env="SLACK_URL"))
    # The file resolver of the same namespace still reads the environment it was allowed.
    assert base.scoped("ml").resolve(SecretRef(env="SLACK_URL")).endswith("controller-own")


def test_an_api_error_reading_the_secret_names_no_value() -> None:
    def failing(namespace: str, name: str) -> dict[str, str] | None:
        raise RuntimeError("403 Forbidden: secrets kserve-canary-notifications")

    resolver = SecretResolver(Redactor()).from_namespace_secret("ml", failing, "kserve-canary-notifications")
    with pytest.raises(SecretUnavailable, match="cannot be read: 403 Forbidden"):
        resolver.resolve(SecretRef(env="SLACK_URL"))


def test_object_rules_are_a_copy_per_call() -> None:
    document = policy_object()
    before = copy.deepcopy(document)
    load_object(document)
    assert document == before, "parsing never changes the cached object"
