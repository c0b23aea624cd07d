"""An operator action from the dashboard: the command written as ``kserve-canary pause`` writes it.

The same steps as the CLI (canary/cli.py ``_command`` and ``_answer``), with the same lower-level
parts: the issuer is the API server's answer to a SelfSubjectReview (:func:`who_am_i`), the command
is bound to the revision and step read from the state and written under that state's
resourceVersion (:meth:`ConfigMapStateStore.request_command`), what is impossible now is refused at
once by the core's own rules (:func:`apply_command`), and then the controller's answer is awaited
in ``command-result.json``. The controller stays the authority: its refusal is what the page shows.

One addition: the page sends the revision and step it showed, and a rollout that has moved since is
refused before anything is written — a click means what the person saw.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import ConflictError
from canary.kserve.identity import who_am_i
from canary.kserve.store import ConfigMapStateStore, StoredState, state_configmap_name
from canary.rollout.commands import apply_command
from canary.rollout.records import COMMAND_TTL, CommandFormatError, CommandRequest
from canary.rollout.state import CommandKind, RolloutState, StateFormatError, describe_time

__all__ = ["ActionResult", "Unset", "perform_action"]

_ATTEMPTS = 5  # writes that lose a race with the controller are retried this often (as the CLI)
_POLL_SECONDS = 0.25


class Unset:
    """The page did not say what it saw (an API client): nothing to compare with."""


UNSET = Unset()


@dataclass(frozen=True)
class ActionResult:
    outcome: str  # accepted | refused | no-answer | withdrawn
    decided_by: str  # controller | dashboard | api-server
    message: str
    command_id: str | None = None
    by: str | None = None

    @property
    def http_status(self) -> int:
        return {"accepted": 200, "no-answer": 202, "refused": 409, "withdrawn": 409}[self.outcome]

    def to_dict(self) -> dict[str, object]:
        return {
            "outcome": self.outcome,
            "decidedBy": self.decided_by,
            "message": self.message,
            "commandId": self.command_id,
            "by": self.by,
        }


def _refused(message: str, by: str = "dashboard") -> ActionResult:
    return ActionResult("refused", by, message)


def _api_refusal(error: ApiException, what: str) -> ActionResult:
    """The API server's own words (an RBAC denial names the verb and resource)."""
    detail = ""
    try:
        detail = str(json.loads(error.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        detail = ""
    return _refused(
        f"{what}: the API server answered {error.status} {error.reason}" + (f": {detail}" if detail else ""),
        "api-server",
    )


def _step_text(state: RolloutState) -> str:
    return "no step yet" if state.step is None else f"step {state.step.index + 1} ({state.step.weight}%)"


def _waiting_command(stored: StoredState, now: datetime) -> str | None:
    """Someone else's command the controller has not read yet (an expired or unreadable one does not
    count: it would be refused anyway)."""
    try:
        command = stored.command()
    except CommandFormatError:
        return None
    if command is None or command.at is None or now - command.at > COMMAND_TTL:
        return None
    issuer = stored.command_issuer or command.by or "someone"
    return f"{command.command} by {issuer} ({describe_time(command.at)})"


def perform_action(
    api_client: client.ApiClient,
    kubeconfig: str | None,
    namespace: str,
    name: str,
    kind: CommandKind,
    *,
    seen_revision: str | Unset | None = UNSET,
    seen_step: int | Unset | None = UNSET,
    reason: str | None = None,
    wait: float = 90.0,
) -> ActionResult:
    """Issue ``kind`` for the rollout of ``namespace/name`` with the credentials of ``api_client``
    and wait up to ``wait`` seconds for the controller's answer."""
    store = ConfigMapStateStore(api_client)
    try:
        identity = who_am_i(api_client, kubeconfig)
    except ApiException as error:
        return _api_refusal(error, f"{kind} not issued: asking the API server who you are failed")
    action = _Action(store, namespace, name, kind, identity.username, reason, seen_revision, seen_step)
    written = action.write()
    if isinstance(written, ActionResult):
        return written
    state, command = written
    return _answer(store, namespace, name, command, wait, identity.username, state)


@dataclass(frozen=True)
class _Action:
    """One action being issued: for which rollout, by whom, and what the page showed of it."""

    store: ConfigMapStateStore
    namespace: str
    name: str
    kind: CommandKind
    by: str
    reason: str | None
    seen_revision: str | Unset | None
    seen_step: int | Unset | None

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}"

    def write(self) -> tuple[RolloutState, CommandRequest] | ActionResult:
        """Write the command bound to the rollout as the state shows it, retrying a write that loses a
        race while the rollout stays at the same revision and step; or the refusal."""
        kind, target = self.kind, self.target
        seen: tuple[str | None, int | None] | None = None
        for _ in range(_ATTEMPTS):
            try:
                stored = self.store.load(self.namespace, self.name)
            except ApiException as error:
                return _api_refusal(error, f"{kind} not issued: reading the state of {target} failed")
            bound = self._bound(stored, seen)
            if isinstance(bound, ActionResult):
                return bound
            state, command = bound
            seen = (state.revision, command.step)
            try:
                self.store.request_command(
                    self.namespace,
                    self.name,
                    command,
                    issuer=self.by,
                    resource_version=stored.resource_version,
                )
                return state, command
            except ConflictError:
                continue
            except LookupError as error:
                return _refused(str(error))
            except ApiException as error:
                return _api_refusal(error, f"{kind} not issued")
        return _refused(f"{kind} refused: the state of {target} kept changing; try again")

    def _bound(
        self, stored: StoredState, seen: tuple[str | None, int | None] | None
    ) -> tuple[RolloutState, CommandRequest] | ActionResult:
        """The state ``stored`` holds and the command bound to it; or why it is refused now."""
        if stored.state_json is None:
            return _refused(f"no rollout state for {self.target}: kserve-canary has not seen it")
        try:
            state = stored.state()
        except StateFormatError as error:
            return _refused(f"{self.target}: {error}")
        step = state.step.index if state.step is not None else None
        moved = self._moved(state, step, seen)
        if moved is not None:
            return moved
        now = datetime.now(UTC)
        waiting = _waiting_command(stored, now)
        if waiting is not None:
            return _refused(
                f"{self.kind} refused: {waiting} is waiting for the controller; wait for its answer, then "
                "try again"
            )
        command = CommandRequest(
            self.kind,
            by=self.by,
            at=now,
            reason=self.reason,
            revision=state.revision,
            step=step,
            state_resource_version=stored.resource_version,
            id=secrets.token_hex(8),
        )
        # What is impossible now is refused at once, as the controller would; it stays the authority.
        verdict = apply_command(state, command, now)
        if not verdict.accepted:
            return _refused(f"{self.kind} of {self.target} refused: {verdict.message}")
        return state, command

    def _moved(
        self, state: RolloutState, step: int | None, seen: tuple[str | None, int | None] | None
    ) -> ActionResult | None:
        """The refusal when the rollout is not where the page showed it, or moved while issuing."""
        kind, target = self.kind, self.target
        if not isinstance(self.seen_revision, Unset) and self.seen_revision != state.revision:
            return _refused(
                f"{kind} refused: the page showed {self.seen_revision or 'no revision'}, the rollout of "
                f"{target} is now of {state.revision or 'no revision'}"
            )
        if not isinstance(self.seen_step, Unset) and self.seen_step != step:
            shown = "no step" if self.seen_step is None else f"step {self.seen_step + 1}"
            return _refused(
                f"{kind} refused: the page showed {shown}, the rollout of {target} has moved to "
                f"{_step_text(state)} since; look again and retry"
            )
        if seen is not None and seen != (state.revision, step):
            return _refused(
                f"{kind} refused: the rollout of {target} moved while the command was issued (now "
                f"{state.revision}, {_step_text(state)})"
            )
        return None


def _answer(
    store: ConfigMapStateStore,
    namespace: str,
    name: str,
    command: CommandRequest,
    wait: float,
    by: str,
    state: RolloutState,
) -> ActionResult:
    target = f"{namespace}/{name}"
    deadline = time.monotonic() + wait
    while True:
        try:
            stored = store.load(namespace, name)
        except ApiException as error:
            return _api_refusal(error, f"{command.command} issued, but reading the answer failed")
        answer = stored.readable_command_result()
        if answer is not None and answer.id == command.id:
            verb = "accepted" if answer.accepted else "refused"
            return ActionResult(verb, "controller", answer.message, command.id, answer.by or by)
        try:
            waiting = stored.command()
        except CommandFormatError:
            waiting = None
        if waiting is None or waiting.id != command.id:
            return ActionResult(
                "withdrawn",
                "dashboard",
                f"{command.command} of {target} was replaced or withdrawn before the controller read it",
                command.id,
                by,
            )
        if time.monotonic() >= deadline:
            return ActionResult(
                "no-answer",
                "dashboard",
                f"{command.command} of {target} ({state.revision}, {_step_text(state)}) issued; no answer "
                f"from the controller within {wait:g} s: the command waits in ConfigMap "
                f"{namespace}/{state_configmap_name(name)} (is the controller running?)",
                command.id,
                by,
            )
        time.sleep(_POLL_SECONDS)
