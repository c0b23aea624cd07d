"""The kserve-canary sandbox: everything that stands in for a cluster, and nothing the controller runs.

- :mod:`canary_sandbox.emulator` — a stateful Kubernetes API emulator with KServe/Knative behaviour,
  served over real HTTP to the official ``kubernetes`` client and to ``kubectl``;
- :mod:`canary_sandbox.fleet` — simulated model-server pods per revision that export what Knative's
  queue-proxy, kube-state-metrics and the DCGM exporter export, receiving traffic as KServe splits it;
- :mod:`canary_sandbox.prometheus` — starts Debian's real Prometheus on a free loopback port;
- :mod:`canary_sandbox.receiver`, :mod:`canary_sandbox.exporter`, :mod:`canary_sandbox.kserve_metrics`
  — a webhook receiver, a scrape target, generated KServe series with their ground truth;
- :mod:`canary_sandbox.stack` — all of it together with the controller as a separate process;
- :mod:`canary_sandbox.demo` — the story ``kserve-canary demo`` tells, its live view and report.

It is a distribution of its own (``kserve-canary-sandbox``, installed by ``kserve-canary[demo]``) so
the controller's image never contains it; the product package :mod:`canary` never imports it
(``.importlinter`` enforces both directions that matter).
"""
