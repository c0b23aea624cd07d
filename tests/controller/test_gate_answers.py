"""A gate fails closed (issue #34, finding 9): it passes only on a whole 2xx answer within its
``webhook.timeout``. An answer dribbled past the timeout, one larger than a gate's answer can be, one
cut short or redirected is a failed attempt — and the attempt ends at the timeout, not when the
receiver lets go. The gate runner against a real loopback server scripted byte by byte."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from canary.controller.gates import GateRunner
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.urls import UrlGuard
from canary.policy.model import PromotionPolicy
from canary.rollout.gates import GateCall, GateResult
from tests.loopback import Exchange, MiB, loopback
from tests.rollout.helpers import make_policy
from tests.rollout.test_gates import always, started

TIMEOUT = 1.0  # the gate's webhook.timeout, seconds


def _policy() -> PromotionPolicy:
    webhook = {"urlFrom": {"env": "GATE_URL"}, "timeout": f"{TIMEOUT:g}s"}
    return make_policy(gates=[{"name": "smoke", "at": "pre-rollout", "webhook": webhook}])


def _call(policy: PromotionPolicy) -> GateCall:
    harness = started(policy, always(True))
    harness.sim.make_ready()
    harness.sim.reconcile()
    (call,) = harness.tick(10).gate_calls
    return call


def _attempt(script: Callable[[Exchange], None]) -> GateResult:
    policy = _policy()
    call = _call(policy)
    done = threading.Event()
    with loopback(script) as server:
        resolver = SecretResolver(
            Redactor(),
            {"GATE_URL": f"{server.url}/gate?token=s3cr3t"},
            url_guard=UrlGuard.allowing(("127.0.0.1",)),
        )
        gates = GateRunner(resolver_for=lambda _: resolver, on_done=lambda _: done.set())
        try:
            gates.submit(policy, [call])
            assert done.wait(15), "the attempt finished"
            (result,) = gates.results(call.policy_key)
        finally:
            gates.close()
    return result


def _dribbled(exchange: Exchange) -> None:
    exchange.head(200, {"Content-Type": "text/plain"})  # no length: the answer ends at the close
    exchange.trickle(b"passed" * 5, 0.1)  # 3 s, a byte each 0.1 s: no single read ever times out


def _oversized(exchange: Exchange) -> None:
    exchange.head(200, {"Content-Length": str(64 * MiB)})
    exchange.stream(64 * MiB)


def _cut(exchange: Exchange) -> None:
    exchange.head(200, {"Content-Length": "100"})
    exchange.write(b"passed")  # then the receiver closes, 94 bytes short


def _redirected(exchange: Exchange) -> None:
    exchange.head(307, {"Location": "http://127.0.0.1:9/pass"})


@pytest.mark.parametrize(
    ("script", "status", "says"),
    [
        (_dribbled, 200, f"HTTP 200 OK from http://127.0.0.1: no complete answer within {TIMEOUT:g}s"),
        (_oversized, 200, "HTTP 200 OK from http://127.0.0.1: an answer larger than 4 KiB"),
        (_cut, 200, "HTTP 200 OK from http://127.0.0.1: the answer was cut short"),
        (_redirected, 307, "HTTP 307 Temporary Redirect from http://127.0.0.1: redirect not followed"),
    ],
    ids=["dribbled-past-the-timeout", "oversized", "cut-short", "redirected"],
)
def test_a_gate_fails_closed_unless_its_whole_answer_arrives_in_time(
    script: Callable[[Exchange], None], status: int, says: str
) -> None:
    result = _attempt(script)
    assert not result.passed, f"gate passed on: {result.detail}"
    assert result.status == status
    assert result.detail == f"gate smoke (env GATE_URL): {says}"
    assert result.seconds < TIMEOUT + 1.0, f"the attempt was held {result.seconds:.1f}s"


def test_a_whole_answer_within_the_timeout_passes() -> None:
    def whole(exchange: Exchange) -> None:
        exchange.head(200, {"Content-Length": "6"})
        exchange.write(b"passed")

    result = _attempt(whole)
    assert (result.passed, result.status, result.detail) == (True, 200, "HTTP 200")
