"""The state ConfigMap's files as people read them: `kserve-canary status` and `explain` against the
API emulator, with one rollout's files made hostile — the others must still show."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import config
from typer.testing import CliRunner

from canary.cli import app
from canary.kserve.store import COMMAND_KEY, EXPLAIN_KEY, STATE_KEY, ConfigMapStateStore
from canary.kserve.view import observe
from canary.rollout.state import Phase, RolloutState

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ConfigMapStateStore, Path]]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        yield ConfigMapStateStore(api), kubeconfig


def test_status_shows_every_rollout_when_some_files_are_hostile(
    cluster: tuple[ConfigMapStateStore, Path],
) -> None:
    store, kubeconfig = cluster
    good = RolloutState(phase=Phase.PROGRESSING, revision="good-predictor-00002").to_json()
    files = {
        "a-deep-state": {STATE_KEY: DEEP},
        "b-list-state": {STATE_KEY: "[1, 2]"},
        "c-deep-command": {STATE_KEY: good, COMMAND_KEY: DEEP},
        "d-list-command": {STATE_KEY: good, COMMAND_KEY: "[]"},
        "e-good": {STATE_KEY: good, COMMAND_KEY: json.dumps({"command": "pause", "by": "alice"})},
    }
    for name, content in files.items():
        store.save_files("ml", name, content, resource_version=None, owner_uid=None)
    result = CliRunner().invoke(app, ["status", "--format", "json", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 0, result.output
    rows = {row["model"]: row for row in json.loads(result.output)}
    assert set(rows) == {f"ml/{name}" for name in files}
    assert rows["ml/a-deep-state"]["phase"] == "Unreadable"
    assert "nested too deeply" in rows["ml/a-deep-state"]["reason"]
    assert "not a JSON object" in rows["ml/b-list-state"]["reason"]
    assert [
        rows[f"ml/{name}"]["pendingCommand"] for name in ("c-deep-command", "d-list-command", "e-good")
    ] == [
        "unreadable",
        "unreadable",
        "pause",
    ]
    assert {rows[f"ml/{name}"]["phase"] for name in ("c-deep-command", "d-list-command", "e-good")} == {
        "Progressing"
    }
    table = CliRunner().invoke(app, ["status", "--kubeconfig", str(kubeconfig)])
    assert table.exit_code == 0, table.output
    assert "e-good" in table.output and "Unreadable" in table.output


@pytest.mark.parametrize("explain", [DEEP, "[1]", '{"at": "yesterday"}'])
def test_explain_says_the_file_is_unreadable_instead_of_crashing(
    cluster: tuple[ConfigMapStateStore, Path], explain: str
) -> None:
    store, kubeconfig = cluster
    store.save_files(
        "ml",
        "llama",
        {STATE_KEY: RolloutState().to_json(), EXPLAIN_KEY: explain},
        resource_version=None,
        owner_uid=None,
    )
    result = CliRunner().invoke(app, ["explain", "ml/llama", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1
    assert "explain.json" in result.output
    assert not isinstance(result.exception, RecursionError)


def test_the_view_carries_the_uid_and_resource_version() -> None:
    view = observe({"metadata": {"name": "a", "namespace": "ml", "uid": "1234-abcd", "resourceVersion": "7"}})
    assert (view.uid, view.resource_version) == ("1234-abcd", "7")
    assert observe({"metadata": {"name": "a"}}).uid is None
