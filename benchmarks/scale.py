"""``python -m benchmarks.scale [--sizes 10,100,1000] [--idle 10000] [--interval 30]``: the controller
process at scale, against the sandbox stack (the API emulator over HTTP, the simulated fleet, Debian's
real Prometheus).

For each size N: N InferenceServices with a policy each (``interval`` 30 s, a 10 min window, three
checks: p99, error rate, OOM kills), all Ready on v1; the real ``kserve-canary run`` process starts;
then every model gets v2 the GitOps way, the pushes spread over one interval (staggered starts), so
each rollout enters its first step at its own moment. One more model's v2 leaks GPU memory and is
OOM-killed about a minute after it takes traffic. Measured over two intervals once every rollout
holds its first step, from outside the controller:

* Prometheus requests per tick — Prometheus' own ``prometheus_http_requests_total`` (query handlers);
* API reads and writes per tick — the emulator's request log (the controller's user agent, watches
  excluded), state ConfigMap writes apart;
* controller CPU share (``/proc/<pid>/stat``) and RSS (``/proc/<pid>/status``): at the window's end,
  and its peak over one reading a second (the target is on the peak);
* p99 tick duration, due and decided rollouts per tick, rollouts carried over — the controller's
  own ``/metrics`` (``kserve_canary_tick_*``);
* start to first decision (process spawned → first log line with a ``decisionId``);
* the OOM rollback delay: from the first Prometheus sample showing the OOM kill (the scrape that made
  it queryable) to the rollback ``PATCH`` in the emulator's request log.

``--hold M``: after the window, keep reading RSS until M minutes into the first steps, at the largest
size (their window is 10 minutes; the current step keeps a counter snapshot per revision per tick;
past 10 the earliest rollouts advance to their second step).

``--idle N``: N governed InferenceServices, Ready, nothing to roll out, states already stored (a
restart of a controller that governs them): start to first decision, and to every rollout decided.

Per tick = per timer tick (``--tick``, 5 s): counts over the window × tick / window. Ratios are
against the smallest size of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service
from rich.console import Console
from rich.table import Table

NS = "scale"
TICK = 5.0
SCRAPE = 2.0
V1, V2, OOM_V2 = "s3://m/v1", "s3://m/v2", "s3://m/v2-leaks"
OOMER = "oomer"


def policy(name: str, interval: float) -> str:
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 50, 100]
  window: 10m
  interval: {interval:g}s
  minRequests: 100
  progressDeadline: 10m
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
"""


def names(count: int) -> list[str]:
    return [f"m{index:05d}" for index in range(count)]


@dataclass
class Result:
    size: int
    interval: float
    prometheus_per_tick: float = 0.0
    reads_per_tick: float = 0.0
    writes_per_tick: float = 0.0
    state_writes_per_tick: float = 0.0
    cpu_share: float = 0.0
    rss_mib: float = 0.0  # at the window's end
    rss_peak_mib: float = 0.0  # the highest of one reading a second through the window
    rss_through_step: list[tuple[float, float]] = field(default_factory=list)  # (minutes, MiB), --hold
    tick_p99: float = 0.0
    due_per_tick: float = 0.0
    decided_per_tick: float = 0.0
    carried: float = 0.0
    first_decision: float = 0.0
    rollback_delay: float | None = None
    machine_busy: float = 0.0  # the share of all cores busy (every process) through the window
    notes: list[str] = field(default_factory=list)


# -- reading the world from outside --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, every process (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def reference_loop_seconds() -> float:
    """Seconds this machine's core takes for a fixed pure-Python loop (ten million additions), the
    best of three, before the stack starts. A CPU share is a share of *this* core: the same commit
    measured 11 % of one machine's core and 21 % of another's (of the same kind, on different days),
    so a share is compared only with one measured beside it, or with this figure beside both."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for number in range(10_000_000):
            total += number
        best = min(best, time.perf_counter() - started)
    return best


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def prometheus_queries(url: str) -> float:
    """Query requests Prometheus has answered, by its own count."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric family in a /metrics text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            rest = line[len(name) :]
            if rest[:1] not in ("{", " "):
                continue
            labels, _, value = rest.rpartition(" ")
            values[labels] = float(value)
    return values


def histogram_quantile(text: str, name: str, quantile: float, *, since: str | None = None) -> float:
    """The bucket bound the quantile falls under (of the observations after ``since``, a /metrics text)."""
    earlier = metric_values(since, name + "_bucket") if since is not None else {}
    buckets = sorted(
        (float("inf") if le == "+Inf" else float(le), count - earlier.get(labels, 0.0))
        for labels, count in metric_values(text, name + "_bucket").items()
        for le in re.findall(r'le="([^"]+)"', labels)
    )
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    wanted = quantile * buckets[-1][1]
    return next(bound for bound, count in buckets if count >= wanted)


def first_decision(controller: ControllerProcess) -> bool:
    return any("decisionId" in line for line in controller.log_lines())


def wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # "not yet"
            pass
        time.sleep(interval)
    return False


def states(stack: Stack) -> dict[str, dict[str, Any]]:
    """Every stored rollout state of the namespace, by InferenceService, read in one list."""
    from kubernetes import client

    listed = client.CoreV1Api(stack.api).list_namespaced_config_map(
        NS, label_selector="app.kubernetes.io/managed-by=kserve-canary"
    )
    found = {}
    for item in listed.items:
        text = (item.data or {}).get("state.json")
        model = (item.metadata.labels or {}).get("kserve-canary.dev/inference-service", "")
        if text and item.metadata.name == f"kserve-canary-{model}":
            found[model] = json.loads(text)
    return found


def holding_first_step(stack: Stack, models: list[str]) -> bool:
    found = states(stack)
    return all(
        (state := found.get(name)) is not None
        and state.get("phase") == "Progressing"
        and (state.get("step") or {}).get("startedAt")
        for name in models
    )


def evaluated_once(stack: Stack, models: list[str]) -> bool:
    found = states(stack)
    return all(((found.get(name) or {}).get("evaluation") or {}).get("verdict") for name in models)


def all_ready(stack: Stack, count: int) -> bool:
    listed = stack.custom.list_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NS, "inferenceservices"
    )
    ready = [
        item
        for item in listed["items"]
        if ((item.get("status") or {}).get("components") or {})
        .get("predictor", {})
        .get("latestRolledoutRevision")
    ]
    return len(ready) >= count


def oom_visible_at(stack: Stack) -> float | None:
    """When the first Prometheus sample showed the canary's OOM kill (the scrape that made it queryable)."""
    assert stack.prometheus is not None
    selector = (
        f'kube_pod_container_status_restarts_total{{namespace="{NS}",pod=~"{OOMER}-predictor-00002.*"}}[15m]'
    )
    query = urllib.parse.urlencode({"query": selector})
    with urllib.request.urlopen(f"{stack.prometheus.url}/api/v1/query?{query}", timeout=10) as response:
        body = json.loads(response.read())
    firsts = [
        float(timestamp)
        for series in body["data"]["result"]
        for timestamp, value in series["values"]
        if float(value) > 0
    ]
    return min(firsts) if firsts else None


def rollback_patch_at(stack: Stack) -> float | None:
    for entry in stack.emulator.requests.entries(method="PATCH", path_contains=f"/inferenceservices/{OOMER}"):
        body = entry.body if isinstance(entry.body, dict) else {}
        percent = ((body.get("spec") or {}).get("predictor") or {}).get("canaryTrafficPercent")
        if entry.status == 200 and entry.user_agent.startswith("kserve-canary/") and percent == 0:
            return entry.time
    return None


def write_kind(entry: Any) -> str:
    """What a write was, for the breakdown: the method and the resource (and which ConfigMap)."""
    parts = entry.path.strip("/").split("/")
    resource = next((part for part in reversed(parts[:-1]) if part.isalpha() and part.islower()), parts[-1])
    if "/configmaps" in entry.path:
        resource = "outbox" if "outbox" in entry.path else "ledger" if ".ledger" in entry.path else "state"
    if "/events" in entry.path:
        resource = "events"
    return f"{entry.method} {resource}"


def api_counts(stack: Stack, since: float, until: float) -> tuple[int, int, int, dict[str, int]]:
    """Reads, writes, state ConfigMap writes and writes by kind (:func:`write_kind`) in the window."""
    reads = 0
    kinds: Counter[str] = Counter()
    for entry in stack.emulator.requests.entries():
        if not (since <= entry.time < until) or not entry.user_agent.startswith("kserve-canary/"):
            continue
        if "watch=true" in entry.query or "watch=1" in entry.query:
            continue
        if entry.method == "GET":
            reads += 1
        else:
            kinds[write_kind(entry)] += 1
    state_writes = sum(count for kind, count in kinds.items() if kind.endswith(" state"))
    return reads, sum(kinds.values()), state_writes, dict(kinds)


# -- the scenarios ---------------------------------------------------------------------------------


def rollouts(size: int, interval: float, console: Console, hold: float = 0.0) -> Result:
    """``hold``: minutes into the first steps to keep reading RSS after the window (0: not at all)."""
    result = Result(size, interval)
    models = names(size)
    fleet_tick = max(1.0, size / 200)  # the same traffic in fewer, larger steps for big fleets
    traffic = [
        ModelTraffic(NS, name, 2.0, {V1: RevisionBehaviour(), V2: RevisionBehaviour()}) for name in models
    ]
    leaky = RevisionBehaviour(gpu_mib_per_request=15.0, oom_at_mib=33_000.0)
    traffic.append(ModelTraffic(NS, OOMER, 40.0, {V1: RevisionBehaviour(), OOM_V2: leaky}))
    policies = {f"{name}.yaml": policy(name, interval) for name in [*models, OOMER]}
    with Stack(
        traffic,
        policies,
        fleet_tick=fleet_tick,
        scrape_interval=SCRAPE,
        request_log_size=3_000_000,
        env={"TICK_SECONDS": f"{TICK:g}"},
    ) as stack:
        for name in [*models, OOMER]:
            stack.apply(inference_service(NS, name, V1))
        if not wait(lambda: all_ready(stack, size + 1), 120 + size / 10):
            result.notes.append("not every InferenceService became Ready")
        started = time.monotonic()
        controller = stack.start_controller("scale", wait_ready=False)
        wait(lambda: first_decision(controller), 120, 0.05)
        result.first_decision = time.monotonic() - started
        # Staggered starts: v2 for every model, spread over one interval; the OOM-prone one first.
        stack.set_storage_uri(NS, OOMER, OOM_V2)
        pace = interval / max(1, size)
        for index, name in enumerate(models):
            target = started + result.first_decision + index * pace
            time.sleep(max(0.0, target - time.monotonic()))
            stack.set_storage_uri(NS, name, V2)
        if not wait(lambda: holding_first_step(stack, models), 3 * interval + size / 5, 2.0):
            result.notes.append("not every rollout held its first step before the window")
        steps_held = time.monotonic()  # every rollout holds its first step (10 min) from about now
        # Steady state: every rollout has had its first evaluation (stored with its first verdict and
        # explain) — on an overloaded controller that takes longer than one interval, and the
        # start-up wave (first verdicts, "started" Events) is not what a fleet at 30 s costs.
        if not wait(lambda: evaluated_once(stack, models), 4 * interval + size / 5, 2.0):
            result.notes.append("not every rollout had its first evaluation before the window")
        time.sleep(TICK)
        window = 2 * interval
        text0, prom0, cpu0, t0 = (
            controller.metrics(timeout=60),
            prometheus_queries(stack.prometheus.url),
            None,
            time.time(),
        )  # type: ignore[union-attr]
        cpu0 = cpu_seconds(controller.process.pid)
        machine0 = machine_jiffies()
        # RSS once a second through the window: its peak is what a memory limit must hold (the
        # end value alone depends on where in its tick the controller was).
        peak_rss = 0.0
        while time.time() < t0 + window:
            peak_rss = max(peak_rss, rss_mib(controller.process.pid))
            time.sleep(min(1.0, max(0.0, t0 + window - time.time())))
        t1 = time.time()
        cpu1 = cpu_seconds(controller.process.pid)
        machine1 = machine_jiffies()
        result.machine_busy = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])
        prom1 = prometheus_queries(stack.prometheus.url)  # type: ignore[union-attr]
        text1 = controller.metrics(timeout=60)  # 1,000 rollouts' gauges, on a busy machine
        ticks = window / TICK
        result.prometheus_per_tick = (prom1 - prom0) / ticks
        reads, writes, state_writes, kinds = api_counts(stack, t0, t1)
        result.notes.append(f"API writes in the window by kind {dict(sorted(kinds.items()))}")
        result.reads_per_tick = reads / ticks
        result.writes_per_tick = writes / ticks
        result.state_writes_per_tick = state_writes / ticks
        result.cpu_share = (cpu1 - cpu0) / (t1 - t0)
        result.rss_mib = rss_mib(controller.process.pid)
        result.rss_peak_mib = max(peak_rss, result.rss_mib)
        result.tick_p99 = histogram_quantile(text1, "kserve_canary_tick_duration_seconds", 0.99, since=text0)
        outcomes0 = metric_values(text0, "kserve_canary_tick_rollouts_total")
        outcomes1 = metric_values(text1, "kserve_canary_tick_rollouts_total")

        def delta(outcome: str) -> float:
            key = f'{{outcome="{outcome}"}}'
            return outcomes1.get(key, 0.0) - outcomes0.get(key, 0.0)

        reasons0 = metric_values(text0, "kserve_canary_state_writes_total")
        reasons1 = metric_values(text1, "kserve_canary_state_writes_total")
        reasons = {
            key.split('"')[1]: value - reasons0.get(key, 0.0)
            for key, value in reasons1.items()
            if value - reasons0.get(key, 0.0) > 0
        }
        skipped = metric_values(text1, "kserve_canary_state_writes_skipped_total").get(
            "", 0.0
        ) - metric_values(text0, "kserve_canary_state_writes_skipped_total").get("", 0.0)
        result.notes.append(
            f"state writes in the window by reason {reasons}; evaluations not written {skipped:.0f}"
        )
        timer_ticks = window / TICK
        result.due_per_tick = delta("due") / timer_ticks
        result.decided_per_tick = delta("decided") / timer_ticks
        result.carried = delta("carried")
        wait(lambda: rollback_patch_at(stack) is not None, 4 * interval, 1.0)
        if hold > 0:
            # Through the step: the current step keeps a counter snapshot per revision per tick.
            readings: list[tuple[float, float]] = []
            while (minutes := (time.monotonic() - steps_held) / 60) < hold:
                readings.append((minutes, rss_mib(controller.process.pid)))
                time.sleep(15)
            result.rss_through_step = readings
            shown = ", ".join(f"{minutes:.1f} min {rss:.0f}" for minutes, rss in readings[::4])
            result.notes.append(
                f"RSS MiB through the first step (minutes since every rollout held it): {shown}"
            )
        visible, patched = oom_visible_at(stack), rollback_patch_at(stack)
        if visible is not None and patched is not None:
            result.rollback_delay = patched - visible
        else:
            result.notes.append(f"OOM visible at {visible}, rollback at {patched}")
        controller.terminate()
    console.log(f"N={size}: {result}")
    return result


def idle(count: int, interval: float, console: Console) -> tuple[float, float, float]:
    """Start to first decision, and to every rollout decided, with ``count`` idle governed models."""
    models = names(count)
    policies = {f"{name}.yaml": policy(name, interval) for name in models}
    with Stack(
        [], policies, scrape_interval=SCRAPE, request_log_size=100_000, env={"TICK_SECONDS": f"{TICK:g}"}
    ) as stack:
        stack.emulator.create_namespace(NS)
        for name in models:
            stack.emulator.create(inference_service(NS, name, V1))
        if not wait(lambda: all_ready(stack, count), 300, 2.0):
            console.log("idle: not every InferenceService became Ready")
        # A controller that governed them before: let one run until every state is stored.
        first = stack.start_controller("idle-first", wait_ready=False)
        wait(lambda: len(states(stack)) >= count, 600, 5.0)
        first.terminate()
        started = time.monotonic()
        controller = stack.start_controller("idle", wait_ready=False)
        wait(lambda: first_decision(controller), 300, 0.05)
        to_first = time.monotonic() - started
        lines = controller.log_lines()
        loaded = next((line for line in lines if line.get("event") == "policies loaded"), None)
        first_line = next((line for line in lines if "decisionId" in line), None)
        if loaded is not None and first_line is not None:
            # Where the time went: the log's own clock, loading the policies to the first decision.
            gap = datetime.fromisoformat(first_line["timestamp"]) - datetime.fromisoformat(
                loaded["timestamp"]
            )
            console.log(
                f"idle {count}: policies loaded {to_first - gap.total_seconds():.1f} s after the spawn, "
                f"first decision {gap.total_seconds():.1f} s after that"
            )

        def decided() -> int:
            # From the log, not /metrics: rendering 10,000 rollouts' gauges every second would be the
            # benchmark's own load on the controller.
            return len(
                {line.get("inferenceService") for line in controller.log_lines() if "decisionId" in line}
            )

        wait(lambda: decided() >= count, 600, 5.0)
        to_all = time.monotonic() - started
        cpu = cpu_seconds(controller.process.pid)
        controller.terminate()
    console.log(f"idle {count}: first decision {to_first:.1f} s, all decided {to_all:.1f} s, cpu {cpu:.1f} s")
    return to_first, to_all, cpu


# -- the table ---------------------------------------------------------------------------------------


def print_sizes(results: list[Result], console: Console) -> None:
    base = results[0]
    table = Table(
        title=f"kserve-canary at scale (interval {base.interval:g} s, tick {TICK:g} s, scrape {SCRAPE:g} s)"
    )
    for column in (
        "N", "Prometheus req/tick", "× N=" + str(base.size), "API reads/tick", "API writes/tick",
        "state writes/tick", "due/tick", "decided/tick", "carried", "CPU (core)", "RSS MiB (peak)",
        "p99 tick s", "first decision s", "OOM → rollback s",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for result in results:
        ratio = (
            result.prometheus_per_tick / base.prometheus_per_tick
            if base.prometheus_per_tick
            else float("nan")
        )
        table.add_row(
            str(result.size),
            f"{result.prometheus_per_tick:.1f}",
            f"{ratio:.2f}",
            f"{result.reads_per_tick:.1f}",
            f"{result.writes_per_tick:.1f}",
            f"{result.state_writes_per_tick:.2f}",
            f"{result.due_per_tick:.1f}",
            f"{result.decided_per_tick:.1f}",
            f"{result.carried:.0f}",
            f"{result.cpu_share:.3f}",
            f"{result.rss_mib:.0f} ({result.rss_peak_mib:.0f})",
            f"{result.tick_p99:.2f}",
            f"{result.first_decision:.1f}",
            "—" if result.rollback_delay is None else f"{result.rollback_delay:.1f}",
        )
    console.print(table)


def report(
    results: list[Result],
    idle_result: tuple[int, float, float, float] | None,
    console: Console,
    reference: float | None = None,
) -> bool:
    if results:
        print_sizes(results, console)
    targets = Table(title="targets")
    for column in ("target", "measured", "met"):
        targets.add_column(column)
    ok = True

    def target(text: str, measured: str, met: bool) -> None:
        nonlocal ok
        ok &= met
        targets.add_row(text, measured, "yes" if met else "NO")

    if len(results) > 1:
        base, largest = results[0], results[-1]
        target(
            f"Prometheus requests per tick at N={largest.size} ≤ 2 × at N={base.size}",
            f"{largest.prometheus_per_tick:.1f} vs {base.prometheus_per_tick:.1f}",
            largest.prometheus_per_tick <= 2 * base.prometheus_per_tick,
        )
    for result in results:
        target(
            f"N={result.size}: every due rollout decided every tick",
            f"due {result.due_per_tick:.1f}, decided {result.decided_per_tick:.1f}, "
            f"carried {result.carried:.0f}",
            result.carried == 0 and result.decided_per_tick >= result.due_per_tick * 0.99,
        )
        if result.rollback_delay is not None:
            limit = result.interval + SCRAPE
            target(
                f"N={result.size}: rollback within one interval plus one scrape ({limit:g} s)",
                f"{result.rollback_delay:.1f} s",
                result.rollback_delay <= limit,
            )
    for result in results:
        if result.rss_through_step:
            top = max(rss for _, rss in result.rss_through_step)
            last = result.rss_through_step[-1][0]
            span = f"to {last:.1f} min of 10" if last <= 10 else f"and {last - 10:.1f} min into the next"
            target(
                f"N={result.size}: ≤ 300 MiB through the first step ({span})",
                f"peak {top:.0f} MiB",
                top <= 300,
            )
        if result.size >= 1000:
            target(
                f"N={result.size} at {result.interval:g} s: ≤ 10 % of a core and ≤ 300 MiB (peak RSS)",
                f"{result.cpu_share * 100:.1f} %, {result.rss_peak_mib:.0f} MiB",
                result.cpu_share <= 0.10 and result.rss_peak_mib <= 300,
            )
    if idle_result is not None:
        count, to_first, to_all, _ = idle_result
        target(
            f"{count} idle policies: start to first decision < 10 s",
            f"{to_first:.1f} s (every rollout decided after {to_all:.1f} s)",
            to_first < 10,
        )
    console.print(targets)
    for result in results:
        for note in result.notes:
            console.print(f"N={result.size}: {note}")
        console.print(
            f"N={result.size}: all cores {result.machine_busy * 100:.0f} % busy through the window (the "
            "controller shares them with the fleet simulator, the emulator, Prometheus and this benchmark)"
        )
    if reference is not None:
        console.print(
            f"this machine: the reference loop (scale.reference_loop_seconds) in {reference:.2f} s; CPU "
            "shares are of this machine's core"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--idle", type=int, default=10_000, help="0: skip")
    parser.add_argument("--idle-baseline", type=int, default=100, help="the same start with this many")
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument(
        "--hold", type=float, default=0.0, help="minutes into the first steps to keep reading RSS (0: no)"
    )
    args = parser.parse_args(argv)
    console = Console(width=220)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    reference = reference_loop_seconds()
    # The memory target is at the largest size: the others are not held through the step.
    largest = max(sizes, default=0)
    results = [
        rollouts(size, args.interval, console, args.hold if size == largest else 0.0) for size in sizes
    ]
    idle_result = None
    if args.idle:
        base_first, _, _ = idle(args.idle_baseline, args.interval, console)
        to_first, to_all, cpu = idle(args.idle, args.interval, console)
        idle_result = (args.idle, to_first, to_all, cpu)
        console.log(
            f"start to first decision: {args.idle} idle policies {to_first:.1f} s, {args.idle_baseline} "
            f"{base_first:.1f} s ({to_first / base_first:.2f} ×)"
        )
    report(results, idle_result, console, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
