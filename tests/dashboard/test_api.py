"""The dashboard's JSON API and its guards, over real HTTP against the API emulator (issue 15, item 7)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
import requests
from canary_sandbox.prometheus import free_port
from kubernetes import client

from canary.dashboard.server import TOKEN_HEADER, Dashboard
from canary.policy.units import Unit
from canary.report.rollout import limit_values
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.state import Phase
from tests.cli.support import interrupt_and_wait, popen_with_ctrl_c
from tests.dashboard.conftest import CANARY, Api, Controller, World, start_dashboard


def raw(board: Dashboard, method: str, path: str, **headers: str) -> requests.Response:
    """A request with exactly these headers (no token unless given)."""
    return requests.request(method, board.origin + path, headers=headers, timeout=30, allow_redirects=False)


# -- the token ------------------------------------------------------------------------------------


def test_the_page_needs_the_token_and_trades_it_for_a_cookie(world: World, dashboard: Dashboard) -> None:
    assert dashboard.url == f"http://127.0.0.1:{dashboard.port}/?token={dashboard.token}"
    assert len(dashboard.token) >= 43  # token_urlsafe(32)
    assert raw(dashboard, "GET", "/").status_code == 401
    assert raw(dashboard, "GET", "/?token=wrong").status_code == 401
    assert raw(dashboard, "GET", "/static/app.js").status_code == 401
    opened = raw(dashboard, "GET", f"/?token={dashboard.token}")
    assert opened.status_code == 303
    assert opened.headers["Location"] == "/"
    cookie = opened.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    name = f"kserve_canary_dashboard_{dashboard.port}"
    page = raw(dashboard, "GET", "/", Cookie=f"{name}={dashboard.token}")
    assert page.status_code == 200
    assert f'<meta name="dashboard-token" content="{dashboard.token}">' in page.text
    assert raw(dashboard, "GET", "/static/app.js", Cookie=f"{name}={dashboard.token}").status_code == 200
    assert raw(dashboard, "GET", "/", Cookie=f"{name}=wrong").status_code == 401
    for response in (page, opened):
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert response.headers["X-Frame-Options"] == "DENY"
        assert not [header for header in response.headers if header.lower().startswith("access-control-")]


def test_the_api_takes_the_token_only_from_its_header(world: World, dashboard: Dashboard) -> None:
    world.start_rollout()
    name = f"kserve_canary_dashboard_{dashboard.port}"
    assert raw(dashboard, "GET", "/api/rollouts").status_code == 401
    # The cookie is sent by every page of this host, whatever its port: it is no proof for the API.
    assert raw(dashboard, "GET", "/api/rollouts", Cookie=f"{name}={dashboard.token}").status_code == 401
    assert (
        raw(dashboard, "GET", "/api/rollouts", **{TOKEN_HEADER: dashboard.token[:-1] + "x"}).status_code
        == 401
    )
    listed = Api(dashboard).get("/api/rollouts")
    assert listed.status_code == 200
    (row,) = listed.json()["rollouts"]
    assert (row["namespace"], row["name"], row["phase"], row["revision"]) == (
        "ml",
        "llama",
        "Progressing",
        CANARY,
    )
    assert row["stableRevision"] == "llama-predictor-00001"
    assert row["step"]["index"] == 0
    assert row["lastDecision"]["action"] == "wait"
    assert row["lastDecision"]["reason"].startswith(f"Step 1 of 3 (10%) of {CANARY} started")


def test_a_wrong_host_is_refused(world: World, dashboard: Dashboard) -> None:
    token = {TOKEN_HEADER: dashboard.token}
    port = dashboard.port
    for host in (
        f"evil.example:{port}",
        "127.0.0.1",
        f"127.0.0.1:{port + 1}",
        f"localhost.evil.example:{port}",
    ):
        refused = raw(dashboard, "GET", "/api/rollouts", Host=host, **token)
        assert refused.status_code == 403, host
        assert "Host" in refused.json()["error"]
        assert raw(dashboard, "GET", f"/?token={dashboard.token}", Host=host).status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        assert raw(dashboard, "GET", "/api/rollouts", Host=host, **token).status_code == 200, host


def test_a_post_from_elsewhere_or_without_the_guards_changes_nothing(
    world: World, dashboard: Dashboard
) -> None:
    state = world.start_rollout()
    before = world.stored()
    path = "/api/rollouts/ml/llama/pause"
    json_type = {"Content-Type": "application/json"}
    token = {TOKEN_HEADER: dashboard.token}
    attempts = {
        "no token": ({**json_type, "Origin": dashboard.origin}, 401),
        "another origin": ({**json_type, **token, "Origin": f"http://127.0.0.1:{dashboard.port + 1}"}, 403),
        "a rebinding origin": (
            {**json_type, **token, "Origin": f"http://evil.example:{dashboard.port}"},
            403,
        ),
        "a null origin": ({**json_type, **token, "Origin": "null"}, 403),
        "a form's content type": ({"Content-Type": "text/plain", **token}, 415),
        "a form's urlencoded body": ({"Content-Type": "application/x-www-form-urlencoded", **token}, 415),
        "a cross-site fetch": ({**json_type, **token, "Sec-Fetch-Site": "cross-site"}, 403),
        "a same-site fetch from another port": ({**json_type, **token, "Sec-Fetch-Site": "same-site"}, 403),
    }
    for what, (headers, status) in attempts.items():
        response = requests.post(dashboard.origin + path, data="{}", headers=headers, timeout=30)
        assert response.status_code == status, what
    # A CORS preflight gets no Access-Control-* answer, so a browser never sends the real request.
    preflight = raw(
        dashboard,
        "OPTIONS",
        path,
        Origin="http://127.0.0.1:1",
        **{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": TOKEN_HEADER},
    )
    assert preflight.status_code == 405
    assert not [header for header in preflight.headers if header.lower().startswith("access-control-")]
    # Actions are POSTs only.
    assert Api(dashboard).get(path).status_code == 404
    after = world.stored()
    assert after.resource_version == before.resource_version
    assert after.command_json is None
    assert after.state().phase is state.phase is Phase.PROGRESSING


# -- actions --------------------------------------------------------------------------------------


def test_an_action_is_the_clis_command_and_returns_the_controllers_answer(
    world: World, dashboard: Dashboard
) -> None:
    state = world.start_rollout()
    assert state.step is not None
    api = Api(dashboard)
    with Controller(world):
        answer = api.post(
            "/api/rollouts/ml/llama/pause",
            {"revision": CANARY, "step": state.step.index, "reason": "look first"},
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["outcome"], body["decidedBy"]) == ("accepted", "controller")
    assert body["message"] == f"rollout of {CANARY} paused"
    stored = world.stored()
    assert stored.state().phase is Phase.PAUSED
    # Issued with the user's kubeconfig identity, as the API server names it (SelfSubjectReview).
    result = stored.command_result()
    assert result is not None and result.id == body["commandId"] and result.accepted
    assert result.by == "kubernetes-admin" == body["by"]
    assert "(by kubernetes-admin)" in stored.state().history[-1].reason
    detail = api.get("/api/rollouts/ml/llama").json()
    assert detail["phase"] == "Paused"
    assert detail["lastCommandResult"]["message"] == f"rollout of {CANARY} paused"
    assert detail["decisions"][0]["action"] == "command:pause"


def test_refused_actions_say_why_and_who_refused(world: World) -> None:
    state = world.start_rollout()
    assert state.step is not None
    board = start_dashboard(world, command_wait=1.5)
    api = Api(board)
    seen = {"revision": CANARY, "step": state.step.index}
    try:
        # Impossible now: refused at once by the core's rules, nothing written.
        resume = api.post("/api/rollouts/ml/llama/resume", seen)
        assert resume.status_code == 409
        assert resume.json() | {"commandId": None} == {
            "outcome": "refused",
            "decidedBy": "dashboard",
            "message": "resume of ml/llama refused: the rollout is not paused (phase Progressing)",
            "commandId": None,
            "by": None,
        }
        # The page showed another step than the rollout holds now: the click meant something else.
        moved = api.post("/api/rollouts/ml/llama/promote", {"revision": CANARY, "step": state.step.index + 1})
        assert moved.status_code == 409
        assert "the page showed step 2" in moved.json()["message"]
        assert world.stored().command_json is None
        # The controller's refusal: its clock is two hours ahead, so to it the command is expired.
        world.clock.offset = timedelta(hours=2)
        with Controller(world):
            expired = api.post("/api/rollouts/ml/llama/pause", seen)
        assert expired.status_code == 409
        assert expired.json()["decidedBy"] == "controller"
        assert "expired, refused" in expired.json()["message"]
        assert world.stored().state().phase is Phase.PROGRESSING
        # No controller: the command waits, and the answer says so instead of claiming success.
        waiting = api.post("/api/rollouts/ml/llama/pause", seen)
        assert waiting.status_code == 202
        assert waiting.json()["outcome"] == "no-answer"
        assert "no answer from the controller within 1.5 s" in waiting.json()["message"]
        assert world.stored().command() is not None
        # ... and a second command does not replace it.
        second = api.post("/api/rollouts/ml/llama/abort", seen)
        assert second.status_code == 409
        assert "pause by kubernetes-admin" in second.json()["message"]
        # The user's own RBAC: the API server forbids the write, and its words reach the page.
        world.clock.offset = timedelta()
        with Controller(world):
            world.reconcile()  # consumes the waiting pause
        world.emulator.faults.add_from_json({
            "method": "PATCH",
            "path": "/api/v1/namespaces/ml/configmaps/kserve-canary-llama",
            "status": 403,
            "message": 'configmaps "kserve-canary-llama" is forbidden: User "viewer" cannot patch resource',
        })  # fmt: skip
        state = world.stored().state()
        assert state.step is not None
        forbidden = api.post(
            "/api/rollouts/ml/llama/resume"
            if state.phase is Phase.PAUSED
            else "/api/rollouts/ml/llama/pause",
            {"revision": CANARY, "step": state.step.index},
        )
        assert forbidden.status_code == 409, forbidden.text
        assert forbidden.json()["decidedBy"] == "api-server"
        assert "403" in forbidden.json()["message"]
        assert "cannot patch resource" in forbidden.json()["message"]
        # Unknown actions and rollouts.
        assert api.post("/api/rollouts/ml/llama/delete", seen).status_code == 404
        ghost = api.post("/api/rollouts/ml/ghost/pause")
        assert ghost.status_code == 409, (ghost.status_code, ghost.text, ghost.headers)
        assert ghost.json()["message"] == ("no rollout state for ml/ghost: kserve-canary has not seen it")
        assert api.post("/api/rollouts/ml/llama/pause", {"step": "one"}).status_code == 400
    finally:
        board.stop()


def test_a_namespace_outside_the_list_is_not_served(world: World) -> None:
    world.start_rollout()
    board = start_dashboard(world, namespaces=["other"])
    try:
        api = Api(board)
        assert api.get("/api/rollouts").json()["rollouts"] == []
        assert api.get("/api/rollouts/ml/llama").status_code == 404
        assert api.post("/api/rollouts/ml/llama/pause").status_code == 404
        assert world.stored().command_json is None
    finally:
        board.stop()


def test_configmaps_labelled_as_ours_that_the_controller_did_not_write_are_not_rollouts(world: World) -> None:
    """A namespace editor can label any ConfigMap as the controller's (docs/security.md, 2.): the
    dashboard lists as the controller does, in bounded pages and only what it wrote, so a forged
    state is not shown and a large one is not read whole."""
    world.start_rollout()
    core = client.CoreV1Api(world.api)
    labels = {"app.kubernetes.io/managed-by": "kserve-canary"}
    forged = {"state.json": '{"phase": "Succeeded", "revision": "forged-00001"}'}
    core.create_namespaced_config_map(
        "ml", {"metadata": {"name": "forged", "labels": labels}, "data": forged}
    )
    large = {"state.json": "{" + "x" * 900_000 + "}"}
    core.create_namespaced_config_map("ml", {"metadata": {"name": "large", "labels": labels}, "data": large})
    board = start_dashboard(world)
    try:
        rows = Api(board).get("/api/rollouts").json()["rollouts"]
    finally:
        board.stop()
    assert [(row["namespace"], row["name"]) for row in rows] == [("ml", "llama")], rows


# -- the detail: decisions, checks against limits, traffic, Prometheus ---------------------------------


def _explain(world: World) -> ExplainDocument:
    stored = world.stored()
    state = stored.state()
    document = ExplainDocument(
        at=datetime.now(UTC),
        decision_id="d-1",
        revision=state.revision,
        stable_revision=state.stable_revision,
        action="wait",
        verdict="pass",
        requests=1234.0,
        reasons=("All checks pass.",),
        checks=(
            ExplainCheck(
                "p99-latency",
                "pass",
                0.55,
                Unit.SECONDS,
                "≤ 800ms and ≤ +20% vs stable",
                0.5,
                1234.0,
                detail="550ms ≤ 800ms",
                query=f'histogram_quantile(0.99, sum by (namespace, revision, le) (x{{revision=~"{state.revision}"}}))',
                canary_query=f'histogram_quantile(0.99, sum by (le) (x{{revision="{state.revision}"}}))',
            ),
            ExplainCheck("error-rate", "pass", 0.002, Unit.RATIO, "≤ 1%", 0.001, 1234.0, detail="0.2% ≤ 1%"),
        ),
    )
    world.store.save_files(
        "ml",
        "llama",
        {"state.json": stored.state_json or "", "explain.json": document.to_json()},
        resource_version=stored.resource_version,
        owner_uid=stored.owner_uid,
    )
    return document


def test_the_detail_has_the_decisions_the_checks_against_their_limits_and_the_traffic(
    world: World, dashboard: Dashboard
) -> None:
    world.start_rollout()
    _explain(world)
    detail = Api(dashboard).get("/api/rollouts/ml/llama").json()
    assert [decision["action"] for decision in detail["decisions"]][:2] == ["wait", "start"]
    assert detail["decisions"][1]["weight"] == 10
    assert detail["decisions"][1]["reason"].startswith(f"Starting the rollout of {CANARY}")
    p99, errors = detail["explain"]["checks"]
    assert (p99["name"], p99["value"], p99["limit"], p99["stable"]) == (
        "p99-latency",
        "550ms",
        "≤ 800ms and ≤ +20% vs stable",
        "500ms",
    )
    assert errors["value"] == "0.2%"
    charts = detail["charts"]
    (traffic,) = charts["traffic"]["series"]
    assert [value for _, value in traffic["points"]] == [0.0, 10.0, 10.0]
    assert charts["markers"][0]["action"] == "started"
    latency, error_rate = charts["checks"]
    assert latency["unit"] == "ms"
    assert [round(limit["value"], 6) for limit in latency["limits"]] == [800.0, 600.0]
    assert [point[1] for point in latency["series"][1]["points"]] == [pytest.approx(550.0)]
    assert [point[1] for point in latency["series"][0]["points"]] == [pytest.approx(500.0)]
    assert error_rate["unit"] == "%" and error_rate["limits"][0]["value"] == pytest.approx(1.0)
    assert latency["source"] == "evaluations seen by the dashboard"


def test_limit_lines_read_the_judges_texts() -> None:
    # The dashboard draws the limits the report draws (canary.report.rollout.limit_values).
    assert limit_values("≤ 800ms and ≤ +20% vs stable when stable ≥ 100ms", Unit.SECONDS, 0.5) == [
        ("≤ 800ms", pytest.approx(0.8)),
        ("1.2 × stable 500ms", pytest.approx(0.6)),
    ]
    assert limit_values("≤ +20% vs stable", Unit.SECONDS, None) == []
    assert limit_values("≥ 0.5", Unit.NONE, None) == [("≥ 0.5", 0.5)]
    assert limit_values("≤ 95% of GPU memory", Unit.BYTES, None) == []
    assert limit_values("≤ 70Gi", Unit.BYTES, None) == [("≤ 70Gi", 70 * 1024.0**3)]
    assert limit_values("no limit", Unit.COUNT, None) == []


def test_with_prometheus_unreachable_the_charts_fall_back_to_the_evaluations_seen_and_say_why(
    world: World,
) -> None:
    # Prometheus history itself is drawn from a real Prometheus: tests/dashboard/test_history.py.
    world.start_rollout()
    _explain(world)
    board = start_dashboard(world, prometheus_url=f"http://127.0.0.1:{free_port()}")
    try:
        charts = Api(board).get("/api/rollouts/ml/llama").json()["charts"]
    finally:
        board.stop()
    assert charts["checks"][0]["prometheusError"].startswith("unreachable: ")
    assert charts["checks"][0]["source"] == "evaluations seen by the dashboard"
    assert charts["checks"][1]["prometheusError"] is None, "a check without queries asks nothing"


def test_the_request_log_never_shows_the_token(world: World, capfd: pytest.CaptureFixture[str]) -> None:
    board = start_dashboard(world)
    try:
        raw(board, "GET", f"/?token={board.token}")
        raw(board, "GET", "/?token=guess")
    finally:
        board.stop()
    captured = capfd.readouterr()
    assert board.token not in captured.out + captured.err
    assert "guess" not in captured.out + captured.err


def test_run_dashboard_prints_its_url_serves_and_exits_0_on_ctrl_c(world: World) -> None:
    import subprocess
    import sys

    world.start_rollout()
    code = (
        "import sys; from canary.dashboard.server import run_dashboard; "
        f"sys.exit(run_dashboard(kubeconfig={str(world.kubeconfig)!r}, context=None, namespaces=['ml']))"
    )
    process = popen_with_ctrl_c(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        prefix = "Dashboard: http://127.0.0.1:"
        assert line.startswith(prefix), line + (process.stderr.read() if process.poll() is not None else "")
        url = line.removeprefix("Dashboard: ")
        token = url.split("?token=", 1)[1]
        origin = url.split("/?", 1)[0]
        assert len(token) >= 43
        listed = requests.get(f"{origin}/api/rollouts", headers={TOKEN_HEADER: token}, timeout=10)
        assert [row["name"] for row in listed.json()["rollouts"]] == ["llama"]
        interrupt_and_wait(process)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_run_dashboard_says_when_the_kubeconfig_is_unusable() -> None:
    from canary.dashboard.server import run_dashboard

    assert run_dashboard(kubeconfig="/nonexistent/kubeconfig", context=None, namespaces=[]) == 1


def test_what_the_api_server_refuses_reaches_the_page(world: World, dashboard: Dashboard) -> None:
    # A user who may not list ConfigMaps cluster-wide: the page says the API server's answer.
    world.emulator.faults.add_from_json({"method": "GET", "path": "^/api/v1/configmaps", "status": 403})
    refused = Api(dashboard).get("/api/rollouts")
    assert refused.status_code == 502
    assert refused.json()["error"].startswith("the API server answered 403")
    assert Api(dashboard).get("/api/rollouts").status_code == 200, "the next poll succeeds"
