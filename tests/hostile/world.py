"""Two teams in one controller process, team A hostile, team B measured (issue #34, "Measure").

:func:`run` starts the whole world (the emulator, the simulated fleet, a real Prometheus behind a
fault proxy, the controller as a process) and plays the same rollouts twice: benign, and with team A
doing everything a namespace editor and the owner of a few URLs can do at once:

* its gate receivers dribble their answers (one byte a second), hang, or answer 200 with a 300 MB
  body; its notification receivers dribble or send the huge body;
* 150 ConfigMaps of about 1 MB labelled ``app.kubernetes.io/managed-by=kserve-canary`` in its
  namespace, there before the controller starts (it lists them at start-up);
* eight custom checks whose queries take Prometheus 9 s each;
* its gate and notification URLs (secret files) rotated every 0.2 s, each about 1.9 KiB;
* its pods export their request counter a second time with a ``revision`` label of their own.

Team B has one rollout with a bad canary (half its requests fail); its policy names the same secret
reference as team A's dribbling receiver (``file hook``, each namespace its own file), and its
receiver is down (503) until 10 s after the rollback is written. Measured from outside the controller: the API emulator's
request log (when the rollback was written), team B's receiver (when it accepted the notice) and
``/proc/<pid>/status`` (peak resident memory, ``VmHWM``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until
from kubernetes import client

from benchmarks.scale import metric_values
from tests.e2e.test_hostile_configmaps import HOSTILE, hostile_configmap
from tests.faults.support import HEALTHY, V1, V2, isvc_writes, step_shown
from tests.loopback import Exchange, Loopback, MiB
from tests.notify.outage import OutageReceiver

TEAM_A, TEAM_B = "team-a", "team-b"
MODEL_B = "fraud"
BAD = RevisionBehaviour(median_ms=80, error_rate=0.5)
SLOW_MARKER = "hogmarker"  # in every custom query of team A: the proxy delays what carries it
SLOW_QUERIES, SLOW_SECONDS = 8, 9.0
HUGE_BYTES = 300 * MiB
ROTATE_EVERY = 0.2
# Team B's receiver answers 503 from before its rollout until this long after its rollback is
# written: its notices are retried for a while, as after a short outage.
OUTAGE_AFTER_ROLLBACK = 10.0
INTERVAL, SCRAPE = 1.0, 1.0
# Team B's model: 20 requests/s reach its canary at 10 %, so its bad canary's evidence is plain
# within a scrape or two (at 4/s the judge's decision on a handful of requests varies by seconds).
TEAM_B_RPS = 200.0

# Team A's models: (name, notification receiver, gate receiver or None, custom slow checks).
TEAM_A_MODELS = (
    ("hog", "dribble", None, True),
    ("gate-dribble", "dribble", "dribble", False),
    ("gate-hang", "huge", "hang", False),
    ("gate-huge", "huge", "huge", False),
    ("noisy", "huge", None, False),
)
RECEIVERS = ("dribble", "hang", "huge")


def policy(name: str, namespace: str, notify: str, *, window: str = "2s", extra: str = "") -> str:
    """The fault suite's policy (a p90, 2 s windows, 1 s interval), with its notify reference."""
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 30, 50, 100]
  window: {window}
  interval: {INTERVAL:g}s
  minRequests: 10
  progressDeadline: 20s
  failureLimit: 2
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
{extra}  notify:
    - webhook: {{urlFrom: {notify}}}
"""


def hook_file(receiver: str) -> str:
    """The secret file of a notification receiver: ``hook`` for the one team B's policy names too."""
    return "hook" if receiver == "dribble" else f"hook-{receiver}"


def team_a_policy(name: str, notify: str, gate: str | None, slow: bool) -> str:
    extra = ""
    if slow:
        extra += "".join(
            f'    - {{name: slow{index}, promql: \'count(up{{job="{SLOW_MARKER}{index}", '
            f'pod="{{{{ revision }}}}"}}) or vector(0)\', unit: count, max: 1}}\n'
            for index in range(SLOW_QUERIES)
        )
    if gate is not None:
        extra += (
            "  gates:\n"
            f"    - {{name: smoke, at: pre-rollout, webhook: {{urlFrom: {{file: gate-{gate}}}, timeout: 5s}}, "
            "deadline: 2m, failurePolicy: hold}\n"
        )
    return policy(name, TEAM_A, f"{{file: {hook_file(notify)}}}", window="30s", extra=extra)


POLICIES = {
    **{f"{name}.yaml": team_a_policy(name, notify, gate, slow) for name, notify, gate, slow in TEAM_A_MODELS},
    # The same reference as team A's dribbling receiver (``file hook``): each namespace reads its own.
    f"{MODEL_B}.yaml": policy(MODEL_B, TEAM_B, f"{{file: {hook_file('dribble')}}}"),
}


# -- team A's receivers ----------------------------------------------------------------------------


class Receivers:
    """Team A's loopback receivers; benign, each answers 200 at once."""

    def __init__(self, hostile: bool) -> None:
        self.hostile = hostile
        self.released = threading.Event()
        self.servers = {name: Loopback(self._script(name)) for name in RECEIVERS}

    def _script(self, name: str) -> Callable[[Exchange], None]:
        def answer(exchange: Exchange) -> None:
            if not self.hostile:
                exchange.head(200, {"Content-Length": "2"})
                exchange.write(b"ok")
            elif name == "dribble":
                exchange.head(200, {"Content-Length": "64"})
                exchange.trickle(b"x" * 64, every=1.0)
            elif name == "hang":
                self.released.wait(60)
            else:
                exchange.head(200, {"Content-Length": str(HUGE_BYTES)})
                exchange.stream(HUGE_BYTES)

        return answer

    def url(self, name: str, length: int) -> str:
        """A URL of about ``length`` bytes: a fresh token in its query each time (a rotation)."""
        base = f"{self.servers[name].url}/{name}?token="
        return base + secrets.token_hex(length)[: max(16, length - len(base))]

    def close(self) -> None:
        self.released.set()
        for server in self.servers.values():
            server.stop()


class SecretFiles:
    """Team A's secret files (``--secret-file-root``): every receiver's URL, rewritten every
    :data:`ROTATE_EVERY` seconds when hostile (each value about 1.9 KiB, under the 2 KiB cap)."""

    def __init__(self, root: Path, receivers: Receivers, team_b_url: str) -> None:
        self.root = root
        self.directory = root / TEAM_A
        self.directory.mkdir(parents=True, exist_ok=True)
        (root / TEAM_B).mkdir(parents=True, exist_ok=True)
        (root / TEAM_B / hook_file("dribble")).write_text(team_b_url)
        self.receivers = receivers
        self.rotations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._rotate, name="rotate", daemon=True)
        self.write()

    def write(self) -> None:
        for name in RECEIVERS:
            for path in (self.directory / hook_file(name), self.directory / f"gate-{name}"):
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(self.receivers.url(name, 1900))
                tmp.replace(path)
        self.rotations += 1

    def start(self) -> None:
        self._thread.start()

    def _rotate(self) -> None:
        while not self._stop.wait(ROTATE_EVERY):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def colliding_revision(text: str) -> str:
    """Team A's pods export their request counter a second time, with a ``revision`` label."""
    extra = [
        line.replace("{", '{revision="hostile",', 1)
        for line in text.splitlines()
        if line.startswith("revision_request_count{") and f'namespace_name="{TEAM_A}"' in line
    ]
    return text + "\n".join(extra) + ("\n" if extra else "")


# -- one run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    hostile: bool
    peak_rss_kib: int  # VmHWM at the end: the peak over the whole run
    rss_kib: int
    rollback_after: float  # team B: its canary took traffic -> its rollback written
    told_after: float  # team B: its receiver answers again -> its rollback notice accepted
    log: list[dict[str, Any]]
    metrics: str
    team_a_writes: dict[str, list[int | None]]
    rotations: int
    wall_seconds: float

    @property
    def peak_mib(self) -> float:
        return self.peak_rss_kib / 1024

    def summary(self) -> str:
        return (
            f"{'hostile' if self.hostile else 'benign'}: peak RSS {self.peak_mib:.0f} MiB "
            f"(now {self.rss_kib / 1024:.0f}), team B rolled back {self.rollback_after:.1f}s after its "
            f"canary took traffic, told {self.told_after:.1f}s after its receiver answered, "
            f"{self.rotations} rotations, {self.wall_seconds:.0f}s"
        )


def memory_kib(controller: ControllerProcess) -> tuple[int, int]:
    """(VmRSS, VmHWM) of the controller process in KiB: now, and the peak so far."""
    status = Path(f"/proc/{controller.process.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _rolled_back_at(stack: Stack) -> float | None:
    return next((w.time for w in isvc_writes(stack, TEAM_B, MODEL_B) if w.weight == 0), None)


def _rollback_told(receiver: OutageReceiver) -> bool:
    return any(json.loads(r.body).get("action") == "rolled-back" for r in receiver.accepted("/hook"))


def _models() -> list[ModelTraffic]:
    team_a = [ModelTraffic(TEAM_A, name, 20.0, {V1: HEALTHY, V2: HEALTHY}) for name, *_ in TEAM_A_MODELS]
    return [*team_a, ModelTraffic(TEAM_B, MODEL_B, TEAM_B_RPS, {V1: HEALTHY, V2: BAD})]


@contextmanager
def _world(hostile: bool) -> Iterator[tuple[Stack, FaultProxy, Receivers, OutageReceiver, SecretFiles]]:
    with ExitStack() as exits:
        receivers = Receivers(hostile)
        exits.callback(receivers.close)
        team_b = OutageReceiver()
        exits.callback(team_b.stop)
        models = _models()
        stack = exits.enter_context(Stack(models, POLICIES))
        assert stack.prometheus is not None and stack.workdir is not None
        proxy = exits.enter_context(FaultProxy(stack.prometheus.url))
        files = SecretFiles(stack.workdir / "secrets", receivers, f"{team_b.url}/hook")
        exits.callback(files.stop)
        for model in models:
            stack.apply(inference_service(model.namespace, model.inference_service, V1))
        assert wait_until(
            lambda: all(
                stack.predictor_status(m.namespace, m.inference_service).get("latestRolledoutRevision")
                for m in models
            ),
            30,
        )
        yield stack, proxy, receivers, team_b, files


def _turn_hostile(stack: Stack, proxy: FaultProxy, files: SecretFiles) -> None:
    """Everything team A does before and while the controller runs (its receivers are hostile too)."""
    core = client.CoreV1Api(stack.api)
    for index in range(HOSTILE):
        core.create_namespaced_config_map(TEAM_A, hostile_configmap(index))
    proxy.add(ProxyFault.delay(SLOW_SECONDS), path=r"/api/v1/query", body=SLOW_MARKER)
    assert stack.fleet is not None
    stack.fleet.rewrite = colliding_revision
    files.start()


def run(hostile: bool) -> Run:
    """The same rollouts, benign or with team A hostile; team B's outcomes measured."""
    began = time.monotonic()
    with _world(hostile) as (stack, proxy, _receivers, team_b, files):
        if hostile:
            _turn_hostile(stack, proxy, files)
        team_b.status = 503  # team B's receiver is down from before its rollout
        controller = stack.start_controller(
            "tenants",
            prometheus_url=proxy.url,
            extra_args=["--prometheus-timeout", "10", "--secret-file-root", str(files.root)],
        )
        time.sleep(2.0)  # Prometheus sees the stable revisions
        for name, *_ in TEAM_A_MODELS:
            stack.set_storage_uri(TEAM_A, name, V2)
        assert wait_until(lambda: step_shown(stack, TEAM_A, "hog", 10), 20), controller.log()[-3000:]
        time.sleep(2.0)  # team A's custom checks are being asked, its gates called, every tick
        stack.set_storage_uri(TEAM_B, MODEL_B, V2)
        assert wait_until(lambda: step_shown(stack, TEAM_B, MODEL_B, 10), 20)
        shown = time.time()
        assert wait_until(lambda: _rolled_back_at(stack) is not None, 20), "team B was not rolled back"
        rolled_back = _rolled_back_at(stack) or 0.0
        time.sleep(max(0.0, rolled_back + OUTAGE_AFTER_ROLLBACK - time.time()))
        team_b.status = 200
        answering = time.monotonic()
        assert wait_until(lambda: _rollback_told(team_b), 20, interval=0.05), (
            "team B's rollback was never told"
        )
        told_after = time.monotonic() - answering
        rss, peak = memory_kib(controller)
        assert controller.alive
        return Run(
            hostile=hostile,
            peak_rss_kib=peak,
            rss_kib=rss,
            rollback_after=rolled_back - shown,
            told_after=told_after,
            log=controller.log_lines(),
            metrics=controller.metrics(),
            team_a_writes={
                name: [w.weight for w in isvc_writes(stack, TEAM_A, name)] for name, *_ in TEAM_A_MODELS
            },
            rotations=files.rotations,
            wall_seconds=time.monotonic() - began,
        )


def ignored_configmaps(run: Run) -> float:
    return sum(metric_values(run.metrics, "kserve_canary_configmaps_ignored_total").values())
