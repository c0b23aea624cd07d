"""The ``kserve-canary`` command line."""

from __future__ import annotations

import json
import re
import secrets
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table
from rich.text import Text

from canary import __version__
from canary.controller.observability import configure_logging, default_bind_address
from canary.controller.runtime import Controller, ControllerConfig, PolicySource, load_api_client
from canary.controller.startup import preflight_or_exit
from canary.kserve.client import ConflictError
from canary.kserve.identity import who_am_i
from canary.kserve.store import STATE_KEY, ConfigMapStateStore, StoredState, state_configmap_name
from canary.metrics.buckets import resolution_warnings
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import redact_processor
from canary.policy import PromotionPolicy, load_paths
from canary.policy.crd import crd_yaml
from canary.policy.schema import policy_json_schema
from canary.policy.scope import NamespaceSource, SecretScope, parse_env_allow
from canary.policy.units import format_value, parse_duration
from canary.rollout.commands import apply_command
from canary.rollout.records import COMMAND_TTL, CommandFormatError, CommandOutcome, CommandRequest
from canary.rollout.sampled import worst_case_requests
from canary.rollout.state import CommandKind, RolloutState, StateFormatError, describe_time

app = typer.Typer(
    name="kserve-canary",
    help="Automated, evidence-driven canary rollouts for KServe InferenceServices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kserve-canary {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Automated, evidence-driven canary rollouts for KServe InferenceServices."""


# What a policy may reach; `validate` takes the same options as `run`, so CI rejects what the
# controller would (docs/notifications.md, "Secrets and namespaces").
PolicyNamespacesOption = Annotated[
    NamespaceSource,
    typer.Option(
        "--policy-namespaces",
        envvar="POLICY_NAMESPACES",
        help="directory: DIR/<namespace>/*.yaml decides a policy's namespace; metadata: trust "
        "metadata.namespace (one platform-owned repository only).",
    ),
]
SecretFileRootOption = Annotated[
    Path | None,
    typer.Option(
        "--secret-file-root",
        envvar="SECRET_FILE_ROOT",
        help="'file:' references of namespace NS resolve inside DIR/NS/; without it they are refused.",
    ),
]
SecretEnvAllowOption = Annotated[
    list[str],
    typer.Option(
        "--secret-env-allow",
        envvar="SECRET_ENV_ALLOW",
        help="NS=GLOB: policies of NS may read environment variables matching GLOB (repeatable; "
        "comma-separated in the variable). Default: none.",
    ),
]


def _secret_scope(file_root: Path | None, env_allow: list[str]) -> SecretScope:
    try:
        allowed = parse_env_allow(env_allow)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--secret-env-allow") from None
    return SecretScope(file_root=file_root, env_allow=allowed)


@app.command()
def validate(
    paths: Annotated[list[Path], typer.Argument(help="Policy files or directories (searched recursively).")],
    output: Annotated[OutputFormat, typer.Option("--format", help="text for people, json for machines.")] = (
        OutputFormat.TEXT
    ),
    policy_namespaces: PolicyNamespacesOption = NamespaceSource.DIRECTORY,
    secret_file_root: SecretFileRootOption = None,
    secret_env_allow: SecretEnvAllowOption = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Check policy files; exit 0 when all are valid, 1 when any is not (2: usage error).

    A directory is a policy root: DIR/<namespace>/**/*.yaml, as the controller reads it.
    """
    result = load_paths(
        paths, namespaces=policy_namespaces, secrets=_secret_scope(secret_file_root, secret_env_allow)
    )
    if output is OutputFormat.JSON:
        document = {
            "valid": result.ok,
            "files": result.files,
            "policies": [
                {
                    "name": loaded.policy.metadata.name,
                    "target": loaded.policy.key,
                    "path": loaded.path,
                    "line": loaded.line,
                    "worstCaseRequests": worst_case_requests(loaded.policy),
                    "warnings": resolution_warnings(loaded.policy),
                }
                for loaded in result.policies
            ],
            "errors": [error.as_dict() for error in sorted(result.errors, key=lambda error: error.sort_key)],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        console = Console(highlight=False, soft_wrap=True)
        for error in sorted(result.errors, key=lambda error: error.sort_key):
            console.print(str(error), markup=False)
        for loaded in result.policies:
            console.print(
                f"ok  {loaded.origin}: {loaded.policy.metadata.name} -> {loaded.policy.key}", markup=False
            )
            for line in _judge_advice(loaded.policy):
                console.print(f"    {line}", markup=False)
        summary = f"{len(result.policies)} valid {'policy' if len(result.policies) == 1 else 'policies'}"
        summary += f", {len(result.errors)} {'error' if len(result.errors) == 1 else 'errors'}"
        summary += f" in {len(result.files)} {'file' if len(result.files) == 1 else 'files'}"
        console.print(summary, markup=False)
    raise typer.Exit(0 if result.ok else 1)


def _judge_advice(policy: PromotionPolicy) -> list[str]:
    """What a policy author should know before the first rollout: how many requests each counted
    check may need at most, and limits the bucket layouts cannot resolve."""
    lines = []
    for name, size in worst_case_requests(policy).items():
        if size is not None:
            lines.append(
                f"{name}: decided within {size:,} pooled canary requests at the latest "
                f"(confidence {policy.spec.confidence:.0%})"
            )
    lines.extend(f"warning: {warning}" for warning in resolution_warnings(policy))
    return lines


@app.command()
def schema(
    crd: Annotated[
        bool,
        typer.Option("--crd", help="Print the PromotionPolicy CustomResourceDefinition (YAML) instead."),
    ] = False,
) -> None:
    """Print the JSON Schema of the policy file (for yaml-language-server and editors)."""
    if crd:
        typer.echo(crd_yaml(), nl=False)
        return
    typer.echo(json.dumps(policy_json_schema(), indent=2, sort_keys=True))


def main() -> None:
    app()


# ---------------------------------------------------------------------------------------------
# The controller


class LogFormat(StrEnum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


def _parse_headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, separator, content = value.partition("=")
        if not separator or not name.strip():
            raise typer.BadParameter(f"expected K=V, got {value!r}", param_hint="--prometheus-header")
        headers[name.strip()] = content.strip()
    return headers


@app.command()
def run(
    policies: Annotated[
        list[Path], typer.Option("--policies", envvar="POLICY_DIR", help="Policy directory (repeatable).")
    ] = [Path("/etc/kserve-canary/policies")],  # noqa: B006 - typer reads the default, never mutates it
    kubeconfig: Annotated[
        str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig file; default: in-cluster config.")
    ] = None,
    prometheus_url: Annotated[str, typer.Option(envvar="PROMETHEUS_URL")] = "http://localhost:9090",
    prometheus_header: Annotated[
        list[str], typer.Option(help="Extra header K=V, e.g. X-Scope-OrgID=tenant (repeatable).")
    ] = [],  # noqa: B006
    prometheus_token_file: Annotated[
        str | None,
        typer.Option(envvar="PROMETHEUS_TOKEN_FILE", help="Bearer token file (re-read per request)."),
    ] = None,
    prometheus_ca_file: Annotated[str | None, typer.Option(envvar="PROMETHEUS_CA_FILE")] = None,
    prometheus_timeout: Annotated[
        float, typer.Option(envvar="PROMETHEUS_TIMEOUT", help="Seconds per query.")
    ] = 10.0,
    scrape_interval: Annotated[
        float,
        typer.Option(envvar="PROMETHEUS_SCRAPE_INTERVAL", help="Scrape interval of the metrics read (s)."),
    ] = 30.0,
    min_samples: Annotated[
        float,
        typer.Option(
            envvar="MIN_SAMPLES",
            help="A latency or error rate from fewer requests is no data (neither pass nor fail).",
        ),
    ] = 20,
    namespace: Annotated[
        list[str],
        typer.Option("--namespace", "-n", envvar="WATCH_NAMESPACES", help="Watched namespace (repeatable)."),
    ] = [],  # noqa: B006
    metrics_port: Annotated[
        int, typer.Option(envvar="METRICS_PORT", help="/metrics, /healthz, /readyz.")
    ] = 8080,
    metrics_bind_address: Annotated[
        str | None,
        typer.Option(
            envvar="METRICS_BIND_ADDRESS",
            help="Address of /metrics, /healthz, /readyz; default: $POD_IP, else 127.0.0.1.",
        ),
    ] = None,
    leader_elect: Annotated[
        bool, typer.Option("--leader-elect/--no-leader-elect", envvar="LEADER_ELECT")
    ] = True,
    lease_name: Annotated[str, typer.Option(envvar="LEASE_NAME")] = "kserve-canary",
    lease_namespace: Annotated[str, typer.Option(envvar="LEASE_NAMESPACE")] = "kserve-canary",
    lease_duration: Annotated[float, typer.Option(envvar="LEASE_DURATION", help="Seconds.")] = 15.0,
    renew_deadline: Annotated[float, typer.Option(envvar="LEASE_RENEW_DEADLINE", help="Seconds.")] = 10.0,
    retry_period: Annotated[float, typer.Option(envvar="LEASE_RETRY_PERIOD", help="Seconds.")] = 2.0,
    shards: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="SHARDS",
            help="Shard Leases the governed InferenceServices are split into (docs/ha.md); 1: one "
            "Lease, one leader.",
        ),
    ] = 1,
    tick: Annotated[
        float,
        typer.Option(
            min=0.1,
            envvar="TICK_SECONDS",
            help="Seconds between ticks: every due rollout is evaluated together (one counter sample); "
            "keep it at most the smallest policy interval.",
        ),
    ] = 5.0,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", envvar="DRY_RUN", help="Decide and report; write nothing; take no lease."),
    ] = False,
    log_format: Annotated[LogFormat, typer.Option(envvar="LOG_FORMAT")] = LogFormat.AUTO,
    max_workers: Annotated[int, typer.Option(envvar="MAX_WORKERS", help="Concurrent evaluations.")] = 8,
    policy_namespaces: PolicyNamespacesOption = NamespaceSource.DIRECTORY,
    secret_file_root: SecretFileRootOption = None,
    secret_env_allow: SecretEnvAllowOption = [],  # noqa: B006
    notify_allow_host: Annotated[
        list[str],
        typer.Option(
            "--notify-allow-host",
            envvar="NOTIFY_ALLOW_HOSTS",
            help="A notification host that may be private, loopback or plain http (repeatable).",
        ),
    ] = [],  # noqa: B006
    notify_retry_for: Annotated[
        str,
        typer.Option(
            envvar="NOTIFY_RETRY_FOR",
            help="How long a promotion, rollback, pause, unguarded-rollout or warning notification is "
            "retried before it is reported lost (1h, 30m, 90s).",
        ),
    ] = "1h",
    notify_info_retry_for: Annotated[
        str,
        typer.Option(
            envvar="NOTIFY_INFO_RETRY_FOR",
            help="The same for informational notifications (started, advanced, ...).",
        ),
    ] = "10m",
    policy_source: Annotated[
        str,
        typer.Option(
            "--policy-source",
            envvar="POLICY_SOURCE",
            help="Where policies come from: files (--policies), crd (PromotionPolicy objects; /readyz "
            "fails while the CRD is not served), or auto: both, the objects once the CRD is served. "
            "Comma-separated: files,crd.",
        ),
    ] = "auto",
    allow_custom_promql_from_crds: Annotated[
        bool,
        typer.Option(
            "--allow-custom-promql-from-crds",
            envvar="ALLOW_CUSTOM_PROMQL_FROM_CRDS",
            help="Accept custom PromQL (checks[].promql, metrics.queries) in PromotionPolicy objects: "
            "it runs with the controller's Prometheus credentials (put prom-label-proxy in front).",
        ),
    ] = False,
) -> None:
    """Run the controller until SIGTERM."""
    configure_logging(log_format.value, extra_processors=[redact_processor])
    # A wrong input is one line on stderr and exit code 2, not a traceback (canary.controller.startup).
    api_client = preflight_or_exit(
        kubeconfig=kubeconfig,
        prometheus_url=prometheus_url,
        metrics_port=metrics_port,
        metrics_host=metrics_bind_address or default_bind_address(),
    )
    source = PrometheusEvidenceSource(
        PrometheusConfig(
            url=prometheus_url,
            headers=_parse_headers(prometheus_header),
            bearer_token_file=prometheus_token_file,
            ca_file=prometheus_ca_file,
            timeout=prometheus_timeout,
        ),
        scrape_interval=scrape_interval,
        min_requests=min_samples,
    )
    controller = Controller(
        ControllerConfig(
            policy_paths=policies,
            namespaces=namespace,
            metrics_port=metrics_port,
            metrics_host=metrics_bind_address or default_bind_address(),
            leader_elect=leader_elect,
            lease_name=lease_name,
            lease_namespace=lease_namespace,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            shards=shards,
            tick=tick,
            dry_run=dry_run,
            max_workers=max_workers,
            policy_namespaces=policy_namespaces,
            secrets=_secret_scope(secret_file_root, secret_env_allow),
            notify_allow_hosts=notify_allow_host,
            notify_retry_for=_duration(notify_retry_for, "--notify-retry-for"),
            notify_info_retry_for=_duration(notify_info_retry_for, "--notify-info-retry-for"),
            policy_sources=_policy_sources(policy_source),
            allow_custom_promql_from_crds=allow_custom_promql_from_crds,
        ),
        api_client=api_client,
        evidence=source,
    )
    signal.signal(signal.SIGTERM, lambda *_: controller.stop())
    signal.signal(signal.SIGINT, lambda *_: controller.stop())
    controller.run()


def _policy_sources(text: str) -> frozenset[PolicySource]:
    try:
        sources = frozenset(PolicySource(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(
            f"expected files, crd, auto or files,crd, got {text!r}", param_hint="--policy-source"
        ) from None
    if not sources:
        raise typer.BadParameter("name at least one source", param_hint="--policy-source")
    return sources


def _duration(text: str, option: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


# ---------------------------------------------------------------------------------------------
# Operating rollouts


# What a ConfigMap holds reaches a terminal only through printable(): anyone who can edit the
# ConfigMap could otherwise clear the screen (ESC [ 2J), plant hyperlinks (OSC 8), or overwrite a
# line (\r, backspaces) in front of the person reading `status` or `explain`.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor, erase, colours
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks; ended by BEL or ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -~]?"  # any other escape
)
# C0 (but newline), DEL, C1, and the bidirectional overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` without escape sequences or control characters (newlines stay; a tab is a space)."""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text.replace("\t", " ")))


def _cell(text: str) -> Text:
    """A table cell shown as it is: no Rich markup (``[link=...]``), no control characters."""
    return Text(printable(text))


def _split_target(target: str) -> tuple[str, str]:
    namespace, separator, name = target.partition("/")
    if not separator or not namespace or not name:
        raise typer.BadParameter(f"expected NAMESPACE/NAME, got {target!r}", param_hint="TARGET")
    return namespace, name


KubeconfigOption = Annotated[str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig file.")]


def _store(kubeconfig: str | None) -> ConfigMapStateStore:
    return ConfigMapStateStore(load_api_client(kubeconfig))


def _status_row(stored: StoredState) -> dict[str, str]:
    """One rollout for ``status``; one that cannot be read says why, and the others still print."""
    try:
        if stored.state_json is None:
            raise StateFormatError(f"the ConfigMap holds no {STATE_KEY}")
        state = stored.state()
    except StateFormatError as error:
        return {"model": stored.key, "phase": "Unreadable", "reason": printable(str(error))}
    try:
        command = stored.command()
        pending = str(command.command) if command is not None else ""
    except CommandFormatError:
        pending = "unreadable"
    last = state.history[-1] if state.history else None
    weight = state.spec_weight.weight if state.spec_weight else None
    return {
        "model": stored.key,
        "revision": state.revision or "",
        "phase": str(state.phase),
        "weight": "-" if weight is None else f"{weight}%",
        "step": "-" if state.step is None else f"{state.step.index + 1} ({state.step.weight}%)",
        "since": describe_time(state.step.started_at if state.step else state.started_at),
        "reason": last.reason if last else "",
        "pendingCommand": pending,
    }


@app.command()
def status(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
    kubeconfig: KubeconfigOption = None,
    output: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.TEXT,
) -> None:
    """A table of rollouts, read from the controller's state ConfigMaps."""
    stored_states = sorted(_store(kubeconfig).list_all(namespace), key=lambda s: s.key)
    rows = [_status_row(stored) for stored in stored_states]
    if output is OutputFormat.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("MODEL", "REVISION", "PHASE", "WEIGHT", "STEP", "SINCE", "LAST DECISION", box=None)
    for row in rows:
        table.add_row(*(
            _cell(row.get(column, ""))
            for column in ("model", "revision", "phase", "weight", "step", "since", "reason")
        ))  # fmt: skip
    Console(soft_wrap=False).print(table)


@app.command()
def explain(
    target: Annotated[str, typer.Argument(help="NAMESPACE/NAME of the InferenceService.")],
    kubeconfig: KubeconfigOption = None,
    output: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.TEXT,
) -> None:
    """The latest evidence and judgement per check, with the PromQL behind each value."""
    namespace, name = _split_target(target)
    stored = _store(kubeconfig).load(namespace, name)
    if stored.state_json is None:
        typer.echo(f"no rollout state for {namespace}/{name}: kserve-canary has not seen it", err=True)
        raise typer.Exit(1)
    try:
        state = stored.state()
        document = stored.explain()
    except StateFormatError as error:
        typer.echo(printable(f"{namespace}/{name}: {error}"), err=True)
        raise typer.Exit(1) from None
    if output is OutputFormat.JSON:
        latest = document.to_dict() if document is not None else None
        typer.echo(json.dumps({"state": json.loads(state.to_json()), "latestEvaluation": latest}, indent=2))
        return
    console = Console(soft_wrap=True, highlight=False)
    if document is None:
        console.print(f"{namespace}/{name}: no evaluation recorded yet", markup=False)
        return
    console.print(
        printable(
            f"{namespace}/{name} revision {document.revision} vs {document.stable_revision} "
            f"at {document.at.isoformat()}: {document.verdict or 'no verdict'}, {document.requests} "
            f"requests — {document.action}"
        ),
        markup=False,
    )
    for reason in document.reasons:
        console.print(printable(f"  {reason}"), markup=False)
    table = Table("CHECK", "VERDICT", "CANARY", "LIMIT", "STABLE", "SAMPLES", box=None)
    for check in document.checks:
        table.add_row(
            _cell(check.name),
            _cell(check.verdict),
            "" if check.value is None else format_value(check.value, check.unit),
            _cell(check.limit),
            "" if check.stable is None else format_value(check.stable, check.unit),
            "" if check.samples is None else f"{check.samples:.0f}",
        )
    console.print(table)
    for check in document.checks:
        if check.query:
            console.print(printable(f"[{check.name}] {check.query}"), markup=False)


# Exit codes of pause, resume, approve, abort and promote.
EXIT_ACCEPTED = 0  # the controller accepted it (or it was issued with --no-wait)
EXIT_REFUSED = 1  # refused: by the CLI (obviously impossible now) or by the controller
EXIT_NO_ANSWER = 3  # issued, but the controller did not answer within --wait
_ATTEMPTS = 5  # writes that lose a race with the controller are retried this often
_POLL_SECONDS = 0.5


def _refused(message: str) -> typer.Exit:
    typer.echo(printable(message), err=True)
    return typer.Exit(EXIT_REFUSED)


def _step_text(state: RolloutState) -> str:
    return "no step yet" if state.step is None else f"step {state.step.index + 1} ({state.step.weight}%)"


def _command(kind: CommandKind, target: str, options: CommandOptions) -> None:
    """Issue ``kind`` for the rollout in progress, bound to it, and wait for the controller's answer.

    The state is read first; the command names its revision, step and resourceVersion and is written
    under that resourceVersion (a write that loses a race is retried only while the rollout is still
    at the same revision and step). ``by`` is the API server's answer to a SelfSubjectReview.
    """
    namespace, name = _split_target(target)
    api_client = load_api_client(options.kubeconfig)
    store = ConfigMapStateStore(api_client)
    try:
        identity = who_am_i(api_client, options.kubeconfig)
    except ApiException as error:
        raise _refused(
            f"{kind} not issued: the API server answered {error.status} {error.reason} when asked who you are"
        ) from None
    if identity.note:
        typer.echo(f"note: {identity.note}", err=True)
    seen: tuple[str | None, int | None] | None = None
    for _ in range(_ATTEMPTS):
        stored = store.load(namespace, name)
        if stored.state_json is None:
            raise _refused(f"no rollout state for {namespace}/{name}: kserve-canary has not seen it")
        try:
            state = stored.state()
        except StateFormatError as error:
            raise _refused(f"{namespace}/{name}: {error}") from None
        step = state.step.index if state.step is not None else None
        if options.revision is not None and options.revision != state.revision:
            raise _refused(
                f"{kind} for {options.revision} refused: the rollout of {namespace}/{name} is of "
                f"{state.revision or 'no revision'}"
            )
        if seen is not None and seen != (state.revision, step):
            raise _refused(
                f"{kind} refused: the rollout of {namespace}/{name} moved while the command was issued "
                f"(now {state.revision}, {_step_text(state)}); look at `kserve-canary status` and try again"
            )
        seen = (state.revision, step)
        now = datetime.now(UTC)
        waiting = _waiting_command(stored, now)
        if waiting is not None:
            raise _refused(
                f"{kind} refused: {waiting} is waiting for the controller; wait for its answer, then "
                "try again"
            )
        command = CommandRequest(
            kind,
            by=identity.username,
            at=now,
            reason=options.reason,
            revision=state.revision,
            step=step,
            state_resource_version=stored.resource_version,
            id=secrets.token_hex(8),
        )
        # What is impossible now is refused at once, as the controller would; it stays the authority.
        verdict = apply_command(state, command, now)
        if not verdict.accepted:
            raise _refused(f"{kind} of {namespace}/{name} refused: {verdict.message}")
        try:
            store.request_command(
                namespace, name, command, issuer=identity.username, resource_version=stored.resource_version
            )
            break
        except ConflictError:
            continue
        except LookupError as error:
            raise _refused(str(error)) from None
    else:
        raise _refused(f"{kind} refused: the state of {namespace}/{name} kept changing; try again")
    what = f"{kind} of {namespace}/{name} ({state.revision}, {_step_text(state)}) by {identity.username}"
    if options.wait <= 0:
        typer.echo(f"{what} issued; the controller answers at its next evaluation (not waiting)")
        raise typer.Exit(EXIT_ACCEPTED)
    typer.echo(f"{what} issued; waiting up to {options.wait:g}s for the controller's answer")
    answer = _answer(store, namespace, name, command, options.wait)
    if answer is None:
        typer.echo(
            f"no answer from the controller within {options.wait:g}s: the command waits in ConfigMap "
            f"{namespace}/{state_configmap_name(name)} (the controller reads it at its next evaluation; "
            "is it running?)",
            err=True,
        )
        raise typer.Exit(EXIT_NO_ANSWER)
    if not answer.accepted:
        raise _refused(f"the controller refused {kind} of {namespace}/{name}: {answer.message}")
    typer.echo(printable(f"the controller accepted {kind} of {namespace}/{name}: {answer.message}"))
    raise typer.Exit(EXIT_ACCEPTED)


def _waiting_command(stored: StoredState, now: datetime) -> str | None:
    """Someone else's command the controller has not read yet (an expired or unreadable one does not
    count: it would be refused anyway), described; None when there is none."""
    if stored.command_json is None:
        return None
    try:
        command = stored.command()
    except CommandFormatError:
        return None
    if command is None or command.at is None or now - command.at > COMMAND_TTL:
        return None
    issuer = stored.command_issuer or command.by or "someone"
    return f"{command.command} by {issuer} ({describe_time(command.at)})"


def _answer(
    store: ConfigMapStateStore, namespace: str, name: str, command: CommandRequest, wait: float
) -> CommandOutcome | None:
    """The controller's answer to ``command``; None when it has not come within ``wait`` seconds.
    Raises typer.Exit when the command was replaced or withdrawn before the controller read it."""
    deadline = time.monotonic() + wait
    while True:
        stored = store.load(namespace, name)
        answer = stored.readable_command_result()
        if answer is not None and answer.id == command.id:
            return answer
        try:
            waiting = stored.command()
        except CommandFormatError:
            waiting = None
        if waiting is None or waiting.id != command.id:
            raise _refused(
                f"{command.command} of {namespace}/{name} was replaced or withdrawn before the controller "
                "read it"
            )
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL_SECONDS)


@dataclass(frozen=True)
class CommandOptions:
    kubeconfig: str | None
    reason: str | None
    wait: float
    revision: str | None


ReasonOption = Annotated[str | None, typer.Option(help="Why, for the record.")]
TargetArgument = Annotated[str, typer.Argument(help="NAMESPACE/NAME of the InferenceService.")]
WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        help="Seconds to wait for the controller's answer (it reads commands at its next evaluation); "
        "0: do not wait.",
    ),
]
NoWaitOption = Annotated[bool, typer.Option("--no-wait", help="Issue the command and do not wait.")]
RevisionOption = Annotated[
    str | None,
    typer.Option(help="Refuse unless the rollout in progress is of this revision (default: the current)."),
]
DEFAULT_WAIT = 90.0  # more than the default evaluation interval (60 s)


def _options(
    kubeconfig: str | None, reason: str | None, wait: float, no_wait: bool, revision: str | None
) -> CommandOptions:
    return CommandOptions(kubeconfig, reason, 0.0 if no_wait else wait, revision)


@app.command()
def pause(
    target: TargetArgument,
    kubeconfig: KubeconfigOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    no_wait: NoWaitOption = False,
    revision: RevisionOption = None,
) -> None:
    """Stop the rollout where it is (nothing is written to the InferenceService).

    Exit 0: accepted; 1: refused (with the reason); 3: no answer from the controller within --wait.
    """
    _command(CommandKind.PAUSE, target, _options(kubeconfig, reason, wait, no_wait, revision))


@app.command()
def resume(
    target: TargetArgument,
    kubeconfig: KubeconfigOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    no_wait: NoWaitOption = False,
    revision: RevisionOption = None,
) -> None:
    """Continue a paused rollout (exit codes as for pause)."""
    _command(CommandKind.RESUME, target, _options(kubeconfig, reason, wait, no_wait, revision))


@app.command()
def approve(
    target: TargetArgument,
    kubeconfig: KubeconfigOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    no_wait: NoWaitOption = False,
    revision: RevisionOption = None,
) -> None:
    """Let a step with `approval: manual` proceed (exit codes as for pause)."""
    _command(CommandKind.APPROVE, target, _options(kubeconfig, reason, wait, no_wait, revision))


@app.command()
def abort(
    target: TargetArgument,
    kubeconfig: KubeconfigOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    no_wait: NoWaitOption = False,
    revision: RevisionOption = None,
) -> None:
    """Roll back now (canaryTrafficPercent: 0) (exit codes as for pause)."""
    _command(CommandKind.ABORT, target, _options(kubeconfig, reason, wait, no_wait, revision))


@app.command()
def promote(
    target: TargetArgument,
    kubeconfig: KubeconfigOption = None,
    reason: ReasonOption = None,
    wait: WaitOption = DEFAULT_WAIT,
    no_wait: NoWaitOption = False,
    revision: RevisionOption = None,
) -> None:
    """Skip the remaining steps and promote (once the canary is Ready) (exit codes as for pause)."""
    _command(CommandKind.PROMOTE, target, _options(kubeconfig, reason, wait, no_wait, revision))


# ---------------------------------------------------------------------------------------------
# The demo


@app.command()
def demo(
    speed: Annotated[
        float,
        typer.Option(
            min=0.5, max=5.0, help="Shorten the policies' windows, intervals and deadlines by this factor."
        ),
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulated fleet (latencies, errors).")] = 7,
    keep_running: Annotated[
        bool,
        typer.Option(help="Leave Prometheus, the emulator and the controller up afterwards (Ctrl-C stops)."),
    ] = False,
    no_ui: Annotated[
        bool,
        typer.Option(
            "--no-ui", help="Plain log lines instead of the live view (CI; the default when not a terminal)."
        ),
    ] = False,
    report: Annotated[
        Path | None, typer.Option(help="Where to write the HTML report (default: a new temporary directory).")
    ] = None,
) -> None:
    """A whole canary story on this machine, no cluster: one model promoted, two rolled back.

    Exit 0 only when every model ended as the story says: A promoted, B rolled back by its p99 check,
    C rolled back at its progress deadline.
    """
    # The demo lives in the sandbox distribution (the API emulator, the simulated fleet, the Prometheus
    # launcher), which the controller's image does not contain: imported only here, on demand.
    try:
        from canary_sandbox.demo.run import DemoFailed, DemoOptions, run_demo  # noqa: PLC0415
    except ModuleNotFoundError as missing:
        if missing.name is None or not missing.name.startswith("canary_sandbox"):
            raise
        Console(stderr=True).print(
            "kserve-canary demo needs the sandbox: pip install 'kserve-canary[demo]' "
            "(from a checkout: make demo)",
            highlight=False,
        )
        raise typer.Exit(2) from None

    terminal = Console().is_terminal
    # Piped into a file or a CI log, a live view has nothing to redraw: print plain lines instead.
    console = Console(highlight=False, width=None if terminal else 160)
    options = DemoOptions(
        speed=speed, seed=seed, ui=terminal and not no_ui, keep_running=keep_running, report=report
    )
    try:
        code = run_demo(options, console)
    except KeyboardInterrupt:
        console.print("interrupted: every process the demo started has been stopped")
        raise typer.Exit(130) from None
    except DemoFailed as error:
        console.print(f"[bold red]The demo failed:[/] {error}", highlight=False)
        raise typer.Exit(1) from None
    raise typer.Exit(code)
