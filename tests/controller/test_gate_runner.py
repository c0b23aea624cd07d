"""The gate runner (canary.controller.gates) against the example receiver (examples/gate_receiver.py)
running as its own process, over real HTTP: signed calls pass, a wrong key is refused, retries are
spaced, a missing secret fails without its value, and the URL guard applies to gates as it does to
notifications. The calls are the ones the pure core asks for."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from canary.controller.gates import GateRunner
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.urls import UrlGuard
from canary.rollout.gates import GateCall, GateResult
from tests.rollout.test_gates import PRE, always, started

ROOT = Path(__file__).resolve().parents[2]
KEY = "example-gate-key-0123456789"


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "gate_receiver.py"), "--port", "0"],
        env={"GATE_KEY": KEY, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", first)
    assert found, first
    yield found.group(1), process
    process.terminate()
    process.wait(timeout=10)


def pre_rollout_call() -> GateCall:
    harness = started(PRE, always(True))
    harness.sim.make_ready()
    harness.sim.reconcile()
    calls = harness.tick(10).gate_calls
    assert len(calls) == 1
    return calls[0]


class Finished:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.event = threading.Event()

    def __call__(self, key: str) -> None:
        self.keys.append(key)
        self.event.set()


def runner(
    url: str, key: str | None, done: Finished, *, allow: tuple[str, ...] = ("127.0.0.1",)
) -> GateRunner:
    environ = {"GATE_URL": f"{url}/gate?token=s3cr3t-t0ken", **({"GATE_KEY": key} if key else {})}
    resolver = SecretResolver(Redactor(), environ, url_guard=UrlGuard.allowing(allow))
    return GateRunner(resolver_for=lambda policy: resolver, on_done=done)


def result_of(gates: GateRunner, done: Finished, call: GateCall) -> GateResult:
    assert done.event.wait(15), "the attempt finished"
    done.event.clear()
    (result,) = gates.results(call.policy_key)
    return result


def test_a_signed_call_passes_and_the_receiver_sees_a_gate_request(
    receiver: tuple[str, subprocess.Popen[str]],
) -> None:
    url, process = receiver
    call, done = pre_rollout_call(), Finished()
    gates = runner(url, KEY, done)
    try:
        assert gates.submit(PRE, [call]) == 1
        result = result_of(gates, done, call)
    finally:
        gates.close()
    assert (result.passed, result.status, result.key, result.revision) == (True, 200, call.key, call.revision)
    assert done.keys == [call.policy_key], "the rollout is asked to decide again"
    assert process.stdout is not None
    printed = process.stdout.readline()
    assert printed.startswith(
        "gate smoke (pre-rollout, before the first step) for llama-predictor-00002: pass"
    )
    assert call.id in printed


def test_a_wrong_key_is_refused_retries_are_spaced_and_nothing_secret_is_kept(
    receiver: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = receiver
    call, done = pre_rollout_call(), Finished()
    gates = runner(url, "not-the-key-0123456789", done)
    try:
        gates.submit(PRE, [call])
        refused = result_of(gates, done, call)
        assert gates.submit(PRE, [call]) == 0, "the next attempt waits for its backoff"
        time.sleep(2.2)
        assert gates.submit(PRE, [call]) == 1
        again = result_of(gates, done, call)
    finally:
        gates.close()
    assert (refused.passed, refused.status) == (False, 401)
    assert refused.detail == "gate smoke (env GATE_URL): HTTP 401 Unauthorized from http://127.0.0.1"
    assert again.at > refused.at
    assert "s3cr3t" not in refused.detail and "not-the-key" not in refused.detail


def test_a_missing_key_or_a_refused_url_fails_the_attempt_saying_which_reference(
    receiver: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = receiver
    call = pre_rollout_call()
    done = Finished()
    gates = runner(url, None, done)
    try:
        gates.submit(PRE, [call])
        missing = result_of(gates, done, call)
    finally:
        gates.close()
    assert (missing.passed, missing.status, missing.detail) == (False, None, "env GATE_KEY is not set")
    done = Finished()
    guarded = runner(url, KEY, done, allow=())
    try:
        guarded.submit(PRE, [call])
        refused = result_of(guarded, done, call)
    finally:
        guarded.close()
    assert not refused.passed and "URL refused" in refused.detail and "s3cr3t" not in refused.detail


def test_results_are_kept_per_rollout_and_forgotten_with_it(
    receiver: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = receiver
    call, done = pre_rollout_call(), Finished()
    gates = runner(url, KEY, done)
    try:
        gates.submit(PRE, [call])
        result_of(gates, done, call)
        assert gates.results("ml/other") == ()
        assert gates.submit(PRE, [call]) == 0, "passed: nothing more to call"
        gates.forget(call.policy_key)
        assert gates.results(call.policy_key) == ()
    finally:
        gates.close()
    assert gates.submit(PRE, [call]) == 0, "closed"
