"""Gates follow the secret rules of notifications (docs/security.md): a file's references are scoped
to its namespace, a PromotionPolicy object's are keys of its namespace's Secret, never files."""

from __future__ import annotations

from pathlib import Path

from canary.policy import load_paths
from canary.policy.objects import load_object
from canary.policy.scope import SecretScope
from tests.controller.test_policy_sources import policy_object
from tests.policy.support import valid_policy

GATES = (
    "  gates:\n"
    "    - {at: pre-rollout, webhook: {urlFrom: {file: ../payments/url}, secretFrom: {env: PAYMENTS_KEY}}}\n"
    "    - {name: load, at: pre-promotion, webhook: {urlFrom: {env: ML_GATE_URL}}}\n"
)


def test_a_files_gate_reads_only_what_its_namespace_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a") + GATES)
    scope = SecretScope(file_root=tmp_path / "secrets", env_allow={"ml": ("ML_*",)})
    result = load_paths([tmp_path], secrets=scope)
    assert result.policies == []
    assert [error.field for error in result.errors] == [
        "spec.gates[0].webhook.urlFrom.file",
        "spec.gates[0].webhook.secretFrom.env",
    ]
    assert "PAYMENTS_KEY is not allowed for namespace ml" in result.errors[1].message


def test_an_objects_gate_names_keys_of_its_namespace_secret_never_files() -> None:
    by_env = policy_object(gates=[{"at": "step", "webhook": {"urlFrom": {"env": "GATE_URL"}}}])
    assert load_object(by_env)[1] == []
    by_file = policy_object(gates=[{"at": "step", "webhook": {"urlFrom": {"file": "gates/url"}}}])
    loaded, errors = load_object(by_file)
    assert loaded is None
    assert [e.field for e in errors] == ["spec.gates[0].webhook.urlFrom.file"]
    assert "Secret kserve-canary-notifications in namespace ml" in errors[0].message
