"""A policy's secret references reach only what the operator opened to its namespace (issue 17).

The controller's resolver is scoped per namespace: ``file:`` inside ``<root>/<namespace>/`` (regular
files, 64 KiB, never blocking), ``env:`` only for allowed names. The same rules refuse the policy at
load time, with file and field.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from canary.notify.secrets import Redactor, SecretResolver, SecretUnavailable
from canary.policy import load_paths
from canary.policy.model import SecretRef
from canary.policy.scope import SecretScope, parse_env_allow
from tests.policy.support import valid_policy


def scoped(tmp_path: Path, namespace: str = "ml", **env: str) -> SecretResolver:
    scope = SecretScope(file_root=tmp_path / "secrets", env_allow={"ml": ("ML_*",)})
    return SecretResolver(Redactor(), env, scope=scope).scoped(namespace)


@pytest.fixture
def secret_root(tmp_path: Path) -> Path:
    (tmp_path / "secrets" / "ml" / "hook").mkdir(parents=True)
    (tmp_path / "secrets" / "ml" / "hook" / "url").write_text("https://hooks.example.com/ml-secret-path\n")
    (tmp_path / "secrets" / "team-b").mkdir()
    (tmp_path / "secrets" / "team-b" / "key").write_text("team-b-hmac-key")
    return tmp_path / "secrets"


def test_a_relative_file_resolves_inside_the_namespace_directory(tmp_path: Path, secret_root: Path) -> None:
    assert scoped(tmp_path).resolve(SecretRef(file="hook/url")) == "https://hooks.example.com/ml-secret-path"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("/proc/self/environ", "is absolute"),
        ("../team-b/key", "must stay inside"),
        ("hook/../../team-b/key", "must stay inside"),
    ],
)
def test_files_outside_the_namespace_directory_are_refused(
    tmp_path: Path, secret_root: Path, name: str, reason: str
) -> None:
    with pytest.raises(SecretUnavailable, match=reason) as refused:
        scoped(tmp_path).resolve(SecretRef(file=name))
    assert "team-b-hmac-key" not in str(refused.value)


def test_a_symlink_leaving_the_namespace_directory_is_refused(tmp_path: Path, secret_root: Path) -> None:
    (secret_root / "ml" / "stolen").symlink_to(secret_root / "team-b" / "key")
    (secret_root / "ml" / "environ").symlink_to("/proc/self/environ")
    for name in ("stolen", "environ"):
        with pytest.raises(SecretUnavailable, match="leaves <secret file root>/ml/ through a symlink"):
            scoped(tmp_path).resolve(SecretRef(file=name))


def test_configmap_style_symlinks_inside_the_directory_are_followed(
    tmp_path: Path, secret_root: Path
) -> None:
    data = secret_root / "ml" / "..2026_12_01"
    data.mkdir()
    (data / "token").write_text("rotated-token-value")
    (secret_root / "ml" / "..data").symlink_to(data.name)
    (secret_root / "ml" / "token").symlink_to("..data/token")
    assert scoped(tmp_path).resolve(SecretRef(file="token")) == "rotated-token-value"


def test_without_a_file_root_file_references_are_refused(tmp_path: Path) -> None:
    resolver = SecretResolver(Redactor(), {}, scope=SecretScope()).scoped("ml")
    with pytest.raises(SecretUnavailable, match="without --secret-file-root"):
        resolver.resolve(SecretRef(file="hook/url"))


def test_a_fifo_is_refused_at_once(tmp_path: Path, secret_root: Path) -> None:
    os.mkfifo(secret_root / "ml" / "pipe")
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            scoped(tmp_path).resolve(SecretRef(file="pipe"))
        except BaseException as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the reader so the test run can end, then fail
        with open(secret_root / "ml" / "pipe", "wb"):
            pass
        pytest.fail("reading a FIFO blocked")
    assert isinstance(outcome[0], SecretUnavailable)
    assert "not a regular file" in str(outcome[0])


def test_a_device_is_refused_even_without_a_scope() -> None:
    # /dev/zero used to be read until the memory ran out.
    with pytest.raises(SecretUnavailable, match="not a regular file"):
        SecretResolver(Redactor(), {}).resolve(SecretRef(file="/dev/zero"))


def test_a_file_larger_than_64_kib_is_refused(tmp_path: Path, secret_root: Path) -> None:
    (secret_root / "ml" / "big").write_text("x" * (64 * 1024 + 1))
    with pytest.raises(SecretUnavailable, match="larger than 64 KiB"):
        scoped(tmp_path).resolve(SecretRef(file="big"))


def test_environment_variables_only_from_the_namespace_allow_list(tmp_path: Path) -> None:
    resolver = scoped(tmp_path, ML_HOOK_URL="https://hooks.example.com/ml", TEAM_B_HMAC="team-b-hmac-key")
    assert resolver.resolve(SecretRef(env="ML_HOOK_URL")) == "https://hooks.example.com/ml"
    with pytest.raises(SecretUnavailable) as refused:
        resolver.resolve(SecretRef(env="TEAM_B_HMAC"))
    assert "TEAM_B_HMAC is not allowed for namespace ml" in str(refused.value)
    assert "team-b-hmac-key" not in str(refused.value)
    other = scoped(tmp_path, namespace="web", ML_HOOK_URL="https://hooks.example.com/ml")
    with pytest.raises(SecretUnavailable, match="not allowed for namespace web .allowed: none"):
        other.resolve(SecretRef(env="ML_HOOK_URL"))


def test_env_allow_lists_parse_repeated_and_comma_separated_values() -> None:
    assert parse_env_allow(["ml=ML_*", "web=WEB_HOOK,web=WEB_KEY", " "]) == {
        "ml": ("ML_*",),
        "web": ("WEB_HOOK", "WEB_KEY"),
    }
    with pytest.raises(ValueError, match="NAMESPACE=GLOB"):
        parse_env_allow(["ML_*"])


def test_the_loader_refuses_what_the_resolver_would_with_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "ml").mkdir()
    notify = (
        "  notify:\n"
        "    - webhook: {urlFrom: {file: /proc/self/environ}, secretFrom: {env: TEAM_B_HMAC}}\n"
        "    - slack: {webhookUrlFrom: {env: ML_SLACK}}\n"
    )
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a") + notify)
    scope = SecretScope(file_root=tmp_path / "secrets", env_allow={"ml": ("ML_*",)})
    result = load_paths([tmp_path], secrets=scope)
    assert result.policies == []
    assert [(error.line, error.field) for error in result.errors] == [
        (13, "spec.notify[0].webhook.urlFrom.file"),
        (13, "spec.notify[0].webhook.secretFrom.env"),
    ]
    assert "is absolute" in result.errors[0].message
    assert "TEAM_B_HMAC is not allowed for namespace ml" in result.errors[1].message
    no_root = load_paths([tmp_path], secrets=SecretScope(env_allow={"ml": ("*",)}))
    assert [e.message for e in no_root.errors] == [
        "file references are disabled: the controller runs without --secret-file-root"
    ]
