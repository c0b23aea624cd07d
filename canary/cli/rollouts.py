"""``status``, ``explain`` and the operator commands: what the state ConfigMaps say, and commands
left for the controller, whose answer the person waits for.

Imported by those commands only (the Kubernetes client and the state's pydantic models are slow to
import; ``--help`` and ``validate`` never pay for them).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import quote

import typer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.cli.cluster import api_client, get_json
from canary.cli.help import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, fail
from canary.cli.output import NONE, columns, human_duration, printable, since, timestamp
from canary.cli.targets import resolve_target, suggestions
from canary.cli.warnings import latest_warnings
from canary.kserve.client import ConflictError
from canary.kserve.identity import who_am_i
from canary.kserve.store import (
    LABEL_INFERENCE_SERVICE,
    SELECTOR,
    STATE_KEY,
    ConfigMapStateStore,
    StoredState,
    state_configmap_name,
    stored_from_dict,
    watch_configmaps,
)
from canary.policy.units import Unit, format_value
from canary.rollout.artefact import Artefact, describe_artefact
from canary.rollout.commands import apply_command
from canary.rollout.records import (
    COMMAND_TTL,
    CommandFormatError,
    CommandOutcome,
    CommandRequest,
    ExplainCheck,
    ExplainDocument,
)
from canary.rollout.state import CommandKind, GateProgress, Phase, RolloutState, StateFormatError

__all__ = ["CommandOptions", "StatusScope", "issue_command", "not_seen", "print_explain", "print_status"]


def not_seen(api: client.ApiClient, namespace: str, name: str) -> str:
    """Why there is nothing for ``namespace/name``, with the rollouts it may have meant."""
    message = f"no rollout state for {namespace}/{name}: kserve-canary has not seen it"
    known: list[tuple[str, str]] = []
    for scope in (namespace, None):  # the whole cluster only where the person may list it
        try:
            items, _version = _list(api, scope)
        except ApiException:
            continue
        known += [_model(item) for item in items if _is_state(item)]
    close = suggestions(namespace, name, set(known))
    return message + (f"; did you mean {' or '.join(close)}?" if close else "")


def _model(configmap: Mapping[str, Any]) -> tuple[str, str]:
    meta = configmap.get("metadata") or {}
    return str(meta.get("namespace")), str((meta.get("labels") or {}).get(LABEL_INFERENCE_SERVICE))


# ---------------------------------------------------------------------------------------------
# status


@dataclass(frozen=True, slots=True)
class StatusRow:
    namespace: str
    name: str
    phase: str
    revision: str | None = None
    weight: int | None = None
    step: int | None = None  # 1-based
    step_weight: int | None = None
    since: datetime | None = None
    reason: str = ""
    pending: str | None = None  # the command waiting for the controller
    stable: str | None = None
    evidence_behind: float | None = None  # seconds, at the latest evaluation (when known)
    canary_artefact: Artefact | None = None  # what ``revision`` serves (None: unknown)
    stable_artefact: Artefact | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": f"{self.namespace}/{self.name}",
            "namespace": self.namespace,
            "name": self.name,
            "revision": self.revision,
            "phase": self.phase,
            "weight": self.weight,
            "step": self.step,
            "stepWeight": self.step_weight,
            "since": self.since.isoformat() if self.since else None,
            "reason": self.reason,
            "pendingCommand": self.pending,
            "evidenceBehindSeconds": self.evidence_behind,
            "stableRevision": self.stable,
            "canaryArtefact": self.canary_artefact.as_dict() if self.canary_artefact else None,
            "stableArtefact": self.stable_artefact.as_dict() if self.stable_artefact else None,
        }


def status_row(stored: StoredState) -> StatusRow:
    """One rollout for ``status``; one that cannot be read says why, and the others still print."""
    try:
        if stored.state_json is None:
            raise StateFormatError(f"the ConfigMap holds no {STATE_KEY}")
        state = stored.state()
    except StateFormatError as error:
        return StatusRow(
            stored.namespace, stored.inference_service, "Unreadable", reason=printable(str(error))
        )
    try:
        command = stored.command()
        pending = str(command.command) if command is not None else None
    except CommandFormatError:
        pending = "unreadable"
    last = state.history[-1] if state.history else None
    behind = _evidence_behind(stored) if state.phase is Phase.PROGRESSING else None
    reason = last.reason if last else ""
    if behind is not None and behind >= 1.0:
        reason = f"{reason} (evidence {human_duration(behind)} behind)".lstrip()
    return StatusRow(
        stored.namespace,
        stored.inference_service,
        str(state.phase),
        revision=state.revision,
        weight=state.spec_weight.weight if state.spec_weight else None,
        step=None if state.step is None else state.step.index + 1,
        step_weight=None if state.step is None else state.step.weight,
        since=state.step.started_at if state.step else state.started_at,
        reason=reason,
        pending=pending,
        stable=state.stable_revision,
        evidence_behind=behind,
        canary_artefact=state.artefact_of(state.revision),
        stable_artefact=state.artefact_of(state.stable_revision),
    )


def _evidence_behind(stored: StoredState) -> float | None:
    """How far behind its latest evaluation a rollout's evidence reached, in seconds."""
    try:
        document = stored.explain()
    except StateFormatError:
        return None
    behind = document.evidence_behind if document is not None else None
    return None if behind is None else behind.total_seconds()


def _is_state(configmap: Mapping[str, Any]) -> bool:
    meta = configmap.get("metadata") or {}
    model = str((meta.get("labels") or {}).get(LABEL_INFERENCE_SERVICE) or "")
    # The same label marks the rollback ledger (a dotted name) and the notification outbox.
    return bool(model) and meta.get("name") == state_configmap_name(model) and "." not in model


def _rows(configmaps: Iterable[Mapping[str, Any]]) -> list[StatusRow]:
    rows = [status_row(stored_from_dict(item, "", "")) for item in configmaps if _is_state(item)]
    return sorted(rows, key=lambda row: (row.namespace, row.name))


def _table(rows: list[StatusRow], wide: bool, now: datetime) -> str:
    header = ["NAMESPACE", "NAME", "REVISION", "PHASE", "WEIGHT", "STEP", "SINCE"]
    if wide:
        header += ["COMMAND", "CANARY ARTEFACT", "STABLE", "STABLE ARTEFACT", "LAST DECISION"]
    else:
        header += ["LAST DECISION"]
    cells = []
    for row in rows:
        line = [
            row.namespace,
            row.name,
            row.revision or NONE,
            row.phase,
            NONE if row.weight is None else f"{row.weight}%",
            NONE if row.step is None else f"{row.step} ({row.step_weight}%)",
            since(row.since, now),
        ]
        if wide:
            line += [
                row.pending or NONE,
                describe_artefact(row.canary_artefact) if row.revision else NONE,
                row.stable or NONE,
                describe_artefact(row.stable_artefact) if row.stable else NONE,
            ]
        line.append(row.reason or NONE)
        cells.append(line)
    return columns(header, cells)


def _render(rows: list[StatusRow], output: str, namespace: str | None) -> str:
    if output == "json":
        return json.dumps([row.as_dict() for row in rows], indent=2)
    if output == "yaml":
        import yaml  # noqa: PLC0415 - only -o yaml needs it

        return str(yaml.safe_dump([row.as_dict() for row in rows], sort_keys=False)).rstrip("\n")
    if not rows:
        return "No rollouts found" + (f" in namespace {namespace}." if namespace else ".")
    return _table(rows, output == "wide", datetime.now(UTC))


def print_status(
    kubeconfig: str | None,
    context: str | None,
    scope: StatusScope,
    output: str,
    watch: bool,
) -> None:
    """The table of rollouts in ``scope``; for one named rollout with ``watch``, follow it to its end."""
    api = api_client(kubeconfig, context)
    if scope.name is not None:
        namespace, name = resolve_target(scope.name, scope.namespace, kubeconfig, context)
        if watch:
            from canary.cli.follow import follow  # noqa: PLC0415 - imports this module

            follow(api, namespace, name, scope.timeout)
        try:
            stored = _load(api, namespace, name)
        except ApiException as error:
            if error.status != 403:
                raise
            typer.echo(_render(_as_viewer(api, error, namespace, name), output, namespace))
            return
        if stored.state_json is None:
            raise fail(printable(not_seen(api, namespace, name)))
        typer.echo(_render([status_row(stored)], output, namespace))
        return
    # Unlike kubectl get, every namespace by default: the rollouts are few, and a person asking for
    # them wants them all (-A says the same explicitly).
    _print_table(api, None if scope.all_namespaces else scope.namespace, output, watch)


def _as_viewer(
    api: client.ApiClient, refused: ApiException, namespace: str | None, name: str | None = None
) -> list[StatusRow]:
    """The rollouts as the viewer role may read them (no ConfigMap list): canary/cli/viewer.py.
    When not even those can be read, the state ConfigMaps' refusal (``refused``) is the answer."""
    from canary.cli.viewer import viewer_rows  # noqa: PLC0415 - imports this module

    found = viewer_rows(api, namespace)
    if found is None:
        raise refused
    rows = [row for row in found if name is None or row.name == name]
    if name is not None and not rows:
        raise fail(
            f"no rollout of {namespace}/{name} in the PromotionPolicy statuses or the file policies' status"
        )
    return rows


def _print_table(api: client.ApiClient, namespace: str | None, output: str, watch: bool) -> None:
    try:
        items, version = _list(api, namespace)
    except ApiException as error:
        if error.status != 403 or watch:
            raise
        items, version = [], ""
        rows = _as_viewer(api, error, namespace)
    else:
        rows = _rows(items)
    shown = _render(rows, output, namespace)
    if not rows and output in {"text", "wide"}:
        typer.echo(shown, err=True)  # kubectl too: "No resources found" goes to stderr
    else:
        typer.echo(shown)
    if not watch:
        return
    try:
        _watch(
            api, namespace, output, {_key(item): item for item in items if _is_state(item)}, version, shown
        )
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None


@dataclass(frozen=True, slots=True)
class StatusScope:
    """Which rollouts ``status`` shows: one by name, a namespace, or all of them."""

    name: str | None = None  # NAME or NAMESPACE/NAME
    namespace: str | None = None  # -n
    all_namespaces: bool = False  # -A
    timeout: float = 0.0  # with a name and --watch: give up (stalled) after this many seconds; 0: never


def _list(api: client.ApiClient, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
    """Our ConfigMaps (the managed-by label) as JSON, and the list's resourceVersion."""
    path = "/api/v1/configmaps" if namespace is None else f"/api/v1/namespaces/{quote(namespace)}/configmaps"
    listed = get_json(api, path, {"labelSelector": SELECTOR})
    items = [item for item in listed.get("items") or () if isinstance(item, dict)]
    return items, str((listed.get("metadata") or {}).get("resourceVersion") or "")


def _load(api: client.ApiClient, namespace: str, name: str) -> StoredState:
    """The state ConfigMap of ``namespace/name`` (a StoredState without state when there is none)."""
    try:
        found = get_json(
            api, f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(state_configmap_name(name))}"
        )
    except ApiException as error:
        if error.status == 404:
            return stored_from_dict(None, namespace, name)
        raise
    return stored_from_dict(found, namespace, name)


def _key(configmap: Mapping[str, Any]) -> tuple[str, str]:
    meta = configmap.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _watch(
    api: client.ApiClient,
    namespace: str | None,
    output: str,
    known: dict[tuple[str, str], Mapping[str, Any]],
    version: str,
    shown: str,
) -> None:
    """Reprint the table whenever a rollout changes (the ages alone are not a change), until Ctrl-C."""
    terminal = sys.stdout.isatty()
    while True:
        try:
            for event in watch_configmaps(api, namespace, version, timeout_seconds=60):
                meta = event.object.get("metadata") or {}
                if meta.get("resourceVersion"):
                    version = str(meta["resourceVersion"])
                if event.type == "BOOKMARK" or not _is_state(event.object):
                    continue
                if event.type == "DELETED":
                    known.pop(_key(event.object), None)
                else:
                    known[_key(event.object)] = event.object
                text = _render(_rows(known.values()), output, namespace)
                if text != shown:
                    # On a terminal the table replaces the last one, as watch(1) does; in a pipe each
                    # version follows the previous one, after a blank line.
                    typer.echo(("\x1b[H\x1b[2J" if terminal else "\n") + text)
                    shown = text
        except ApiException as error:
            if error.status != 410:
                raise
            # The version is too old to watch from: list again, then watch from the list.
            items, version = _list(api, namespace)
            known = {_key(item): item for item in items if _is_state(item)}


# ---------------------------------------------------------------------------------------------
# explain


def _value(value: float | None, unit: Unit) -> str:
    """A measured value for people: three significant digits with its unit (``832ms``, ``1.23%``)."""
    if value is None:
        return NONE
    if unit is Unit.NONE:
        # No exponent for people: 1,235 rather than 1.23e+03.
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if unit is Unit.SECONDS and 0 < abs(value) < 0.01:
        return f"{value * 1000:.3g}ms"
    return format_value(value, unit)


def _count(value: float | None) -> str:
    return NONE if value is None else f"{round(value):,}"


def graph_link(external_url: str, query: str, document: ExplainDocument) -> str:
    """A Prometheus graph of ``query`` over the evaluated window (``/graph?g0.expr=...``)."""
    window = document.window
    span = (window.end - window.start).total_seconds() if window else 3600.0
    end = (window.end if window else document.at).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{external_url.rstrip('/')}/graph?g0.expr={quote(query, safe='')}&g0.tab=0"
        f"&g0.range_input={max(int(span), 1)}s&g0.end_input={quote(end)}"
    )


# The limit as written, the stable revision's estimate, and the bound the judge compared the canary
# with (for a relative limit, from the stable revision's bound): each once, each labelled.
_CHECK_COLUMNS = ["CHECK", "VERDICT", "CANARY", "LIMIT", "STABLE ESTIMATE", "JUDGED BOUND", "SAMPLES"]


def _check_row(check: ExplainCheck) -> list[str]:
    return [
        check.name,
        check.verdict,
        _value(check.value, check.unit),
        check.limit or NONE,
        _value(check.stable, check.unit),
        " and ".join(label for label, _ in check.bounds()) or NONE,
        _count(check.samples),
    ]


def _gate_row(gate: GateProgress, now: datetime) -> list[str]:
    if gate.passed_at is not None:
        waited = human_duration((gate.passed_at - gate.since).total_seconds())
        result = f"passed {timestamp(gate.passed_at)} ({waited} after the first call)"
    elif gate.deadline_passed_at is not None:
        result = f"deadline passed {timestamp(gate.deadline_passed_at)}: holding"
    else:
        result = f"waiting {since(gate.since, now)}"
    return [
        gate.name,
        gate.stage.value,
        NONE if gate.weight is None else f"{gate.weight}%",
        result,
        f"{gate.attempts:,}",
        gate.describe_last(),
    ]


def print_explain(
    target: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    output: str,
    prometheus_external_url: str | None,
) -> None:
    namespace, name = resolve_target(target, namespace, kubeconfig, context)
    api = api_client(kubeconfig, context)
    stored = _load(api, namespace, name)
    if stored.state_json is None:
        raise fail(not_seen(api, namespace, name))
    try:
        state = stored.state()
        document = stored.explain()
    except StateFormatError as error:
        raise fail(printable(f"{namespace}/{name}: {error}")) from None
    if output == "json":
        latest = document.to_dict() if document is not None else None
        typer.echo(json.dumps({"state": json.loads(state.to_json()), "latestEvaluation": latest}, indent=2))
        return
    if document is None:
        warned = latest_warnings(api, namespace, name)
        served = _artefact_lines(state, state.revision, state.stable_revision)
        typer.echo(
            printable("\n".join([f"{namespace}/{name}: no evaluation recorded yet", *served, *warned]))
        )
        return
    now = datetime.now(UTC)
    requests = "no" if document.requests is None else _count(document.requests)
    lines = [
        f"{namespace}/{name}: revision {document.revision or NONE} against stable "
        f"{document.stable_revision or NONE}",
        f"evaluated {timestamp(document.at)} ({since(document.at, now)} ago): "
        f"{document.verdict or 'no verdict'}, {requests} canary requests — {document.action or NONE}",
        *_artefact_lines(state, document.revision, document.stable_revision),
    ]
    if document.window is not None:
        span = (document.window.end - document.window.start).total_seconds()
        lines.append(
            f"window {timestamp(document.window.start)} to {timestamp(document.window.end)} "
            f"({human_duration(span)})"
        )
    behind = document.evidence_behind
    if behind is not None and document.evidence_until is not None:
        lines.append(
            f"evidence up to {timestamp(document.evidence_until)} "
            f"({human_duration(behind.total_seconds())} behind the evaluation)"
        )
    reasons = list(dict.fromkeys(document.reasons))  # one reason per decision: never the same twice
    lines += [f"  {reason}" for reason in reasons]
    lines += [f"  {line}" for line in latest_warnings(api, namespace, name)]
    if document.checks or not state.gates:
        lines += ["", columns(_CHECK_COLUMNS, [
            _check_row(check) for check in document.checks
        ])]  # fmt: skip
    for check in document.checks:
        if check.detail and not any(check.detail in reason for reason in reasons):
            lines.append(f"{check.name}: {check.detail}")
    if state.gates:
        lines += ["", columns(["GATE", "AT", "STEP", "RESULT", "FAILED", "LATEST ATTEMPT"], [
            _gate_row(gate, now) for gate in state.gates
        ])]  # fmt: skip
    lines += _queries(document, prometheus_external_url)
    typer.echo(printable("\n".join(lines)))


def _artefact_lines(state: RolloutState, canary: str | None, stable: str | None) -> list[str]:
    """What the canary and the stable revision serve (storageUri or image, runtime, format)."""
    return [
        f"{role} {revision} serves {describe_artefact(state.artefact_of(revision))}"
        for role, revision in (("canary", canary), ("stable", stable))
        if revision is not None
    ]


# What a canary query's answer is in, for the line under it.
_ANSWER_UNITS = {
    Unit.SECONDS: "in seconds",
    Unit.RATIO: "a ratio (0.01 is 1%)",
    Unit.BYTES: "in bytes",
    Unit.MEBIBYTES: "in MiB",
    Unit.COUNT: "a count",
}


def _queries(document: ExplainDocument, external_url: str | None) -> list[str]:
    """Per check, the PromQL that returns the canary's value alone (with what its answer is in and
    how it may differ from the judged value); the query the controller ran for the checks that have
    none (records written before canary queries existed, a query too long to keep)."""
    lines: list[str] = []
    canary = [check for check in document.checks if check.canary_query]
    if canary:
        at = document.window.end if document.window is not None else document.at
        lines += ["", f"PromQL for the canary's value alone (instant queries: evaluate at {timestamp(at)}):"]
    for check in canary:
        assert check.canary_query is not None
        lines.append(f"[{check.name}] {check.canary_query}")
        said = [part for part in (_ANSWER_UNITS.get(check.unit, ""), check.canary_query_note) if part]
        if said:
            lines.append(f"  # {'; '.join(said)}")
        if external_url:
            lines.append(f"  graph: {graph_link(external_url, check.canary_query, document)}")
    ran = [check for check in document.checks if check.query and not check.canary_query]
    if ran:
        lines += ["", "PromQL as the controller ran it:"]
    for check in ran:
        lines.append(f"[{check.name}] {check.query}")
        if check.canary_query_note:
            lines.append(f"  # {check.canary_query_note}")
        if external_url:
            lines.append(f"  graph: {graph_link(external_url, check.query, document)}")
    return lines


# ---------------------------------------------------------------------------------------------
# pause, resume, approve, abort, promote

_ATTEMPTS = 5  # writes that lose a race with the controller are retried this often
_POLL_SECONDS = 0.5
EXIT_NO_ANSWER = EXIT_UNREACHABLE  # issued, but the controller did not answer within --wait


@dataclass(frozen=True)
class CommandOptions:
    namespace: str | None  # -n; else the context's
    kubeconfig: str | None
    context: str | None
    reason: str | None
    wait: float  # 0: do not wait
    revision: str | None


def _refused(message: str) -> typer.Exit:
    return fail(printable(message), EXIT_REFUSED)


def _step_text(state: RolloutState) -> str:
    return "no step yet" if state.step is None else f"step {state.step.index + 1} ({state.step.weight}%)"


def issue_command(kind: CommandKind, target: str, options: CommandOptions) -> None:
    """Issue ``kind`` for the rollout in progress, bound to it, and wait for the controller's answer.

    The state is read first; what is impossible now (no rollout in progress, no step waiting for
    approval, already paused, ...) is refused at once, as the controller would refuse it. Otherwise
    the command names its revision, step and resourceVersion and is written under that
    resourceVersion (a write that loses a race is retried only while the rollout is still at the same
    revision and step). ``by`` is the API server's answer to a SelfSubjectReview. Exit 0: accepted
    (or issued with --no-wait); 1: refused; 3: the controller did not answer within --wait.
    """
    namespace, name = resolve_target(target, options.namespace, options.kubeconfig, options.context)
    api = api_client(options.kubeconfig, options.context)
    store = ConfigMapStateStore(api)
    # Read the state before asking who we are: an unreachable cluster fails here, with its reason.
    first = store.load(namespace, name)
    if first.state_json is None:
        raise _refused(not_seen(api, namespace, name))
    try:
        identity = who_am_i(api, options.kubeconfig)
    except ApiException as error:
        raise _refused(
            f"{kind} not issued: the API server answered {error.status} {error.reason} when asked who you are"
        ) from None
    if identity.note:
        typer.echo(f"note: {identity.note}", err=True)
    issued = _IssuedCommand(store, kind, namespace, name, options, identity.username)
    state, command = issued.write(first)
    issued.await_answer(state, command)


@dataclass(frozen=True)
class _IssuedCommand:
    """One command being issued: to which rollout, by whom, with which options."""

    store: ConfigMapStateStore
    kind: CommandKind
    namespace: str
    name: str
    options: CommandOptions
    by: str

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.name}"

    def write(self, first: StoredState) -> tuple[RolloutState, CommandRequest]:
        """Write the command bound to the rollout as ``first`` (then each reread) shows it; a write that
        loses a race is retried while the rollout stays at the same revision and step."""
        seen: tuple[str | None, int | None] | None = None
        stored = first
        for attempt in range(_ATTEMPTS):
            if attempt:
                stored = self.store.load(self.namespace, self.name)
            state, command = self._bound(stored, seen)
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
                raise _refused(str(error)) from None
        raise _refused(f"{self.kind} refused: the state of {self.target} kept changing; try again")

    def _bound(
        self, stored: StoredState, seen: tuple[str | None, int | None] | None
    ) -> tuple[RolloutState, CommandRequest]:
        """The state ``stored`` holds and the command bound to it; refused when the rollout is not the
        one asked for, has moved since ``seen``, already has a command waiting, or cannot take it."""
        kind, target = self.kind, self.target
        if stored.state_json is None:
            raise _refused(f"no rollout state for {target}: kserve-canary has not seen it")
        try:
            state = stored.state()
        except StateFormatError as error:
            raise _refused(f"{target}: {error}") from None
        step = state.step.index if state.step is not None else None
        self._refuse_moved(state, step, seen)
        now = datetime.now(UTC)
        waiting = _waiting_command(stored, now)
        if waiting is not None:
            raise _refused(
                f"{kind} refused: {waiting} is waiting for the controller; wait for its answer, then "
                "try again"
            )
        command = CommandRequest(
            kind,
            by=self.by,
            at=now,
            reason=self.options.reason,
            revision=state.revision,
            step=step,
            state_resource_version=stored.resource_version,
            id=secrets.token_hex(8),
        )
        # What is impossible now is refused at once, as the controller would; it stays the authority.
        verdict = apply_command(state, command, now)
        if not verdict.accepted:
            raise _refused(f"{kind} of {target} refused: {verdict.message}")
        return state, command

    def _refuse_moved(
        self, state: RolloutState, step: int | None, seen: tuple[str | None, int | None] | None
    ) -> None:
        """Refuse when the rollout is not of the revision asked for, or moved while issuing."""
        kind, target = self.kind, self.target
        if self.options.revision is not None and self.options.revision != state.revision:
            raise _refused(
                f"{kind} for {self.options.revision} refused: the rollout of {target} is of "
                f"{state.revision or 'no revision'}"
            )
        if seen is not None and seen != (state.revision, step):
            raise _refused(
                f"{kind} refused: the rollout of {target} moved while the command was issued "
                f"(now {state.revision}, {_step_text(state)}); look at `kserve-canary status` and try again"
            )

    def await_answer(self, state: RolloutState, command: CommandRequest) -> NoReturn:
        """Say the command was issued, wait up to --wait for the controller's answer, and exit with it."""
        kind, target, wait = self.kind, self.target, self.options.wait
        what = f"{kind} of {target} ({state.revision}, {_step_text(state)}) by {self.by}"
        if wait <= 0:
            typer.echo(f"{what} issued; the controller answers at its next evaluation (not waiting)")
            raise typer.Exit(EXIT_OK)
        typer.echo(f"{what} issued; waiting up to {wait:g}s for the controller's answer")
        answer = _answer(self.store, self.namespace, self.name, command, wait)
        if answer is None:
            raise fail(
                f"no answer from the controller within {wait:g}s: the command waits in ConfigMap "
                f"{self.namespace}/{state_configmap_name(self.name)} (the controller reads it at its next "
                "evaluation; is it running?)",
                EXIT_NO_ANSWER,
            )
        if not answer.accepted:
            raise _refused(f"the controller refused {kind} of {target}: {answer.message}")
        typer.echo(printable(f"the controller accepted {kind} of {target}: {answer.message}"))
        raise typer.Exit(EXIT_OK)


def _waiting_command(stored: StoredState, now: datetime) -> str | None:
    """Someone else's command the controller has not read yet (an expired or unreadable one does not
    count: it would be refused anyway), described; None when there is none."""
    if stored.command_json is None:
        return None
    try:
        command = stored.command()
    except CommandFormatError:
        return None
    if command is None or command.at is None or now - command.at > COMMAND_TTL:
        return None
    issuer = stored.command_issuer or command.by or "someone"
    return f"{command.command} by {issuer} ({since(command.at, now)} ago)"


def _answer(
    store: ConfigMapStateStore, namespace: str, name: str, command: CommandRequest, wait: float
) -> CommandOutcome | None:
    """The controller's answer to ``command``; None when it has not come within ``wait`` seconds.
    Raises typer.Exit when the command was replaced or withdrawn before the controller read it."""
    deadline = time.monotonic() + wait
    while True:
        stored = store.load(namespace, name)
        answer = stored.readable_command_result()
        if answer is not None and answer.id == command.id:
            return answer
        try:
            waiting = stored.command()
        except CommandFormatError:
            waiting = None
        if waiting is None or waiting.id != command.id:
            raise _refused(
                f"{command.command} of {namespace}/{name} was replaced or withdrawn before the controller "
                "read it"
            )
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL_SECONDS)
