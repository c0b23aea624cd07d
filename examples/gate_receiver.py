"""A gate receiver for kserve-canary: checks the signature, runs a smoke test, answers 2xx to pass.

    GATE_KEY=<the policy's secretFrom value> python examples/gate_receiver.py --port 8080

Point a gate at it (``spec.gates[].webhook.urlFrom``) and give it the same key (``secretFrom``).
It answers

* ``401`` when the signature is missing or wrong, or its timestamp is more than 5 minutes off
  (a replay): never trust an unsigned request to decide a rollout;
* ``400`` when the body is not a ``GateRequest`` of ``apiVersion: kserve-canary.dev/v1alpha1``;
* ``200`` when the smoke test passes, ``503`` when it fails: kserve-canary then holds the step and
  calls again (with the same ``Idempotency-Key``) until the gate passes or its ``deadline`` passes.

The smoke test here is a placeholder: with ``SMOKE_URL`` set (``{revision}`` and ``{namespace}``
are filled in, e.g. ``http://{revision}-private.{namespace}.svc.cluster.local/v1/models/m``) it
GETs that URL and passes on 2xx; without it, it passes. Replace :func:`smoke_test` with your own
(an inference request with a known answer, a load test, a human's OK from a ticket system, ...).
Answer within the gate's ``timeout``: a long test should start on the first call and report on the
later ones (the calls of one gate at one step share their ``id``).

Standard library only: copy it anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE = 300  # seconds a signed request stays acceptable
API_VERSION = "kserve-canary.dev/v1alpha1"


def verify(body: bytes, timestamp: str | None, signature: str | None, key: bytes, now: float) -> bool:
    """``X-Kserve-Canary-Signature: sha256=<hex HMAC-SHA256(key, "<timestamp>.<raw body>")>``."""
    if not timestamp or not signature:
        return False
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent_at) > TOLERANCE:
        return False
    expected = "sha256=" + hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature.strip())


def smoke_test(request: dict[str, Any]) -> tuple[bool, str]:
    """Whether the canary revision of ``request`` passes (and why). Replace with your own test."""
    template = os.environ.get("SMOKE_URL")
    if not template:
        return True, "no SMOKE_URL: nothing to test"
    url = template.format(
        revision=request["revisions"]["canary"], namespace=request["inferenceService"]["namespace"]
    )
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - the operator's own URL
            return 200 <= answer.status < 300, f"GET {url}: {answer.status}"
    except (urllib.error.URLError, OSError) as error:
        return False, f"GET {url}: {error}"


class Handler(BaseHTTPRequestHandler):
    key = b""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = self.headers
        if not verify(
            body,
            headers.get("X-Kserve-Canary-Timestamp"),
            headers.get("X-Kserve-Canary-Signature"),
            self.key,
            time.time(),
        ):
            return self.answer(401, "signature missing, wrong or too old")
        try:
            request = json.loads(body)
            valid = request.get("apiVersion") == API_VERSION and request.get("kind") == "GateRequest"
        except (ValueError, AttributeError):
            valid = False
        if not valid:
            return self.answer(400, "not a kserve-canary GateRequest")
        passed, why = smoke_test(request)
        gate, step = request["gate"], request["step"]
        where = f"step {step['weight']}%" if step else "before the first step"
        print(
            f"gate {gate['name']} ({gate['at']}, {where}) for {request['revisions']['canary']}: "
            f"{'pass' if passed else 'fail'} ({why}); id {request['id']}",
            flush=True,
        )
        return self.answer(200 if passed else 503, why)

    def answer(self, status: int, text: str) -> None:
        data = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per gate call is printed above


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    arguments = parser.parse_args(argv)
    key = os.environ.get("GATE_KEY", "")
    if len(key) < 16:
        print("set GATE_KEY to the gate's secretFrom value (at least 16 characters)", file=sys.stderr)
        return 2
    Handler.key = key.encode()
    server = ThreadingHTTPServer((arguments.host, arguments.port), Handler)
    print(f"gate receiver listening on http://{arguments.host}:{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
