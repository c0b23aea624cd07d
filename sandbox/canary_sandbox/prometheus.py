"""Run the real ``prometheus`` binary for tests, the demo and benchmarks.

Two ways to give it data:

* **scrape**: pass ``scrape_targets`` (``"127.0.0.1:PORT"``, e.g. a
  :class:`~canary_sandbox.exporter.FixtureExporter`); Prometheus scrapes them every
  ``scrape_interval`` (1 s by default). Real time passes.
* **backfill**: pass ``backfill`` — OpenMetrics text ending in ``# EOF``, with timestamps in seconds —
  and it is written into the data directory with ``promtool tsdb create-blocks-from openmetrics``
  *before* Prometheus starts, so the blocks are queryable immediately. (Blocks added to a running
  server appear only after a reload, and the head then rejects scraped samples older than the newest
  block, so backfill and scrape the same series only with care.) Query backfilled data with an
  explicit ``time=`` at or before its last timestamp: within the 5-minute lookback, instant queries
  see it.

Example::

    with PrometheusServer(backfill=text) as prometheus:
        requests.get(f"{prometheus.url}/api/v1/query", params={"query": "up", "time": t})

Each server gets a free loopback port, its own temporary data directory (removed on stop unless one
was given), and a log file whose tail is included in any start-up error. Debian 12's Prometheus is
2.42: no per-query ``lookback_delta``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import requests

__all__ = ["PrometheusServer", "PrometheusStartError", "free_port"]


class PrometheusStartError(RuntimeError):
    """Prometheus (or promtool) did not come up; the message carries the end of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrometheusServer:
    """A real Prometheus on loopback, as a context manager (or :meth:`start` / :meth:`stop`)."""

    def __init__(
        self,
        *,
        scrape_targets: Sequence[str] = (),
        scrape_interval: float = 1.0,
        honor_labels: bool = True,
        backfill: str | None = None,
        data_dir: Path | None = None,
        prometheus_binary: str = "prometheus",
        promtool_binary: str = "promtool",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        tls_cert_file: Path | None = None,
        tls_key_file: Path | None = None,
    ) -> None:
        """
        :param scrape_targets: ``host:port`` targets scraped at ``/metrics`` (job ``fixture``).
        :param honor_labels: keep the targets' own ``namespace``/``pod``/``job`` labels, as a
            PodMonitor with honorLabels does.
        :param backfill: OpenMetrics text written into the TSDB before start.
        :param data_dir: keep the TSDB there (not deleted on stop); default a temporary directory.
        :param extra_args: more flags for ``prometheus`` (e.g. ``--query.lookback-delta=1m``).
        :param tls_cert_file: serve HTTPS with this certificate (and ``tls_key_file``); :attr:`url`
            is then ``https://``.
        """
        if scrape_interval <= 0:
            raise ValueError("scrape_interval must be positive")
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("TLS needs both a certificate and a key")
        self._tls = (tls_cert_file, tls_key_file) if tls_cert_file and tls_key_file else None
        self.scrape_targets = tuple(scrape_targets)
        self.scrape_interval = scrape_interval
        self.honor_labels = honor_labels
        self._backfill = backfill
        self._given_data_dir = data_dir
        self._prometheus = prometheus_binary
        self._promtool = promtool_binary
        self._extra_args = tuple(extra_args)
        self._startup_timeout = startup_timeout
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Path | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the Prometheus server is not running")
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        if self._given_data_dir is not None:
            return self._given_data_dir
        if self._workdir is None:
            raise RuntimeError("the Prometheus server has not been started")
        return self._workdir / "data"

    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError("already started")
        self._workdir = Path(tempfile.mkdtemp(prefix="kserve-canary-prometheus-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = self._workdir / "prometheus.log"
        config = self._workdir / "prometheus.yml"
        config.write_text(self._config_text(), encoding="utf-8")
        web_config = self._workdir / "web.yml"
        if self._tls is not None:
            cert, key = self._tls
            web_config.write_text(
                f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n", encoding="utf-8"
            )
        try:
            if self._backfill is not None:
                self._run_backfill(self._backfill)
            # The port is free when probed but may be taken before Prometheus binds it: try again.
            for attempt in range(3):
                self.port = free_port()
                self._launch(config, web_config if self._tls else None)
                if self._wait_ready():
                    return self
                self._terminate()
                if "address already in use" not in self._log_tail() or attempt == 2:
                    break
            raise PrometheusStartError(f"Prometheus did not become ready:\n{self._log_tail()}")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate Prometheus (SIGTERM, then SIGKILL after ``timeout``) and remove temporary files."""
        self._terminate(timeout)
        self.port = 0
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def wait_until_scraped(self, timeout: float = 30.0) -> None:
        """Block until every scrape target has been scraped successfully at least once.

        Prometheus 2.x hands new targets to its scrapers on a 5-second tick, so the first scrape of a
        freshly started server comes about 5 s after it is ready.
        """
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(requests.RequestException, ValueError, KeyError):
                targets = self._local_get("/api/v1/targets").json()["data"]
                active = targets["activeTargets"]
                if len(active) >= len(self.scrape_targets) and all(t["health"] == "up" for t in active):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"targets not scraped within {timeout:g}s:\n{self._log_tail()}")
            time.sleep(0.1)

    def suspend(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted and never answered, as in an outage."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`suspend` (SIGCONT)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def reload(self) -> None:
        """Ask Prometheus to re-read its configuration (and pick up new blocks)."""
        requests.post(f"{self.url}/-/reload", timeout=10).raise_for_status()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    def _config_text(self) -> str:
        interval = f"{self.scrape_interval:g}s"
        lines = [
            "global:",
            f"  scrape_interval: {interval}",
            f"  evaluation_interval: {interval}",
            f"  scrape_timeout: {interval}",
            "scrape_configs:",
        ]
        if self.scrape_targets:
            targets = ", ".join(f"'{target}'" for target in self.scrape_targets)
            lines += [
                "  - job_name: fixture",
                f"    honor_labels: {'true' if self.honor_labels else 'false'}",
                f"    static_configs: [{{targets: [{targets}]}}]",
            ]
        else:
            lines[-1] = "scrape_configs: []"
        return "\n".join(lines) + "\n"

    def _run_backfill(self, openmetrics: str) -> None:
        assert self._workdir is not None
        source = self._workdir / "backfill.om"
        text = (
            openmetrics if openmetrics.rstrip().endswith("# EOF") else openmetrics.rstrip("\n") + "\n# EOF\n"
        )
        source.write_text(text, encoding="utf-8")
        result = subprocess.run(
            [self._promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.data_dir)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        source.unlink(missing_ok=True)
        if result.returncode != 0:
            raise PrometheusStartError(f"promtool backfill failed:\n{result.stderr[-4000:]}")

    def _launch(self, config: Path, web_config: Path | None) -> None:
        assert self._log_file is not None
        web = [f"--web.config.file={web_config}"] if web_config is not None else []
        with self._log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self._prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.data_dir}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    # Backfilled history may lie further back than the default 15-day retention: keep it.
                    "--storage.tsdb.retention.time=3650d",
                    *web,
                    *self._extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _wait_ready(self) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                if self._local_get("/-/ready").status_code == 200:
                    return True
            time.sleep(0.05)
        return False

    def _local_get(self, path: str) -> requests.Response:
        # Our own server on loopback, for readiness and targets only: verifying its certificate is the
        # caller's business (the TLS tests do).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return requests.get(f"{self.url}{path}", timeout=2, verify=False)  # noqa: S501

    def _terminate(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a suspended server cannot act on SIGTERM
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)

    def _log_tail(self, characters: int = 4000) -> str:
        if self._log_file is None or not self._log_file.exists():
            return "(no log)"
        return self._log_file.read_text(encoding="utf-8", errors="replace")[-characters:]
