"""The reusable real-Prometheus launcher and fixture exporter: start, serve, stop cleanly, fail loudly."""

from __future__ import annotations

import pytest
import requests
from canary_sandbox.exporter import FixtureExporter
from canary_sandbox.prometheus import PrometheusServer, PrometheusStartError


def test_backfilled_data_is_queryable_at_once_and_everything_is_cleaned_up() -> None:
    server = PrometheusServer(
        backfill='up_backfilled{job="x"} 4 1700000000\nup_backfilled{job="x"} 5 1700000010\n'
    )
    with server as prometheus:
        data_dir = prometheus.data_dir
        answer = requests.get(
            f"{prometheus.url}/api/v1/query",
            params={"query": "up_backfilled", "time": "1700000010"},
            timeout=5,
        ).json()
        assert answer["data"]["result"][0]["value"][1] == "5"
        url = prometheus.url
    assert not data_dir.exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/-/ready", timeout=2)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url


def test_scrapes_a_fixture_exporter_and_counts_its_scrapes() -> None:
    with (
        FixtureExporter(lambda: 'fixture_value{pod="a"} 42\n') as exporter,
        PrometheusServer(scrape_targets=[exporter.target], scrape_interval=1) as prometheus,
    ):
        prometheus.wait_until_scraped()
        assert exporter.scrapes >= 1
        answer = requests.get(
            f"{prometheus.url}/api/v1/query", params={"query": "fixture_value"}, timeout=5
        ).json()
        assert answer["data"]["result"][0]["metric"]["pod"] == "a"  # honor_labels keeps the exporter's labels


def test_bad_backfill_fails_with_promtool_output() -> None:
    with pytest.raises(PrometheusStartError, match="promtool backfill failed"):
        PrometheusServer(backfill="this is { not openmetrics\n").start()


def test_a_broken_binary_fails_with_its_log() -> None:
    with pytest.raises(PrometheusStartError, match="did not become ready"):
        PrometheusServer(extra_args=["--no-such-flag"], startup_timeout=5).start()
