"""``kserve-canary demo``: the whole job on one machine, with no cluster.

It reuses the end-to-end tests' machinery (:class:`canary_sandbox.stack.Stack`): the Kubernetes API
emulator with KServe's behaviour, a simulated serving fleet following the traffic split, Debian's
real Prometheus scraping it every second, a loopback webhook receiver, and the controller itself as a
separate ``kserve-canary run`` process. The demo's policies are PromotionPolicy objects, as a model
team keeps them beside its InferenceService: the CRD installed, one object per model in its namespace,
the webhook's URL in that namespace's Secret. Then it tells the story of
:mod:`canary_sandbox.demo.story`, shows it live, writes the HTML report and exits 0 only when every model
ended as the story says it must.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import requests
from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from canary.metrics.ranges import RangeQueryError, RangeReader
from canary.policy import PromotionPolicy
from canary.report.charts import decision_markers
from canary_sandbox.demo.monitor import ModelTimeline, ModelView, notifications_for, observe
from canary_sandbox.demo.policies import (
    DEMO_NAMESPACE,
    WEBHOOK_ENV,
    DemoTiming,
    parse_policy,
    render_policies,
)
from canary_sandbox.demo.report import ModelReport, collect_charts, render_html
from canary_sandbox.demo.story import ModelStory, Outcome, model_traffic, storage_uri, stories
from canary_sandbox.demo.ui import PlainLog, live_view
from canary_sandbox.emulator import RevisionBehaviour as RevisionReadiness
from canary_sandbox.stack import Stack, inference_service, wait_until

__all__ = ["DemoFailed", "DemoOptions", "run_demo"]

POLL_SECONDS = 0.5
# After the last decision, keep watching this long so the charts show the world it left behind.
TAIL_SECONDS = 3.0


class DemoFailed(RuntimeError):
    """The demo could not tell its story (a component did not start, the story ran out of time)."""


@dataclass(frozen=True)
class DemoOptions:
    speed: float = 1.0
    seed: int = 7
    ui: bool = True
    keep_running: bool = False
    report: Path | None = None  # default: report.html in a new temporary directory


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT unwind like Ctrl-C, so every process the demo started is stopped either way.

    SIGINT is set explicitly: a shell starts background jobs with SIGINT ignored, and ``kill -INT``
    must still stop a ``--keep-running`` demo.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        # Once: a second Ctrl-C while the processes are being stopped would cut the clean-up short
        # and leave Prometheus or the controller behind.
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _step(console: Console, text: str) -> None:
    console.print(Text("• ", style="cyan") + Text(text), highlight=False)


class _Story:
    """One run of the demo: the stack, the models, what has been seen so far."""

    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.timing = DemoTiming(options.speed)
        self.stories: dict[str, ModelStory] = {story.name: story for story in stories(self.timing)}
        self.policy_texts = render_policies(self.timing)
        self.policies: dict[str, PromotionPolicy] = {
            name.removesuffix(".yaml"): parse_policy(text, name) for name, text in self.policy_texts.items()
        }
        self.stable_revisions: dict[str, str] = {}
        self.timelines = {name: ModelTimeline() for name in self.stories}
        self.first_step_before_ready = dict.fromkeys(self.stories, False)
        self.views: dict[str, ModelView] = {}
        self.last_observation_error: str | None = None  # said when the story runs out of time
        self.origin = 0.0  # epoch seconds when the new versions were applied

    # -- set-up ------------------------------------------------------------------------------------

    def start(self, stack: Stack) -> None:
        for story in self.stories.values():
            stack.apply(inference_service(story.namespace, story.name, storage_uri(story.name, "v1")))
        if not wait_until(lambda: self._all_rolled_out(stack), 30):
            raise DemoFailed("the v1 InferenceServices did not become Ready in the emulator within 30s")
        for name in self.stories:
            self.stable_revisions[name] = stack.predictor_status(DEMO_NAMESPACE, name)[
                "latestRolledoutRevision"
            ]
        _step(self.console, "v1 of every model is serving; starting the controller")
        controller = stack.start_controller("demo")
        _step(
            self.console,
            f"controller ready (pid {controller.process.pid}); waiting for Prometheus to see v1's traffic",
        )
        assert stack.prometheus is not None
        prometheus_url = stack.prometheus.url
        if not wait_until(lambda: self._baseline_scraped(prometheus_url), 45):
            raise DemoFailed("Prometheus did not scrape the simulated fleet within 45s")
        for story in self.stories.values():
            # How soon (if ever) v2 becomes Ready is the world's property, set before the revision
            # exists: the fleet learns it only once KServe's status names the revision, and by then a
            # revision with the emulator's default readiness could already be Ready.
            readiness = RevisionReadiness(ready_after_seconds=story.canary.ready_after_s)
            stack.emulator.set_default_behaviour(story.namespace, story.name, readiness)
        self.origin = time.time()
        for story in self.stories.values():
            # The GitOps way: only the model changes, no canaryTrafficPercent. The controller must put
            # the first step in place before the new revision is Ready.
            stack.set_storage_uri(story.namespace, story.name, storage_uri(story.name, "v2"))
        _step(self.console, "v2 applied to all three models (new storageUri, no canaryTrafficPercent)")

    def _all_rolled_out(self, stack: Stack) -> bool:
        return all(
            stack.predictor_status(DEMO_NAMESPACE, name).get("latestRolledoutRevision")
            for name in self.stories
        )

    def _baseline_scraped(self, prometheus_url: str) -> bool:
        """Every v1 revision has a request rate in Prometheus: the stable side of every comparison."""
        selector = f'namespace_name="{DEMO_NAMESPACE}"'
        query = f"sum by (configuration_name) (rate(revision_request_count{{{selector}}}[5s]))"
        response = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
        result = response.json()["data"]["result"]
        return len([item for item in result if float(item["value"][1]) > 0]) == len(self.stories)

    # -- the story ---------------------------------------------------------------------------------

    def observe(self, stack: Stack) -> list[ModelView]:
        for name, policy in self.policies.items():
            try:
                view = observe(stack, policy, self.stable_revisions.get(name))
            except Exception as error:  # a transient read error: keep the last view, remember why
                self.last_observation_error = f"{name}: {type(error).__name__}: {error}"
                continue
            self.views[name] = view
            self.timelines[name].add(view)
            first_step = policy.spec.canary_steps[0].weight
            if view.canary_revision and not view.canary_ready and view.spec_weight == first_step:
                self.first_step_before_ready[name] = True
        return [self.views[name] for name in self.stories if name in self.views]

    def story_deadline(self) -> float:
        """Seconds the story may take: three windows and a deadline with ample slack for a slow machine."""
        window, deadline = self.timing.window, self.timing.progress_deadline
        return 4 * (3 * window + deadline) + 60

    def outcomes(self, payloads: Sequence[Mapping[str, Any]]) -> dict[str, Outcome]:
        return {
            name: Outcome(
                name=name,
                phase=self.views[name].phase if name in self.views else None,
                history=self.views[name].history if name in self.views else (),
                notifications=notifications_for(payloads, name),
                first_step_before_ready=self.first_step_before_ready[name],
            )
            for name in self.stories
        }


def _summary_table(
    story: _Story, outcomes: Mapping[str, Outcome], problems: Mapping[str, list[str]]
) -> Table:
    table = Table(title="kserve-canary demo: outcome", title_justify="left")
    table.add_column("MODEL", no_wrap=True)
    table.add_column("OUTCOME", no_wrap=True)
    table.add_column("TRAFFIC TO v2", no_wrap=True)
    table.add_column("DECISIVE REASON", ratio=1)
    for name, model in story.stories.items():
        outcome = outcomes[name]
        moves = " → ".join("promoted" if to is None else str(to) for to in outcome.traffic_moves()) or "—"
        ok = not problems[name]
        # The outcome says what happened and whether the story expected it, in a neutral colour: a
        # green tick beside "RolledBack" reads as "the rollback went fine", not "it was meant to".
        verdict = (
            Text(f"{outcome.phase} — as expected", style="green" if outcome.phase == "Succeeded" else "bold")
            if ok
            else Text(f"✗ {outcome.phase} — not as expected", style="bold red")
        )
        reason = outcome.decisive_reason()
        if not ok:
            reason += f"\nexpected: {model.expected}; " + "; ".join(problems[name])
        table.add_row(f"{model.letter} {name}", verdict, moves, reason)
    return table


def _write_report(
    story: _Story,
    stack: Stack,
    outcomes: Mapping[str, Outcome],
    problems: Mapping[str, list[str]],
    path: Path,
) -> None:
    assert stack.prometheus is not None
    end = time.time()
    start = story.origin - 4  # a few seconds of v1 alone: the baseline the canary is compared with
    prometheus = RangeReader.at(stack.prometheus.url, start, end, 1.0)
    models = []
    for name, model in story.stories.items():
        view = story.views.get(name)
        outcome = outcomes[name]
        charts = collect_charts(
            prometheus,
            story.policies[name],
            story.timelines[name],
            stable=story.stable_revisions.get(name),
            canary=view.canary_revision if view else None,
            origin=story.origin,
        )
        models.append(
            ModelReport(
                model,
                story.policies[name],
                outcome,
                problems[name],
                charts,
                decision_markers(outcome.notifications, story.origin),
            )
        )
    facts = [
        ("run", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(story.origin))),
        ("seed · speed", f"{story.options.seed} · {story.options.speed:g}x"),
        (
            "policy timing",
            f"window {story.timing.window:g}s, interval {story.timing.interval:g}s, "
            f"minRequests {story.timing.min_requests}, progressDeadline {story.timing.progress_deadline:g}s",
        ),
        ("Prometheus", "Debian's prometheus binary, scraping the simulated fleet every 1s"),
    ]
    page = render_html(
        models,
        title="kserve-canary demo report",
        facts=facts,
        origin=story.origin,
        x_range=(start - story.origin, end - story.origin),
        policies_text=story.policy_texts,
    )
    path.write_text(page, encoding="utf-8")


def cli_command() -> str:
    """The CLI as it can be typed in any shell: its full path (``make demo`` runs it from ``.venv/bin``,
    which is not on the user's PATH), else ``python -m canary`` with this interpreter."""
    beside = Path(sys.executable).parent / "kserve-canary"
    if beside.is_file():
        return str(beside)
    found = shutil.which("kserve-canary")
    if found:
        return str(Path(found).resolve())
    return f"{sys.executable} -m canary"


def _keep_running(console: Console, stack: Stack) -> None:
    assert stack.prometheus is not None
    kubeconfig = stack.kubeconfig
    cli = cli_command()
    metrics = f"http://127.0.0.1:{stack.controllers[-1].metrics_port}/metrics" if stack.controllers else "-"
    console.print(
        "\n[bold]Everything is still running[/] — poke at it, then press Ctrl-C to stop it all:\n"
        f"  Prometheus UI   {stack.prometheus.url}/graph\n"
        f"  kubectl         kubectl --kubeconfig {kubeconfig} get inferenceservices -n {DEMO_NAMESPACE}\n"
        f"                  kubectl --kubeconfig {kubeconfig} get promotionpolicies -n {DEMO_NAMESPACE}\n"
        f"                  kubectl --kubeconfig {kubeconfig} get events -n {DEMO_NAMESPACE}\n"
        f"  rollouts        {cli} status --kubeconfig {kubeconfig}\n"
        f"                  {cli} explain {DEMO_NAMESPACE}/llm-chat --kubeconfig {kubeconfig}\n"
        f"  metrics         {metrics}\n"
        f"  controller log  {stack.controllers[-1].log_path if stack.controllers else '-'}",
        highlight=False,
    )
    while True:
        time.sleep(3600)


def run_demo(options: DemoOptions, console: Console) -> int:
    """Tell the story; 0 when every model ended as expected, 1 otherwise (with what went wrong)."""
    if shutil.which("prometheus") is None:
        console.print(
            "[red]The demo needs Prometheus:[/] run `make demo` (it installs Debian's prometheus package) "
            "or `sudo apt-get install prometheus`."
        )
        return 1
    story = _Story(options, console)
    report_path = options.report or Path(tempfile.mkdtemp(prefix="kserve-canary-demo-")) / "report.html"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    models = [model_traffic(model) for model in story.stories.values()]
    started = time.monotonic()
    _step(
        console,
        f"starting the Kubernetes/KServe emulator, the simulated fleet and Prometheus (seed {options.seed})",
    )
    try:
        with (
            _signals_as_interrupt(),
            Stack(models, story.policy_texts, seed=options.seed, policy_objects=True) as stack,
        ):
            return _tell(story, stack, console, report_path, started)
    except KeyboardInterrupt:
        # Ctrl-C (or kill -INT/-TERM) is how a person ends the demo, --keep-running above all: a
        # request, not a failure. Every process is stopped by now (the Stack's exit), so exit 0 —
        # and `make demo` does not end in "Error 130".
        console.print("interrupted: every process the demo started has been stopped")
        return 0


def _tell(story: _Story, stack: Stack, console: Console, report_path: Path, started: float) -> int:
    """The story inside a running stack; 0 when every model ended as expected."""
    options = story.options
    assert stack.prometheus is not None
    stack.env = {WEBHOOK_ENV: f"{stack.receiver.url}/hook"}
    _step(console, f"Prometheus {stack.prometheus.url}, webhook receiver {stack.receiver.url}")
    _step(
        console,
        f"{len(story.policy_texts)} PromotionPolicy objects in namespace {DEMO_NAMESPACE}, beside their "
        "InferenceServices; the webhook URL in the namespace's Secret kserve-canary-notifications",
    )
    story.start(stack)
    finished = _watch(story, stack, console)
    payloads = [request.json() for request in stack.receiver.requests]
    outcomes = story.outcomes(payloads)
    problems = {name: story.stories[name].judge(outcomes[name]) for name in story.stories}
    if not finished:
        for name in story.stories:
            view = story.views.get(name)
            if view is None or not view.finished:
                phase = view.phase if view else "unobserved"
                problems[name].append(f"still {phase} when the demo's time ran out")
        if story.last_observation_error:
            problems.setdefault("demo", []).append(
                f"the last failed observation was {story.last_observation_error}"
            )
    try:
        _write_report(story, stack, outcomes, problems, report_path)
    except (RangeQueryError, OSError) as error:
        problems.setdefault("report", []).append(f"the report could not be written: {error}")
    # The evidence beside the report: every notification as received, and the controller's own log.
    report_path.with_name("notifications.json").write_text(json.dumps(payloads, indent=1), encoding="utf-8")
    if stack.controllers:
        shutil.copyfile(stack.controllers[-1].log_path, report_path.with_name("controller.log"))
    console.print()
    console.print(_summary_table(story, outcomes, {name: problems[name] for name in story.stories}))
    elapsed = time.monotonic() - started
    console.print(f"Report: {report_path}", highlight=False, soft_wrap=True)
    console.print(
        f"Controller log: {report_path.with_name('controller.log')}", highlight=False, soft_wrap=True
    )
    failed = {name: issues for name, issues in problems.items() if issues}
    if failed:
        for name, issues in failed.items():
            console.print(f"[bold red]✗ {name}:[/] " + "; ".join(issues), highlight=False)
        console.print(f"[bold red]The story did not happen as expected[/] ({elapsed:.0f}s).")
    else:
        console.print(
            f"[bold green]✓ The story happened as expected[/] in {elapsed:.0f}s: a healthy model "
            "promoted, a regression and a model that never became Ready rolled back."
        )
    if options.keep_running:
        _keep_running(console, stack)
    return 1 if failed else 0


def _watch(story: _Story, stack: Stack, console: Console) -> bool:
    """Follow the story until every model has finished (True) or the time is up (False)."""
    deadline = time.monotonic() + story.story_deadline()
    title = f"kserve-canary demo · seed {story.options.seed} · speed {story.options.speed:g}x"
    plain = PlainLog(console, story.origin)
    finished_at: float | None = None

    def frame() -> RenderableType | None:
        payloads = [request.json() for request in stack.receiver.requests]
        views = story.observe(stack)
        if not story.options.ui:
            plain.update(views, payloads)
            return None
        return live_view(
            views,
            story.stories,
            story.policies,
            payloads,
            origin=story.origin,
            elapsed=time.time() - story.origin,
            title=title,
        )

    def step(live: Live | None) -> bool | None:
        nonlocal finished_at
        rendered = frame()
        if live is not None and rendered is not None:
            live.update(rendered)
        controller = stack.controllers[-1]
        if not controller.alive:
            raise DemoFailed(f"the controller exited:\n{controller.log()[-3000:]}")
        done = len(story.views) == len(story.stories) and all(v.finished for v in story.views.values())
        now = time.monotonic()
        if done and finished_at is None:
            finished_at = now
        if finished_at is not None and now - finished_at >= TAIL_SECONDS:
            return True
        if now > deadline:
            return False
        time.sleep(POLL_SECONDS)
        return None

    if story.options.ui:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while (result := step(live)) is None:
                pass
            return result
    while (result := step(None)) is None:
        pass
    return result
