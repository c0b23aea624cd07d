"""``python -m canary_sandbox.emulator``: the emulator as a process.

It writes a kubeconfig (``--kubeconfig-out``), prints its URL on the first line of stdout once it is
listening, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from canary_sandbox.emulator.clock import Clock, ManualClock, ScaledClock, SystemClock
from canary_sandbox.emulator.core import Emulator
from canary_sandbox.emulator.kserve import KServeConfig
from canary_sandbox.emulator.server import EmulatorServer


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m canary_sandbox.emulator",
        description="A Kubernetes API emulator with KServe/Knative behaviour, for tests and the demo.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (default)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig for this emulator here")
    parser.add_argument("--namespace", default="default", help="the kubeconfig context's namespace")
    parser.add_argument("--seed-file", type=Path, help="YAML documents to create at start (Namespaces first)")
    parser.add_argument("--seed", type=int, help="random seed for generated names (reproducible runs)")
    timing = parser.add_argument_group("simulated timing (seconds of the emulator's clock)")
    timing.add_argument("--reconcile-delay", type=float, default=0.5, help="KServe's lag behind a change")
    timing.add_argument("--knative-delay", type=float, default=0.0, help="Knative's lag behind KServe")
    timing.add_argument("--revision-ready-delay", type=float, default=1.0, help="new revisions become Ready")
    timing.add_argument("--pods-per-revision", type=int, default=1)
    timing.add_argument("--scale-down-grace", type=float, default=30.0, help="unrouted revisions keep pods")
    clocks = timing.add_mutually_exclusive_group()
    clocks.add_argument("--clock-speed", type=float, help="run simulated time this many times faster")
    clocks.add_argument("--manual-clock", action="store_true", help="time moves only via the admin API")
    parser.add_argument("--history-size", type=int, default=2000, help="watch events kept for resuming")
    parser.add_argument("--no-aggregated-discovery", action="store_true", help="serve legacy discovery only")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    clock: Clock = SystemClock()
    if args.manual_clock:
        clock = ManualClock()
    elif args.clock_speed:
        clock = ScaledClock(args.clock_speed)
    config = KServeConfig(
        reconcile_delay=args.reconcile_delay,
        knative_delay=args.knative_delay,
        revision_ready_delay=args.revision_ready_delay,
        pods_per_revision=args.pods_per_revision,
        scale_down_grace=args.scale_down_grace,
    )
    emulator = Emulator(config, clock, history_size=args.history_size, seed=args.seed)
    if args.seed_file:
        emulator.load_seed_file(args.seed_file)
    server = EmulatorServer(
        emulator, args.host, args.port, aggregated_discovery=not args.no_aggregated_discovery
    ).start()
    if args.kubeconfig_out:
        server.write_kubeconfig(args.kubeconfig_out, args.namespace)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(server.url, flush=True)
    print(f"kserve-canary emulator listening on {server.url} (clock: {clock!r})", file=sys.stderr, flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
