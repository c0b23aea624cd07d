"""Operator commands through the controller and the real CLI, against the API emulator over HTTP
(issue 17, items 4 and 8): a command is bound to the revision and step it was issued for, its
issuer is the Kubernetes identity that wrote it, the controller's answer reaches the person who
issued it, and what a ConfigMap holds reaches the terminal without control characters."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service
from kubernetes import client, config
from typer.testing import CliRunner

from canary.cli import app
from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.kserve.client import InferenceServiceClient
from canary.kserve.store import (
    EXPLAIN_KEY,
    STATE_KEY,
    ConfigMapStateStore,
)
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import NotificationDispatcher
from canary.policy import LoadedPolicy, load_text
from canary.rollout.records import CommandOutcome, CommandRequest, ExplainCheck, ExplainDocument
from canary.rollout.state import CommandKind, HistoryEntry, Phase, RolloutState
from tests.cli.support import invoke
from tests.policy.support import valid_policy

A = "llama-predictor-00002"
B = "llama-predictor-00003"


@dataclass
class Clock:
    """The controller's clock: the real time, shifted by ``offset`` (a controller whose clock is ahead)."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class World:
    emulator: Emulator
    server: EmulatorServer
    kubeconfig: Path
    api: client.ApiClient
    reconciler: Reconciler
    clock: Clock
    policy: LoadedPolicy

    @property
    def store(self) -> ConfigMapStateStore:
        return ConfigMapStateStore(self.api)

    def reconcile(self) -> None:
        outcome = self.reconciler.reconcile(self.policy)
        assert outcome.error is None, outcome.error

    def push(self, storage_uri: str) -> None:
        """A new predictor spec (a new revision), as a GitOps tool would push it."""
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            "llama",
            {"spec": {"predictor": {"model": {"storageUri": storage_uri}}}},
        )
        self.emulator.settle()

    def canary_percent(self) -> object:
        isvc = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", "ml", "inferenceservices", "llama"
        )
        return isvc["spec"]["predictor"].get("canaryTrafficPercent")  # type: ignore[index]

    def rollout_of(
        self, revision: str, phases: frozenset[Phase] = frozenset({Phase.PROGRESSING})
    ) -> RolloutState:
        """Reconcile until the rollout of ``revision`` is under way (KServe settles in between)."""
        for _ in range(50):
            self.reconcile()
            self.emulator.settle()
            time.sleep(0.05)
            state = self.store.load("ml", "llama").state()
            if state.revision == revision and state.phase in phases and state.step is not None:
                return state
        raise AssertionError(f"no rollout of {revision}: {self.store.load('ml', 'llama').state_json}")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            inference_service("ml", "llama", "s3://m/v1"),
        )
        emulator.settle()
        dispatcher = NotificationDispatcher()
        source = PrometheusEvidenceSource(PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1))
        clock = Clock()
        reconciler = Reconciler(
            inference_services=InferenceServiceClient(api),
            store=ConfigMapStateStore(api),
            evidence=source,
            dispatcher=dispatcher,
            metrics=ControllerMetrics(),
            clock=clock,
        )
        world = World(
            emulator, server, kubeconfig, api, reconciler, clock, load_text(valid_policy("llama")).policies[0]
        )
        world.reconcile()  # first sight: llama-predictor-00001 is the rolled-out revision
        try:
            yield world
        finally:
            dispatcher.close(1)


class Controller:
    """The reconciler running beside the CLI, as the controller's scheduler would run it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            self.world.reconciler.reconcile(self.world.policy)

    def __enter__(self) -> Controller:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(5)


def cli(world: World, *arguments: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*arguments, "--kubeconfig", str(kubeconfig or world.kubeconfig)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def answer(world: World) -> CommandOutcome:
    outcome = world.store.load("ml", "llama").command_result()
    assert outcome is not None
    return outcome


# -- bound to a revision and a step ---------------------------------------------------------------


def test_a_promote_issued_for_one_revision_is_refused_for_another(world: World) -> None:
    world.push("s3://m/v2")
    seen = world.rollout_of(A)
    # The person saw A; before the command is read, a new spec starts B's rollout.
    world.push("s3://m/v3")
    world.rollout_of(B, frozenset({Phase.PENDING, Phase.PROGRESSING}))
    assert world.canary_percent() is not None
    promote = CommandRequest(
        CommandKind.PROMOTE,
        by="alice",
        at=world.clock(),
        revision=A,
        step=seen.step.index if seen.step else None,
        id="p1",
    )
    world.store.request_command("ml", "llama", promote, issuer="alice")
    world.reconcile()
    assert answer(world) == CommandOutcome(
        "promote",
        False,
        f"promote was issued for {A}, the rollout is now of {B}: refused",
        answer(world).at,
        id="p1",
        by="alice",
        revision=A,
    )
    stored = world.store.load("ml", "llama")
    assert stored.command_json is None, "the command is consumed"
    assert stored.state().revision == B
    assert stored.state().command is None, "no promotion waits for B to become Ready"
    assert world.canary_percent() is not None, "B was not promoted past its analysis"
    # Through the CLI, a person who names the revision they saw is refused at once.
    code, _out, err = cli(world, "promote", "ml/llama", "--revision", A, "--no-wait")
    assert code == 1
    assert f"promote for {A} refused: the rollout of ml/llama is of {B}" in err
    assert world.store.load("ml", "llama").command_json is None


def test_a_stale_command_is_refused_with_its_reason(world: World) -> None:
    world.push("s3://m/v2")
    state = world.rollout_of(A)
    assert state.step is not None
    ahead = CommandRequest(
        CommandKind.PAUSE, by="bob", at=world.clock(), revision=A, step=state.step.index + 1, id="s1"
    )
    world.store.request_command("ml", "llama", ahead, issuer="bob")
    world.reconcile()
    refused = answer(world)
    assert (refused.accepted, refused.id) == (False, "s1")
    assert refused.message == (
        f"pause was issued at step {state.step.index + 2} of {A}, the rollout has moved to step "
        f"{state.step.index + 1} ({state.step.weight}%) since: stale, refused"
    )
    assert world.store.load("ml", "llama").state().phase is Phase.PROGRESSING
    old = CommandRequest(
        CommandKind.PAUSE,
        by="bob",
        at=world.clock() - timedelta(hours=2),
        revision=A,
        step=state.step.index,
        id="s2",
    )
    world.store.request_command("ml", "llama", old, issuer="bob")
    world.reconcile()
    assert answer(world).id == "s2"
    assert "expired, refused" in answer(world).message
    # The answer stays beside the state through later evaluations, until the next command.
    world.reconcile()
    assert answer(world).id == "s2"


# -- the answer reaches the person ----------------------------------------------------------------


def test_the_cli_prints_the_controllers_refusal_and_exits_1(world: World) -> None:
    world.push("s3://m/v2")
    world.rollout_of(A)
    # The controller's clock runs two hours ahead of the CLI's: to it, every command is expired. The
    # CLI cannot know; the controller is the authority, and its refusal is what the person sees.
    world.clock.offset = timedelta(hours=2)
    with Controller(world):
        code, out, err = cli(world, "pause", "ml/llama", "--wait", "20")
    assert code == 1, out + err
    assert f"pause of ml/llama ({A}, step 1" in out
    assert "the controller refused pause of ml/llama: pause was issued at" in err
    assert "expired, refused" in err
    assert world.store.load("ml", "llama").state().phase is Phase.PROGRESSING
    # Accepted: exit 0 with the controller's words.
    world.clock.offset = timedelta()
    with Controller(world):
        code, out, err = cli(world, "pause", "ml/llama", "--wait", "20")
    assert code == 0, out + err
    assert f"the controller accepted pause of ml/llama: rollout of {A} paused" in out
    assert world.store.load("ml", "llama").state().phase is Phase.PAUSED
    # What is impossible now is refused at once, without waiting for anyone.
    code, out, err = cli(world, "pause", "ml/llama", "--wait", "20")
    assert code == 1
    assert "pause of ml/llama refused: already paused" in err
    code, out, err = cli(world, "abort", "ml/ghost")
    assert (code, err.strip()) == (1, "no rollout state for ml/ghost: kserve-canary has not seen it")
    # No controller: the command waits, and the CLI says so (exit 3) instead of claiming success.
    code, out, err = cli(world, "resume", "ml/llama", "--wait", "1")
    assert code == 3
    assert "no answer from the controller within 1s" in err
    assert world.store.load("ml", "llama").command() is not None
    # ... and a second command does not overwrite the first one before the controller read it.
    code, out, err = cli(world, "abort", "ml/llama", "--no-wait")
    assert code == 1
    assert "resume by kubernetes-admin" in err and "is waiting for the controller" in err


def test_approve_of_a_step_the_policy_does_not_hold_is_refused_by_the_controller(world: World) -> None:
    world.push("s3://m/v2")
    world.rollout_of(A)
    # The CLI cannot read a file policy; the controller can, and refuses: no step has approval: manual.
    with Controller(world):
        code, out, err = cli(world, "approve", "ml/llama", "--wait", "20")
    assert code == 1, out + err
    assert (
        "the controller refused approve of ml/llama: step 10% does not wait for approval: the policy's "
        "steps with approval: manual are none"
    ) in err
    assert world.store.load("ml", "llama").state().approvals == ()


def test_by_is_the_kubernetes_identity_not_an_environment_variable(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.push("s3://m/v2")
    world.rollout_of(A)
    monkeypatch.setenv("KSERVE_CANARY_USER", "mallory")
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    alice = world.server.write_kubeconfig(tmp_path / "alice", "ml", user="alice@example.com")
    code, out, err = cli(world, "pause", "ml/llama", "--no-wait", kubeconfig=alice)
    assert code == 0, out + err
    stored = world.store.load("ml", "llama")
    assert stored.command_issuer == "alice@example.com"
    command = stored.command()
    assert command is not None
    assert command.by == "alice@example.com"
    assert (command.revision, command.state_resource_version) == (A, stored_version_before(world, command))
    assert "mallory" not in (stored.command_json or "") + out + err
    # The controller believes the issuer key (which admission checks), not what command.json says.
    world.store.request_command("ml", "llama", replace(command, by="root"), issuer="carol")
    world.reconcile()
    state = world.store.load("ml", "llama").state()
    assert state.phase is Phase.PAUSED
    assert "(by carol)" in state.history[-1].reason
    assert answer(world).by == "carol"
    # An API server without SelfSubjectReview: the kubeconfig's user name, said to be unverified.
    world.emulator.faults.add_from_json(
        {"method": "POST", "path": "/apis/authentication.k8s.io/v1/selfsubjectreviews", "status": 404}
    )
    code, out, err = cli(world, "resume", "ml/llama", "--no-wait", kubeconfig=alice)
    assert code == 0, out + err
    assert world.store.load("ml", "llama").command_issuer == "alice@example.com"
    assert "note: the API server answered 404 to a SelfSubjectReview" in err
    assert "which nothing verified" in err
    # Any other failure is not a reason to guess a name: nothing is issued.
    world.emulator.faults.clear()
    world.emulator.faults.add_from_json(
        {"method": "POST", "path": "/apis/authentication.k8s.io/v1/selfsubjectreviews", "status": 500}
    )
    before = world.store.load("ml", "llama").resource_version
    code, out, err = cli(world, "pause", "ml/llama", "--no-wait", kubeconfig=alice)
    assert code == 1
    assert "pause not issued: the API server answered 500" in err
    assert world.store.load("ml", "llama").resource_version == before


def stored_version_before(world: World, command: CommandRequest) -> str | None:
    """The resourceVersion the command was issued against: the one before the command's own write."""
    assert command.state_resource_version is not None
    current = world.store.load("ml", "llama").resource_version
    assert current is not None and int(command.state_resource_version) < int(current)
    return command.state_resource_version


# -- what reaches the terminal ---------------------------------------------------------------------

HOSTILE = (
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"  # an OSC 8 hyperlink
    "\x1b]0;pwned\x07"  # the window title
    "all good\rPROMOTED\x08\x08\x08"  # overwrite the line, back up
    "\x9b31m\u202etxt.exe"  # an 8-bit CSI, a right-to-left override
    " [link=https://evil.example/]markup[/link]"  # Rich markup must stay text
)
# The only characters allowed out: printable ones and newlines.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_explain_and_status_strip_control_characters(world: World) -> None:
    state = RolloutState(
        phase=Phase.PROGRESSING,
        revision=f"llama-{HOSTILE}",
        history=(
            HistoryEntry(world.clock(), "wait", None, Phase.PROGRESSING, "CanaryWaiting", HOSTILE, "d1"),
        ),
    )
    explain = ExplainDocument(
        at=world.clock(),
        decision_id="d1",
        revision=HOSTILE,
        stable_revision=HOSTILE,
        action=HOSTILE,
        reasons=(HOSTILE,),
        checks=(ExplainCheck(name=HOSTILE, verdict=HOSTILE, limit=HOSTILE, query=HOSTILE),),
    )
    current = world.store.load("ml", "llama")
    world.store.save_files(
        "ml",
        "llama",
        {STATE_KEY: state.to_json(), EXPLAIN_KEY: explain.to_json()},
        resource_version=current.resource_version,
        owner_uid=None,
    )
    environment = {"COLUMNS": "400", "KUBECONFIG": str(world.kubeconfig)}
    for arguments in (["status"], ["explain", "ml/llama"]):
        plain = invoke(*arguments, **environment)
        assert plain.returncode == 0, plain.stderr
        shown = plain.stdout
        assert "all good" in shown and "PROMOTED" in shown, shown
        assert "[link=https://evil.example/]markup[/link]" in shown, "markup is shown, not interpreted"
        assert CONTROL.findall(shown) == [], f"{arguments}: {shown!r}"
        # On a terminal Rich adds its own styles (SGR); nothing else may come from the ConfigMap.
        coloured = invoke(*arguments, **environment, FORCE_COLOR="1", TTY_COMPATIBLE="1")
        assert coloured.returncode == 0, coloured.stderr
        styled = coloured.stdout
        assert CONTROL.findall(re.sub(r"\x1b\[[0-9;]*m", "", styled)) == [], f"{arguments}: {styled!r}"
        assert "evil.example/\x1b" not in styled and "\x1b]" not in styled
