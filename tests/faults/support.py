"""The fault suite's helpers: a recorder of what the API held, and the invariants every case checks.

The invariants (docs/design.md §7) are judged from what the API emulator recorded — its request log
and the objects' history as a watch saw it — and from what the webhook receiver got, never from the
controller's own account of itself. The controller's decision log lines are used only to find which
decision a write belonged to (its verdict and request count are then checked against the rule).

(a) no blind promotion, (b) no rollback undone, (c) no stale write (and no write without the Lease),
(d) no shortened window, (e) no lost notification, (f) a clear signal for a fault that holds or pauses.
"""

from __future__ import annotations

import copy
import itertools
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.diagnostics import LoggedRequest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import Stack, inference_service, wait_until

JsonObject = dict[str, Any]
V1, V2, V3 = "s3://models/v1", "s3://models/v2", "s3://models/v3"
HEALTHY = RevisionBehaviour(median_ms=80)
WRITING_ACTIONS = {"start", "advance", "promote", "rollback"}
TERMINAL = {"Succeeded", "RolledBack"}
WINDOW = 2.0  # the suite's policies hold each step for 2 s
MIN_REQUESTS = 10


def policy(
    name: str, namespace: str, *, window: str = "2s", extra: str = "", steps: str = "[10, 30, 50, 100]"
) -> str:
    # A p90, not a p99: these tests are about faults, and a p90 is shown met on about a hundred
    # requests (a p99 needs several hundred whatever the canary: tests/rollout/test_sequential_judge.py),
    # which keeps each rollout seconds long at the suite's 40 requests/s.
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  target: {{inferenceService: {name}}}
  steps: {steps}
  window: {window}
  interval: 1s
  minRequests: {MIN_REQUESTS}
  progressDeadline: 20s
  failureLimit: 2
{extra}  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
  notify:
    - webhook: {{urlFrom: {{env: HOOK_URL}}}}
"""


# -- what the API held -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    time: float
    type: str
    obj: JsonObject

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])


class Recorder:
    """Every InferenceService and Lease version the emulator stored, with the real time it was seen
    (an in-process watch from the start: nothing is missed, nothing is sampled)."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._snapshots: list[Snapshot] = []
        self._threads = [
            threading.Thread(
                target=self._run, args=(resource,), daemon=True, name=f"recorder-{resource.plural}"
            )
            for resource in (r.INFERENCESERVICES, r.LEASES)
        ]

    def start(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _run(self, resource: r.ResourceType) -> None:
        emulator = self._stack.emulator
        with emulator.lock:
            watch = emulator.store.watch(resource, None)
        try:
            while not self._stop.is_set():
                try:
                    item = watch.next(timeout=0.2)
                except queue.Empty:
                    continue
                if item is None:
                    return
                kind, obj = item
                snapshot = Snapshot(time.time(), kind, copy.deepcopy(obj))
                with self._lock:
                    self._snapshots.append(snapshot)
        finally:
            with emulator.lock:
                emulator.store.stop_watch(watch)

    def snapshots(self, namespace: str, name: str, kind: str = "InferenceService") -> list[Snapshot]:
        with self._lock:
            return [
                s
                for s in self._snapshots
                if s.obj.get("kind") == kind and (s.namespace, s.name) == (namespace, name)
            ]


# -- reading the records ---------------------------------------------------------------------------


def controller_agent(entry: LoggedRequest) -> str | None:
    """The replica (from the User-Agent) that made a request, None for anything else."""
    agent = entry.user_agent
    if agent.startswith("kserve-canary/") and "(" in agent:
        return agent[agent.index("(") + 1 : agent.rindex(")")]
    return None


_ABSENT = "<absent>"


@dataclass(frozen=True)
class Write:
    """A controller's percentage write to an InferenceService that the API applied."""

    sequence: int
    time: float
    weight: int | None  # None: the field removed (promotion)
    resource_version: str | None
    replica: str


def isvc_writes(stack: Stack, namespace: str, name: str, *, accepted_only: bool = True) -> list[Write]:
    found = []
    path = f"/namespaces/{namespace}/inferenceservices/{name}"
    for entry in stack.emulator.requests.entries(method="PATCH"):
        replica = controller_agent(entry)
        if replica is None or not entry.path.endswith(path) or not isinstance(entry.body, dict):
            continue
        if accepted_only and entry.status >= 300:
            continue
        predictor = (entry.body.get("spec") or {}).get("predictor") or {}
        if "canaryTrafficPercent" not in predictor:
            continue
        version = (entry.body.get("metadata") or {}).get("resourceVersion")
        found.append(Write(entry.sequence, entry.time, predictor["canaryTrafficPercent"], version, replica))
    return found


def written(stack: Stack, namespace: str, name: str) -> list[int | None]:
    return [write.weight for write in isvc_writes(stack, namespace, name)]


def decision_lines(stack: Stack, namespace: str, name: str) -> list[JsonObject]:
    """The controllers' decision log lines for one model (every replica, every restart)."""
    lines = []
    for controller in stack.controllers:
        for line in controller.log_lines():
            if (
                line.get("decisionId")
                and (line.get("namespace"), line.get("inferenceService")) == (namespace, name)
                and not line.get("dryRun")
            ):
                lines.append(line)
    return lines


def notifications(stack: Stack, namespace: str, name: str, *, delivered: bool = True) -> list[JsonObject]:
    found = []
    for request in stack.receiver.requests:
        if delivered and (request.answered is None or request.answered >= 300):
            continue
        payload = request.json()
        if (payload["inferenceService"]["namespace"], payload["inferenceService"]["name"]) == (
            namespace,
            name,
        ):
            found.append(payload)
    return found


def raw_state(stack: Stack, namespace: str, name: str, key: str = "state.json") -> str:
    """``state.json`` (or another key, e.g. ``explain.json``) as stored (empty when there is none),
    readable or not."""
    from kubernetes import client

    try:
        found = client.CoreV1Api(stack.api).read_namespaced_config_map(f"kserve-canary-{name}", namespace)
    except client.ApiException:
        return ""
    return str((found.data or {}).get(key) or "")


def phase_of(stack: Stack, namespace: str, name: str) -> str | None:
    try:
        return phase(stack, namespace, name)
    except ValueError:
        return None  # unreadable


def events(stack: Stack, namespace: str, name: str) -> list[Any]:
    return [event for event in stack.events(namespace) if event.involved_object.name == name]


def phase(stack: Stack, namespace: str, name: str) -> str | None:
    state = stack.state(namespace, name)
    return None if state is None else str(state.get("phase"))


def wait_for_phase(stack: Stack, namespace: str, name: str, phases: Iterable[str], timeout: float) -> str:
    wanted = set(phases)
    assert wait_until(lambda: phase_of(stack, namespace, name) in wanted, timeout), (
        f"{namespace}/{name} stayed in {phase_of(stack, namespace, name)}: "
        f"{raw_state(stack, namespace, name)[-2500:]}\nexplain: {raw_state(stack, namespace, name, 'explain.json')[:3000]}"
    )
    return str(phase(stack, namespace, name))


def canary_of(snapshot: Snapshot) -> tuple[str | None, str | None]:
    predictor = ((snapshot.obj.get("status") or {}).get("components") or {}).get("predictor") or {}
    return predictor.get("latestCreatedRevision"), predictor.get("latestReadyRevision")


def traffic_of(snapshot: Snapshot) -> list[JsonObject]:
    predictor = ((snapshot.obj.get("status") or {}).get("components") or {}).get("predictor") or {}
    return list(predictor.get("traffic") or [])


# -- the invariants --------------------------------------------------------------------------------


@dataclass
class Case:
    """One model under one fault, and what the invariants need to know about it."""

    namespace: str
    name: str
    window: float = WINDOW
    min_requests: int = MIN_REQUESTS
    # Real-time intervals in which the model's evidence was failing: nothing may advance in them
    # (after a grace of one query timeout and an interval, for an evaluation already under way).
    evidence_failing: list[tuple[float, float]] = field(default_factory=list)
    leader_elected: bool = False


def _decision_for(lines: Sequence[JsonObject], write: Write) -> JsonObject | None:
    """The decision that made ``write``: the latest decision writing that weight up to just after it
    (a write re-issued after a restart belongs to the decision recorded before the restart) — or,
    when the process that wrote it was killed before its log line, the line of the controller that
    found it landed and told it ("Wrote canaryTrafficPercent ...", the same decision id)."""
    writing = [
        line for line in lines if line.get("action") in WRITING_ACTIONS and line.get("weight") == write.weight
    ]
    before = [line for line in writing if _epoch(line["timestamp"]) <= write.time + 2.0]
    if before:
        return before[-1]
    landed = [line for line in writing if str(line.get("event", "")).startswith("Wrote canaryTrafficPercent")]
    return landed[0] if landed else None


def _epoch(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def check_no_blind_promotion(stack: Stack, case: Case) -> list[str]:
    """(a) every write that raised the percentage or removed it came from an evaluation of the
    revision it moved, with minRequests, never while the evidence was failing: a promotion (the
    percentage removed) on a passing evaluation — every check met —, an advance on one in which
    nothing failed, errored or lacked data (counted checks may be "not-yet": advance on exposure)."""
    problems = []
    lines = decision_lines(stack, case.namespace, case.name)
    previous: int | str | None = _ABSENT
    for write in isvc_writes(stack, case.namespace, case.name):
        raising = write.weight is None or (
            write.weight != 0 and isinstance(previous, int) and previous != 0 and write.weight > previous
        )
        previous = write.weight
        if not raising:
            continue
        decision = _decision_for(lines, write)
        if decision is None or decision.get("action") not in {"advance", "promote"}:
            # A promotion by an operator's command has no evaluation; the suite issues none.
            problems.append(
                f"write {write.weight} at #{write.sequence} has no advancing decision: {decision}"
            )
            continue
        promotion = write.weight is None
        verdict_ok = decision.get("verdict") == "pass" or (
            not promotion and decision.get("verdict") == "inconclusive"
        )
        if not verdict_ok or (decision.get("requests") or 0) < case.min_requests:
            problems.append(
                f"write {write.weight} at #{write.sequence} on verdict {decision.get('verdict')} with "
                f"{decision.get('requests')} requests (minRequests {case.min_requests})"
            )
        told = [
            n
            for n in notifications(stack, case.namespace, case.name, delivered=False)
            if n["id"] == decision["decisionId"]
        ]
        allowed = {"pass"} if promotion else {"pass", "not-yet"}
        for payload in told:
            failing = [c["name"] for c in payload["checks"] if c["verdict"] not in allowed]
            if failing:
                problems.append(
                    f"{payload['action']} {decision['decisionId']} with checks not passing: {failing}"
                )
        decided = _epoch(decision["timestamp"])
        for start, end in case.evidence_failing:
            if start + 3.0 < decided <= end:
                problems.append(
                    f"write {write.weight} decided at {decided:.1f} while evidence failed ({start:.1f}..{end:.1f})"
                )
    return problems


def check_no_rollback_undone(stack: Stack, recorder: Recorder, case: Case) -> list[str]:
    """(b) once 0 was written for revision R, R never gets a percentage again: no write for it, and
    no status showing R with traffic."""
    problems = []
    lines = decision_lines(stack, case.namespace, case.name)
    snapshots = recorder.snapshots(case.namespace, case.name)
    for write in isvc_writes(stack, case.namespace, case.name):
        if write.weight != 0:
            continue
        decision = _decision_for(lines, write)
        revision = decision.get("revision") if decision else None
        if revision is None:
            continue
        for later in isvc_writes(stack, case.namespace, case.name):
            if later.sequence <= write.sequence or later.weight == 0:
                continue
            owner = _decision_for(lines, later)
            if owner is not None and owner.get("revision") == revision:
                problems.append(
                    f"{revision} rolled back at #{write.sequence}, given {later.weight} at #{later.sequence}"
                )
        settle = write.time + 3.0  # KServe applies the 0 one reconcile later
        for snapshot in snapshots:
            if snapshot.time < settle:
                continue
            for entry in traffic_of(snapshot):
                if entry.get("revisionName") == revision and int(entry.get("percent") or 0) > 0:
                    problems.append(f"{revision} rolled back, status shows {entry} at {snapshot.time:.1f}")
                    break
    return problems


def check_no_stale_write(stack: Stack, recorder: Recorder, case: Case) -> list[str]:
    """(c) every write carries a resourceVersion of the object it was sent to (not a deleted
    predecessor's), and — with leader election — comes from the replica holding the Lease."""
    problems = []
    snapshots = recorder.snapshots(case.namespace, case.name)
    uid_of_version = {s.obj["metadata"]["resourceVersion"]: s.obj["metadata"]["uid"] for s in snapshots}
    for write in isvc_writes(stack, case.namespace, case.name, accepted_only=False):
        if write.resource_version is None:
            problems.append(f"write {write.weight} at #{write.sequence} without a resourceVersion")
            continue
        current = [s for s in snapshots if s.time <= write.time + 0.05]
        if not current or current[-1].type == "DELETED":
            continue  # sent to nothing: the API answered 404
        uid = current[-1].obj["metadata"]["uid"]
        if uid_of_version.get(write.resource_version) not in (uid, None):
            problems.append(
                f"write {write.weight} at #{write.sequence} carries resourceVersion {write.resource_version} "
                f"of {uid_of_version[write.resource_version]}, not of the current object {uid}"
            )
    if case.leader_elected:
        problems += check_writes_from_leader(stack)
    return problems


def check_writes_from_leader(stack: Stack, lease: str = "kserve-canary", since: int = 0) -> list[str]:
    """Every accepted controller write (other than to the Lease) from request ``since`` on came from
    the Lease's holder as the API last recorded it before that write."""
    problems = []
    holder: str | None = None
    for entry in stack.emulator.requests.entries():
        replica = controller_agent(entry)
        if replica is None or entry.method == "GET" or entry.status >= 300:
            continue
        if f"/leases/{lease}" in entry.path or entry.path.endswith("/leases"):
            body = entry.body if isinstance(entry.body, dict) else {}
            holder = (body.get("spec") or {}).get("holderIdentity", holder)
            continue
        if entry.sequence > since and replica != holder:
            problems.append(
                f"#{entry.sequence} {entry.method} {entry.path} by {replica}, Lease held by {holder}"
            )
    return problems


def _shows_step(snapshot: Snapshot, weight: int | None) -> bool:
    created, ready = canary_of(snapshot)
    return (
        created is not None
        and created == ready
        and any(e.get("latestRevision") and e.get("percent") == weight for e in traffic_of(snapshot))
    )


def check_no_shortened_window(stack: Stack, recorder: Recorder, case: Case) -> list[str]:
    """(d) an advance or promotion is written at least ``window`` after status first showed the step
    it leaves (the controller's clock may start later, never earlier)."""
    problems = []
    snapshots = recorder.snapshots(case.namespace, case.name)
    writes: list[Write] = []
    for write in isvc_writes(stack, case.namespace, case.name):
        if not writes or writes[-1].weight != write.weight:
            writes.append(write)  # a write re-issued with the same weight is the same step
    for before, after in itertools.pairwise(writes):
        if after.weight == 0 or before.weight in (0, None):
            continue
        # The object as it stood at the first write of the step, then every version until the next.
        standing = [s for s in snapshots if s.time <= before.time][-1:]
        timeline = [(before.time, s) for s in standing] + [
            (s.time, s) for s in snapshots if before.time < s.time <= after.time
        ]
        shown = [at for at, s in timeline if _shows_step(s, before.weight)]
        if not shown:
            problems.append(
                f"{before.weight} -> {after.weight} at #{after.sequence}: the step was never shown"
            )
            continue
        held = after.time - shown[0]
        if held < case.window - 0.05:
            problems.append(f"{before.weight} -> {after.weight} after {held:.2f}s < window {case.window}s")
    return problems


def check_no_lost_notification(stack: Stack, case: Case) -> list[str]:
    """(e) every decision whose write landed reached the receiver, or a NotificationFailed Event says
    it did not."""
    problems = []
    lines = decision_lines(stack, case.namespace, case.name)
    delivered = {n["id"] for n in notifications(stack, case.namespace, case.name)}
    failed = " ".join(
        str(event.message)
        for event in events(stack, case.namespace, case.name)
        if event.reason == "NotificationFailed"
    )
    seen: set[str] = set()
    for write in isvc_writes(stack, case.namespace, case.name):
        decision = _decision_for(lines, write)
        if decision is None or decision["decisionId"] in seen:
            continue
        seen.add(decision["decisionId"])
        if decision["decisionId"] not in delivered and decision["decisionId"] not in failed:
            problems.append(
                f"decision {decision['decisionId']} ({decision['action']} {write.weight}) never told"
            )
    return problems


def check_all(stack: Stack, recorder: Recorder, case: Case) -> None:
    problems = (
        check_no_blind_promotion(stack, case)
        + check_no_rollback_undone(stack, recorder, case)
        + check_no_stale_write(stack, recorder, case)
        + check_no_shortened_window(stack, recorder, case)
    )
    assert not problems, "\n".join(problems)


def check_told(stack: Stack, case: Case, timeout: float = 15.0) -> None:
    """(e), waiting for the notification lanes to deliver what is in flight."""
    problems: list[str] = []

    def settled() -> bool:
        nonlocal problems
        problems = check_no_lost_notification(stack, case)
        return not problems

    wait_until(settled, timeout, interval=0.5)
    assert not problems, "\n".join(problems)


def assert_signal(
    stack: Stack,
    case: Case,
    *,
    reason: str | set[str],
    log_text: str,
    state_text: str = "",
    timeout: float = 15.0,
) -> None:
    """(f) a fault that holds or pauses a rollout says so: an Event with ``reason`` on the model, a
    controller log line containing ``log_text`` and the state (what ``kserve-canary status`` shows)
    containing ``state_text``. Returns the reasons of the model's Events."""

    def shown() -> bool:
        reasons = {reason} if isinstance(reason, str) else reason
        has_event = any(event.reason in reasons for event in events(stack, case.namespace, case.name))
        logged = any(log_text in controller.log() for controller in stack.controllers)
        # The stored JSON is compact: compare without spaces.
        stated = state_text.replace(" ", "") in raw_state(stack, case.namespace, case.name).replace(" ", "")
        return has_event and logged and stated

    assert wait_until(shown, timeout, interval=0.5), (
        f"{case.name}: events {[e.reason for e in events(stack, case.namespace, case.name)]}, "
        f"log has {log_text!r}: {any(log_text in c.log() for c in stack.controllers)}, "
        f"state: {raw_state(stack, case.namespace, case.name)[-1500:]}"
    )


@dataclass
class Timer:
    started: float = field(default_factory=time.monotonic)

    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 1)


def during(seconds: float) -> Iterator[float]:
    """Yield the elapsed time every 0.25 s for ``seconds`` (a bounded observation loop)."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        yield elapsed
        time.sleep(0.25)


# -- one stack per module --------------------------------------------------------------------------

BAD = RevisionBehaviour(median_ms=80, error_rate=0.5)  # half its answers are 5xx: rolled back


@dataclass
class World:
    stack: Stack
    recorder: Recorder
    namespace: str

    def case(self, name: str, **kwargs: Any) -> Case:
        return Case(self.namespace, name, **kwargs)


@contextmanager
def running_world(
    namespace: str,
    names: Sequence[str],
    *,
    behaviours: dict[str, dict[str, RevisionBehaviour]] | None = None,
    policies: dict[str, str] | None = None,
    rps: float = 40.0,
) -> Iterator[World]:
    """A stack with one model per name (each at V1, rolled out, no controller yet) and a recorder."""
    models = [
        ModelTraffic(
            namespace, name, rps, (behaviours or {}).get(name) or {V1: HEALTHY, V2: HEALTHY, V3: HEALTHY}
        )
        for name in names
    ]
    texts = {f"{name}.yaml": (policies or {}).get(name) or policy(name, namespace) for name in names}
    with Stack(models, texts) as stack:
        stack.env = {"HOOK_URL": f"{stack.receiver.url}/hook"}
        recorder = Recorder(stack).start()
        try:
            for name in names:
                stack.apply(inference_service(namespace, name, V1))
            assert wait_until(
                lambda: all(
                    stack.predictor_status(namespace, n).get("latestRolledoutRevision") for n in names
                ),
                30,
            )
            yield World(stack, recorder, namespace)
        finally:
            recorder.stop()


def revision(name: str, number: int) -> str:
    return f"{name}-predictor-{number:05d}"


def step_shown(stack: Stack, namespace: str, name: str, weight: int) -> bool:
    """Status traffic shows the canary, Ready, at ``weight``."""
    predictor = stack.predictor_status(namespace, name)
    if predictor.get("latestCreatedRevision") != predictor.get("latestReadyRevision"):
        return False
    return any(e.get("latestRevision") and e.get("percent") == weight for e in predictor.get("traffic") or [])


def lease_holder(stack: Stack, name: str = "kserve-canary", namespace: str = "default") -> str:
    from kubernetes import client

    try:
        lease = client.CoordinationV1Api(stack.api).read_namespaced_lease(name, namespace)
    except client.ApiException:
        return ""
    return str(lease.spec.holder_identity or "") if lease.spec else ""
