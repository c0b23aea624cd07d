"""kserve-canary backtest against a real Prometheus holding backfilled history (promtool blocks).

Each expected answer is computed from the generated requests and the policy (tests/backtest/support.py),
never copied from the backtest's output.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import PrometheusServer, free_port
from kubernetes import config

from canary.backtest.history import HistoryError, read_history
from canary.backtest.replay import replay_period
from canary.backtest.runner import HONESTY, BacktestOptions, run_backtest
from canary.kserve.store import ROLLOUTS_KEY, ConfigMapStateStore
from canary.metrics.client import PrometheusClient, PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.retrying import RetryPolicy
from canary.rollout.past import PastRollout, PastRollouts, RolloutOutcome, StepRecord, rollout_id
from tests.backtest.support import (
    END,
    GAP,
    HASHED_NAME,
    HEALTHY,
    LEGACY,
    LONG_NAME,
    REGRESSION,
    SCRAPE,
    T0,
    WITH_GAP,
    Expected,
    expected_story,
    first_served,
    last_shared,
    policy_for,
    when,
    write_policy,
)
from tests.cli.support import invoke

pytestmark = pytest.mark.integration


def backtest(prometheus: PrometheusServer, policy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return invoke(
        "backtest",
        str(policy),
        "--from",
        when(T0).isoformat(),
        "--to",
        when(END).isoformat(),
        "--prometheus-url",
        prometheus.url,
        "--scrape-interval",
        f"{SCRAPE:g}",
        *args,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def writes(rollout: dict[str, Any]) -> list[Expected]:
    """The policy's writes after the first step, as the backtest reports them."""
    story = []
    for evaluation in rollout["evaluations"]:
        if evaluation["action"] in ("advance", "promote", "rollback"):
            moment = evaluation["at"].replace("Z", "+00:00")
            story.append(Expected(evaluation["action"], _epoch(moment), evaluation["policyWeight"]))
    return story


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_the_regression_is_rolled_back_at_the_first_evaluation_where_its_error_rate_is_significant(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    expected = expected_story(REGRESSION, policy_for(REGRESSION))
    assert [e.action for e in expected] == ["rollback"]  # the data make the fail test reject in step 1
    rollback = expected[0].at

    document = as_json(backtest(prometheus, write_policy(tmp_path, REGRESSION), "--format", "json"))

    assert document["note"] == HONESTY
    [rollout] = document["rollouts"]
    assert (rollout["canary"], rollout["stable"]) == (REGRESSION.canary_name, REGRESSION.stable_name)
    assert rollout["servedFrom"] == when(first_served(REGRESSION)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert rollout["actualOutcome"] == "canary-took-over"  # what happened: it went to 100% anyway
    assert rollout["policyOutcome"] == "rolled-back"
    assert writes(rollout) == expected
    assert rollout["policyDecidedAt"] == when(rollback).strftime("%Y-%m-%dT%H:%M:%SZ")
    # The period's end is read from rates over two scrape intervals: at most one scrape after the last
    # scrape in which both revisions counted requests.
    ended = rollout["servedUntil"]
    assert 0 <= _epoch(ended.replace("Z", "+00:00")) - last_shared(REGRESSION) <= SCRAPE
    assert rollout["comparison"].startswith("The policy would have rolled back a release that was promoted: ")
    assert f"went on to serve alone after {ended}" in rollout["comparison"]
    # The evaluation that rolled back shows the errors check failing with its numbers, and the
    # canary's share as it actually was then (about 10%), not the policy's 0%.
    last = rollout["evaluations"][-1]
    errors = next(check for check in last["checks"] if check["name"] == "errors")
    assert errors["verdict"] == "fail"
    assert errors["value"] > 0.02
    assert 5 <= last["actualSharePercent"] <= 15
    assert last["policyWeight"] == 0
    # Every evaluation before it was not a failure.
    earlier = [e for e in rollout["evaluations"] if e["verdict"] is not None][:-1]
    assert earlier and all(e["verdict"] != "fail" for e in earlier)


def test_the_same_regression_in_knative_opencensus_metrics_gets_the_same_answer(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    expected = expected_story(LEGACY, policy_for(LEGACY))

    document = as_json(backtest(prometheus, write_policy(tmp_path, LEGACY), "--format", "json"))

    assert document["history"]["requestsProfile"] == "knative-opencensus"
    [rollout] = document["rollouts"]
    assert (rollout["canary"], rollout["stable"]) == (LEGACY.canary_name, LEGACY.stable_name)
    assert writes(rollout) == expected == [Expected("rollback", expected[0].at, 0)]


def test_a_healthy_rollout_advances_and_promotes_where_the_data_and_the_policy_say(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    policy = policy_for(HEALTHY)
    expected = expected_story(HEALTHY, policy)
    assert [e.action for e in expected] == ["advance", "advance", "promote"]
    first = first_served(HEALTHY)
    # Advance on exposure: each of the two lower steps is left one window after it started.
    assert expected[0].at == first + policy.spec.window
    assert expected[1].at == expected[0].at + policy.spec.window

    document = as_json(backtest(prometheus, write_policy(tmp_path, HEALTHY), "--format", "json"))

    [rollout] = document["rollouts"]
    assert rollout["policyOutcome"] == "promoted"
    assert writes(rollout) == expected
    assert document["history"]["controllerWeight"] is True
    # The actual split is the controller's recorded weight: the steps it really held.
    assert "10% → 30% → 50%" in rollout["actual"]
    assert rollout["actualOutcome"] == "canary-took-over"


def test_what_if_a_shorter_window_changes_when_the_policy_would_have_moved(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    shorter = policy_for(HEALTHY, window="2m")
    expected = expected_story(HEALTHY, shorter)
    assert expected[0] == Expected("advance", first_served(HEALTHY) + 120, 30)

    document = as_json(
        backtest(prometheus, write_policy(tmp_path, HEALTHY), "--format", "json", "--what-if", "window=2m")
    )

    assert document["whatIf"] == ["window=2m"]
    [rollout] = document["rollouts"]
    assert writes(rollout) == expected
    # It judged the shares that really served: 10% while the policy already held 30%.
    after = [e for e in rollout["evaluations"] if e["policyWeight"] == 30 and e["verdict"] is not None]
    assert after and after[0]["actualSharePercent"] < 20


def test_a_bad_what_if_is_refused_with_the_override_the_field_and_the_reason(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    bad_value = backtest(prometheus, write_policy(tmp_path, HEALTHY), "--what-if", "window=soon")

    assert bad_value.returncode == 1
    assert bad_value.stdout == ""
    assert bad_value.stderr.startswith("--what-if window=soon: spec.window: ")


def test_missing_data_is_reported_as_missing_never_filled(prometheus: PrometheusServer) -> None:
    result = run_backtest(
        policy_for(WITH_GAP),
        BacktestOptions(PrometheusConfig(url=prometheus.url), when(T0), when(END), scrape_interval=SCRAPE),
    )

    [replay] = result.replays
    # A point is missing where the rate's window (two scrapes) holds fewer than two recorded samples.
    window = 2 * SCRAPE
    expected_missing = {
        point.at
        for point in result.history.points
        if sum(
            1
            for s in WITH_GAP.ticks
            if WITH_GAP.recorded(s) and point.at.timestamp() - window <= s <= point.at.timestamp()
        )
        < 2
    }
    assert {point.at for point in result.history.points if point.missing} == expected_missing
    inside = {point.at for point in result.history.points if GAP[0] < point.at.timestamp() <= GAP[1]}
    assert inside and inside <= expected_missing
    assert replay.period.missing_steps == len(
        expected_missing & {p.at for p in result.history.between(replay.period.start, replay.period.end)}
    )
    in_gap = [tick for tick in replay.ticks if GAP[0] < tick.at.timestamp() < GAP[1]]
    assert in_gap and all(tick.missing and tick.actual_share is None for tick in in_gap)
    assert f"{replay.period.missing_steps} step(s) without any sample (missing, not filled)" in replay.actual


def test_the_table_and_the_html_report_say_what_the_replay_cannot_do(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path, REGRESSION)
    page = tmp_path / "backtest.html"

    table = backtest(prometheus, policy)
    html = backtest(prometheus, policy, "--format", "html", "--output", str(page))

    assert table.returncode == 0, table.stderr
    flat = " ".join(table.stdout.split())
    assert " ".join(HONESTY.split()) in flat
    assert f"policy: The policy would have rolled back {REGRESSION.canary_name}" in flat
    assert "rollback" in flat and "✗" in flat
    assert html.returncode == 0, html.stderr
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "<svg" in text
    assert "would have rolled back" in text and "A replay cannot move traffic" in text
    assert last_shared(REGRESSION) > first_served(REGRESSION)


def test_prometheus_unreachable_exits_3_with_one_line(tmp_path: Path) -> None:
    result = invoke(
        "backtest", str(write_policy(tmp_path, HEALTHY)), "--from", when(T0).isoformat(),
        "--to", when(END).isoformat(), "--prometheus-url", f"http://127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert result.returncode == 3
    assert result.stdout == ""
    assert "Prometheus" in result.stderr and "Traceback" not in result.stderr


def test_rollout_reads_the_controllers_record_and_replays_that_rollout(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    first = first_served(HEALTHY)
    policy = policy_for(HEALTHY)
    recorded = PastRollout(
        id=rollout_id(HEALTHY.canary_name, when(first - 30)),
        revision=HEALTHY.canary_name,
        stable_revision=HEALTHY.stable_name,
        outcome=RolloutOutcome.PROMOTED,
        started_at=when(first - 30),
        ended_at=when(T0 + 21 * 60),
        reason="Promoting: its last step 50% passed",
        steps=(
            StepRecord(0, 10, when(first - 30), when(T0 + 9 * 60)),
            StepRecord(1, 30, when(T0 + 9 * 60), when(T0 + 13 * 60)),
            StepRecord(2, 50, when(T0 + 13 * 60), when(T0 + 21 * 60)),
        ),
    )
    other = PastRollout(
        id=rollout_id(f"{HEALTHY.inference_service}-predictor-00009", when(T0 - 3600)),
        revision=f"{HEALTHY.inference_service}-predictor-00009",
        outcome=RolloutOutcome.ROLLED_BACK,
        started_at=when(T0 - 3600),
        ended_at=when(T0 - 3000),
    )
    ghost = PastRollout(  # recorded, but Prometheus has no requests of that revision then
        id=rollout_id(f"{HEALTHY.inference_service}-predictor-00007", when(T0 + 60)),
        revision=f"{HEALTHY.inference_service}-predictor-00007",
        outcome=RolloutOutcome.ABORTED,
        started_at=when(T0 + 60),
        ended_at=when(T0 + 240),
    )
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace(HEALTHY.namespace)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        ConfigMapStateStore(api).save_files(
            HEALTHY.namespace,
            HEALTHY.inference_service,
            {ROLLOUTS_KEY: PastRollouts((other, ghost, recorded)).to_json()},
            resource_version=None,
            owner_uid=None,
        )
        path = write_policy(tmp_path, HEALTHY)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return invoke(
                "backtest", str(path), "--kubeconfig", str(kubeconfig),
                "--prometheus-url", prometheus.url, "--scrape-interval", f"{SCRAPE:g}", *args,
            )  # fmt: skip

        latest = run("--rollout", "1", "--format", "json")
        missing = run("--rollout", "4")
        no_period = run("--rollout", ghost.id)

    document = as_json(latest)
    # No --from/--to: the range is the recorded rollout's, with a margin.
    assert _epoch(document["from"].replace("Z", "+00:00")) < first - 30 < T0 + 21 * 60
    assert _epoch(document["to"].replace("Z", "+00:00")) > T0 + 21 * 60
    [rollout] = document["rollouts"]
    assert rollout["canary"] == recorded.revision
    assert rollout["recorded"].startswith("recorded by the controller: promoted at ")
    assert "10% at " in rollout["recorded"] and "50% at " in rollout["recorded"]
    assert writes(rollout) == expected_story(HEALTHY, policy)
    assert missing.returncode == 1
    assert (
        f"the controller's record of {HEALTHY.namespace}/{HEALTHY.inference_service} has no such rollout"
        in (missing.stderr)
    )
    assert recorded.id in missing.stderr and other.id in missing.stderr
    assert no_period.returncode == 1
    assert f"Prometheus shows no period in which {ghost.revision} served" in no_period.stderr


def test_gates_are_not_replayed_and_the_output_says_so(prometheus: PrometheusServer) -> None:
    gate = {"at": "pre-rollout", "webhook": {"urlFrom": {"env": "SMOKE_URL"}}, "deadline": "5m"}
    options = BacktestOptions(
        PrometheusConfig(url=prometheus.url), when(T0), when(END), scrape_interval=SCRAPE
    )

    gated = run_backtest(policy_for(REGRESSION, gates=[gate]), options)

    assert gated.notes == ("1 gate(s) of the policy are not replayed: the replay calls no webhook.",)
    [replay] = gated.replays
    # Without its gate the policy decides as the ungated one does, on the same recorded counts.
    [expected] = expected_story(REGRESSION, policy_for(REGRESSION))
    assert (replay.outcome, replay.decided_at) == ("rolled-back", when(expected.at))


def test_rollout_without_a_cluster_chooses_among_the_periods_prometheus_shows(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # no ~/.kube/config there, and no KUBECONFIG
    home.mkdir()
    path = write_policy(tmp_path, HEALTHY)
    arguments = ["backtest", str(path), "--prometheus-url", prometheus.url,
                 "--scrape-interval", f"{SCRAPE:g}", "--rollout", HEALTHY.canary_name]  # fmt: skip

    ranged = invoke(
        *arguments,
        "--from",
        when(T0).isoformat(),
        "--to",
        when(END).isoformat(),
        "--format",
        "json",
        home=home,
    )
    unranged = invoke(*arguments, home=home)

    document = as_json(ranged)
    assert [rollout["canary"] for rollout in document["rollouts"]] == [HEALTHY.canary_name]
    assert any(
        note.startswith("No kubeconfig: the rollout was chosen among the periods")
        for note in document["notes"]
    )
    assert unranged.returncode == 3
    assert "no kubeconfig to read the controller's record of past rollouts with" in unranged.stderr


def test_without_auto_start_the_first_step_comes_with_the_spec_and_the_story_is_the_same(
    prometheus: PrometheusServer,
) -> None:
    options = BacktestOptions(
        PrometheusConfig(url=prometheus.url), when(T0), when(END), scrape_interval=SCRAPE
    )

    result = run_backtest(policy_for(HEALTHY, autoStart=False), options)

    [replay] = result.replays
    assert replay.outcome == "promoted"
    # No start is written (Git carried 10%); every later write is where the data and the policy say.
    expected = expected_story(HEALTHY, policy_for(HEALTHY))
    assert [(when(e.at), e.weight) for e in expected] == list(replay.weights)


def test_prometheus_failing_during_the_replay_holds_it_and_says_so(prometheus: PrometheusServer) -> None:
    policy = policy_for(REGRESSION)
    client = PrometheusClient(PrometheusConfig(url=prometheus.url))
    history = read_history(client, policy, when(T0), when(END), scrape_interval=SCRAPE)
    client.close()
    [period] = history.periods
    # The evidence source asks a Prometheus that is not there: every evaluation is an error.
    gone = PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1.0, retry=RetryPolicy(attempts=1))
    with PrometheusEvidenceSource(gone, scrape_interval=policy.spec.interval) as source:
        replay = replay_period(policy, history, period, source)

    # The regression the real data roll back is neither rolled back nor promoted on errors.
    assert replay.outcome == "undecided"
    assert not [weight for _, weight in replay.weights if weight != policy.spec.canary_steps[0].weight]
    evaluated = [tick for tick in replay.ticks if tick.checks]
    assert evaluated and all(check.verdict == "error" for tick in evaluated for check in tick.checks)
    assert f"({len(evaluated)} of {len(evaluated)} evaluations had a check Prometheus could not answer" in (
        replay.summary
    )


def test_a_31_character_inference_services_revisions_are_read_from_their_pod_names(
    prometheus: PrometheusServer,
) -> None:
    # Its pods are "<revision>-deploymentxxxxx": "(.+)-deployment-.+" found no revision at all.
    client = PrometheusClient(PrometheusConfig(url=prometheus.url))
    history = read_history(client, policy_for(LONG_NAME), when(T0), when(END), scrape_interval=SCRAPE)
    client.close()
    assert set(history.revisions) == {LONG_NAME.stable_name, LONG_NAME.canary_name}
    [period] = history.periods
    assert (period.stable, period.canary) == (LONG_NAME.stable_name, LONG_NAME.canary_name)


def test_a_37_character_inference_service_without_a_revision_label_is_refused_with_the_remedy(
    prometheus: PrometheusServer,
) -> None:
    client = PrometheusClient(PrometheusConfig(url=prometheus.url))
    with pytest.raises(HistoryError, match=r"md5.*spec\.metrics\.revisionLabel"):
        read_history(client, policy_for(HASHED_NAME), when(T0), when(END), scrape_interval=SCRAPE)
    client.close()
