"""What the end-to-end modules share: a policy's text, a stack whose models serve their stable
version, the controller started and the new versions set the GitOps way (a new ``storageUri``, no
percentage), and the questions each test asks of the outcome (phase, notifications, writes).

A module keeps what is its own (its behaviours, its checks, a fault, a ConfigMap of the cluster's)
and says it through the options here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until

V1, V2 = "s3://models/v1", "s3://models/v2"
STABLE = RevisionBehaviour(median_ms=80)
HEALTHY = RevisionBehaviour(median_ms=80, ready_after_s=1.0)
FINAL = frozenset({"Succeeded", "RolledBack"})


def policy(
    namespace: str,
    name: str,
    checks: Iterable[str],
    *,
    steps: str = "[10, 50, 100]",
    window: str = "4s",
    interval: str = "1s",
    deadline: str = "20s",
    extra: str = "",
    notify: bool = True,
    tail: str = "",
) -> str:
    """A PromotionPolicy for ``namespace/name``: ``checks`` one flow mapping each, ``extra`` lines of
    ``spec`` before the checks (indented two spaces), ``tail`` after the notifications."""
    lines = "".join(f"    - {check}\n" for check in checks)
    hook = "  notify:\n    - webhook: {urlFrom: {env: HOOK_URL}}\n" if notify else ""
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  target: {{inferenceService: {name}}}
  steps: {steps}
  window: {window}
  interval: {interval}
  minRequests: 10
  progressDeadline: {deadline}
{extra}  checks:
{lines}{hook}{tail}"""


@contextmanager
def serving(
    namespace: str,
    canaries: Mapping[str, RevisionBehaviour],
    policies: Mapping[str, str],
    *,
    rps: float = 60.0,
    stable: RevisionBehaviour = STABLE,
    env: Mapping[str, str] | None = None,
    prepare: Callable[[Stack], None] | None = None,
    **options: Any,
) -> Iterator[Stack]:
    """A stack whose models (``canaries``: name → the new version's behaviour) serve ``stable`` at
    V1 and have rolled it out; ``policies``: file name → text. ``HOOK_URL`` is the stack's receiver,
    ``env`` adds to the controller's environment, ``prepare`` runs before the models are applied and
    ``options`` go to :class:`Stack`."""
    models = [
        ModelTraffic(namespace, name, rps, {V1: stable, V2: canary}) for name, canary in canaries.items()
    ]
    with Stack(models, dict(policies), **options) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook", **(env or {})}
        if prepare is not None:
            prepare(started)
        for name in canaries:
            started.apply(inference_service(namespace, name, V1))
        assert wait_until(
            lambda: all(
                started.predictor_status(namespace, n).get("latestRolledoutRevision") for n in canaries
            ),
            30,
        )
        yield started


def roll_out(
    stack: Stack, identity: str, namespace: str, names: Iterable[str], *, settle: float = 3.0
) -> ControllerProcess:
    """The controller started, ``settle`` seconds for Prometheus to see the stable revisions, then
    each model's new version set."""
    started = stack.start_controller(identity)
    time.sleep(settle)
    for name in names:
        stack.set_storage_uri(namespace, name, V2)
    return started


def phase(stack: Stack, namespace: str, name: str) -> str | None:
    state = stack.state(namespace, name)
    return None if state is None else str(state.get("phase"))


def finished(stack: Stack, namespace: str, name: str, timeout: float = 90) -> str:
    """The rollout's final phase, once it has one; the state's end if it has none in ``timeout``."""
    assert wait_until(lambda: phase(stack, namespace, name) in FINAL, timeout), (
        f"{name} stayed in {phase(stack, namespace, name)}: "
        f"{json.dumps(stack.state(namespace, name), indent=1)[-3000:]}"
    )
    return str(phase(stack, namespace, name))


def history(stack: Stack, namespace: str, name: str) -> str:
    """The state's history, one ``action: reason`` a line."""
    state = stack.state(namespace, name) or {}
    return "\n".join(f"{entry['action']}: {entry['reason']}" for entry in state.get("history", []))


def notifications(stack: Stack, name: str) -> list[dict[str, Any]]:
    """The notifications about InferenceService ``name`` the stack's receiver got, in order."""
    return [r.json() for r in stack.receiver.requests if r.json()["inferenceService"]["name"] == name]


def story(stack: Stack, name: str) -> str:
    """What happened to a model, for assertion messages: every notification with its checks."""
    return "\n".join(
        f"{n['action']}: {n['summary']} {n['reasons']} "
        f"{[(c['name'], c['verdict'], c['value'], c.get('stable')) for c in n['checks']]}"
        for n in notifications(stack, name)
    )


def decided(stack: Stack, name: str, action: str, timeout: float = 20.0) -> dict[str, Any]:
    """The first ``action`` notification about ``name``: delivery runs in the background, so it may
    arrive a little after the state shows the decision."""
    assert wait_until(lambda: any(n["action"] == action for n in notifications(stack, name)), timeout), (
        f"no {action} notification for {name}:\n{story(stack, name)}"
    )
    return next(n for n in notifications(stack, name) if n["action"] == action)


def check(notification: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The check ``name`` of a notification."""
    found: dict[str, Any] = next(c for c in notification["checks"] if c["name"] == name)
    return found


def writes(stack: Stack, name: str) -> list[tuple[float, Any]]:
    """(time, canaryTrafficPercent) of every write the controller made to InferenceService ``name``,
    in order (``"<absent>"`` for a write without the field), from the API's request log."""
    found = []
    for entry in stack.emulator.requests.entries(method="PATCH", path_contains=f"/inferenceservices/{name}"):
        if (
            entry.status == 200
            and entry.user_agent.startswith("kserve-canary/")
            and isinstance(entry.body, dict)
        ):
            predictor = (entry.body.get("spec") or {}).get("predictor") or {}
            found.append((entry.time, predictor.get("canaryTrafficPercent", "<absent>")))
    return found


def written_percentages(stack: Stack, name: str) -> list[Any]:
    """The canaryTrafficPercent of every write the controller made to InferenceService ``name``."""
    return [percent for _, percent in writes(stack, name)]
