"""`kserve-canary dashboard` starts the dashboard package's server with the command line's options."""

from __future__ import annotations

import signal
import subprocess
import urllib.request

from tests.cli.support import BIN, Cluster, environment


def test_the_dashboard_serves_and_stops_on_sigterm(cluster: Cluster) -> None:
    process = subprocess.Popen(
        [str(BIN / "kserve-canary"), "dashboard", "--no-browser", "--port", "0", "-n", "ml"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(cluster.home, KUBECONFIG=str(cluster.kubeconfig)),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("Dashboard: http://127.0.0.1:"), line
        url = line.split("Dashboard: ", 1)[1].strip()
        # The page answers ?token= with a cookie and a redirect: follow it as a browser would.
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(url, timeout=10) as response:
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.wait()
