"""The ``kserve-canary`` command line; also ``kubectl canary``, as a kubectl plugin.

Start-up time is part of the interface: this module imports Typer and the standard library only,
and each command imports what it needs when it runs (:mod:`canary.cli.rollouts` the Kubernetes
client, :mod:`canary.cli.policies` the policy models, :mod:`canary.cli.controller` everything).

Exit codes, for every command: 0 ok; 1 refused or invalid; 2 usage error; 3 the cluster or
Prometheus could not be reached (for the operator commands also: the controller did not answer).
A failure is one or two lines on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from canary import __version__
from canary.cli import run_options as options
from canary.cli.help import DEBUG_KEY, EXIT_REFUSED, CanaryGroup, fail

app = typer.Typer(
    name="kserve-canary",
    cls=CanaryGroup,
    help="Automated, evidence-driven canary rollouts for KServe InferenceServices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help and usage errors, as kubectl and click print them: no boxes to break in a pipe, and
    # no Rich to import before the first line.
    rich_markup_mode=None,
)


class TextOrJson(StrEnum):
    TEXT = "text"
    JSON = "json"


class StatusOutput(StrEnum):
    TEXT = "text"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


class PolicyNamespaces(StrEnum):
    """canary.policy.scope.NamespaceSource, spelled here so that --help does not import the models."""

    DIRECTORY = "directory"
    METADATA = "metadata"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kserve-canary {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", envvar="KSERVE_CANARY_DEBUG", help="Print the traceback of a failure as well."
        ),
    ] = False,
) -> None:
    """Automated, evidence-driven canary rollouts for KServe InferenceServices.

    Exit codes: 0 ok, 1 refused or invalid, 2 usage error, 3 cluster or Prometheus unreachable.
    """
    ctx.meta[DEBUG_KEY] = debug


def main() -> None:
    # Installed as kubectl-canary, kubectl runs it for `kubectl canary ...`: say so in usage lines.
    name = "kubectl canary" if Path(sys.argv[0]).name == "kubectl-canary" else "kserve-canary"
    app(prog_name=name)


# ---------------------------------------------------------------------------------------------
# Policies

# What a policy may reach; `validate` takes the same options as `run`, so CI rejects what the
# controller would (docs/notifications.md, "Secrets and namespaces").
PolicyNamespacesOption = Annotated[
    PolicyNamespaces,
    typer.Option(
        "--policy-namespaces",
        envvar="POLICY_NAMESPACES",
        metavar="directory|metadata",
        help="directory: DIR/<namespace>/*.yaml decides a policy's namespace; metadata: trust "
        "metadata.namespace (one platform-owned repository only).",
    ),
]
SecretFileRootOption = Annotated[
    Path | None,
    typer.Option(
        "--secret-file-root",
        envvar="SECRET_FILE_ROOT",
        metavar="DIR",
        help="'file:' references of namespace NS resolve inside DIR/NS/; without it they are refused.",
    ),
]
SecretEnvAllowOption = Annotated[
    list[str],
    typer.Option(
        "--secret-env-allow",
        envvar="SECRET_ENV_ALLOW",
        metavar="NS=GLOB",
        help="Policies of NS may read environment variables matching GLOB (repeatable; "
        "comma-separated in the variable). Default: none.",
    ),
]

CustomPromqlAllowOption = Annotated[
    list[str],
    typer.Option(
        "--custom-promql-allow-metric",
        envvar="CUSTOM_PROMQL_ALLOW_METRIC",
        metavar="[NS=]GLOB",
        help="Custom PromQL (of policies of NS, or of every namespace) may read the metrics matching "
        "GLOB across namespaces, unscoped (repeatable). Default: none; every other selector is scoped "
        "to the policy's namespace.",
    ),
]
CustomPromqlLabelOption = Annotated[
    list[str],
    typer.Option(
        "--custom-promql-tenancy-label",
        envvar="CUSTOM_PROMQL_TENANCY_LABEL",
        metavar="GLOB=LABEL",
        help="The label naming the namespace of the metrics matching GLOB (recording rules, OTLP: "
        "kn_*=k8s_namespace_name), where the metric profiles do not say (repeatable).",
    ),
]


@app.command()
def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="PATH", help="Policy files or directories (searched recursively)."),
    ],
    output: Annotated[
        TextOrJson,
        typer.Option(
            "--output", "-o", "--format", metavar="text|json", help="text for people, json for machines."
        ),
    ] = TextOrJson.TEXT,
    policy_namespaces: PolicyNamespacesOption = PolicyNamespaces.DIRECTORY,
    secret_file_root: SecretFileRootOption = None,
    secret_env_allow: SecretEnvAllowOption = [],  # noqa: B006 - typer reads the default, never mutates it
    custom_promql_allow_metric: CustomPromqlAllowOption = [],  # noqa: B006
    custom_promql_tenancy_label: CustomPromqlLabelOption = [],  # noqa: B006
    scrape_interval: Annotated[
        float,
        typer.Option(
            min=0.001,
            envvar="PROMETHEUS_SCRAPE_INTERVAL",
            help="Scrape interval of the metrics the controller reads (s), as its own --scrape-interval: "
            "a window shorter than 4 intervals is warned about.",
        ),
    ] = 30.0,
) -> None:
    """Check policy files; exit 0 when all are valid, 1 when any is not, 2 on a usage error (a path
    that does not exist).

    A directory is a policy root: DIR/<namespace>/**/*.yaml, as the controller reads it.
    """
    from canary.cli.policies import promql_tenancy, validate_paths  # noqa: PLC0415 - lazy: start-up time

    tenancy = promql_tenancy(custom_promql_allow_metric, custom_promql_tenancy_label)
    validate_paths(
        paths,
        output.value,
        policy_namespaces.value,
        secret_file_root,
        secret_env_allow,
        scrape_interval,
        tenancy=tenancy,
    )


@app.command()
def schema(
    crd: Annotated[
        bool,
        typer.Option("--crd", help="Print the PromotionPolicy CustomResourceDefinition (YAML) instead."),
    ] = False,
) -> None:
    """Print the JSON Schema of the policy file (for yaml-language-server and editors)."""
    from canary.cli.policies import print_schema  # noqa: PLC0415 - lazy: start-up time

    print_schema(crd)


# ---------------------------------------------------------------------------------------------
# The controller


@app.command()
def run(
    ctx: typer.Context,
    policies: options.PoliciesOption = [Path("/etc/kserve-canary/policies")],  # noqa: B006 - read, never mutated
    kubeconfig: options.KubeconfigOption = None,
    prometheus_url: options.PrometheusUrlOption = "http://localhost:9090",
    prometheus_header: options.PrometheusHeaderOption = [],  # noqa: B006
    prometheus_token_file: options.PrometheusTokenFileOption = None,
    prometheus_ca_file: options.PrometheusCaFileOption = None,
    prometheus_timeout: options.PrometheusTimeoutOption = 10.0,
    scrape_interval: options.ScrapeIntervalOption = 30.0,
    namespace_query_budget: options.NamespaceQueryBudgetOption = 2.0,
    min_samples: options.MinSamplesOption = 20,
    namespace: options.NamespaceOption = [],  # noqa: B006
    metrics_port: options.MetricsPortOption = 8080,
    metrics_bind_address: options.MetricsBindAddressOption = None,
    leader_elect: options.LeaderElectOption = True,
    lease_name: options.LeaseNameOption = "kserve-canary",
    lease_namespace: options.LeaseNamespaceOption = "kserve-canary",
    lease_duration: options.LeaseDurationOption = 15.0,
    renew_deadline: options.RenewDeadlineOption = 10.0,
    retry_period: options.RetryPeriodOption = 2.0,
    shards: options.ShardsOption = 1,
    tick: options.TickOption = 5.0,
    dry_run: options.DryRunOption = False,
    log_format: options.LogFormatOption = options.LogFormat.AUTO,
    max_workers: options.MaxWorkersOption = 8,
    policy_namespaces: PolicyNamespacesOption = PolicyNamespaces.DIRECTORY,
    secret_file_root: SecretFileRootOption = None,
    secret_env_allow: SecretEnvAllowOption = [],  # noqa: B006
    custom_promql_allow_metric: CustomPromqlAllowOption = [],  # noqa: B006
    custom_promql_tenancy_label: CustomPromqlLabelOption = [],  # noqa: B006
    notify_allow_host: options.NotifyAllowHostOption = [],  # noqa: B006
    notify_retry_for: options.NotifyRetryForOption = "1h",
    notify_info_retry_for: options.NotifyInfoRetryForOption = "10m",
    policy_source: options.PolicySourceOption = "auto",
    allow_custom_promql_from_crds: options.AllowCustomPromqlFromCrdsOption = False,
    cluster_name: options.ClusterNameOption = "",
    dashboard_url: options.DashboardUrlOption = "",
) -> None:
    """Run the controller until SIGTERM."""
    from canary.cli import controller as flags  # noqa: PLC0415 - lazy: start-up time

    settings = flags.controller_settings(ctx.params)
    flags.run_controller(settings, kubeconfig=kubeconfig, log_format=log_format.value)


# ---------------------------------------------------------------------------------------------
# Operating rollouts

KubeconfigOption = Annotated[
    str | None,
    typer.Option(envvar="KUBECONFIG", metavar="FILE", help="Kubeconfig file; default: ~/.kube/config."),
]
ContextOption = Annotated[
    str | None, typer.Option("--context", metavar="NAME", help="The kubeconfig context to use.")
]
TargetArgument = Annotated[
    str,
    typer.Argument(
        metavar="NAME",
        help="The InferenceService: NAME (in -n's namespace, else the context's) or NAMESPACE/NAME.",
        show_default=False,
    ),
]
NamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace", "-n", metavar="NAMESPACE", help="Default: the kubeconfig context's, else default."
    ),
]


@app.command()
def status(
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]",
            help="One rollout (NAME or NAMESPACE/NAME); with --watch, follow it to its end.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            metavar="NAMESPACE",
            help="Only this namespace. Default: all of them (-A).",
        ),
    ] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")] = False,
    output: Annotated[
        StatusOutput,
        typer.Option(
            "--output",
            "-o",
            "--format",
            metavar="wide|json|yaml",
            help="wide: also the pending command; json or yaml for machines. Default: a table.",
            show_default=False,
        ),
    ] = StatusOutput.TEXT,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Print the table again whenever a rollout changes (Ctrl-C ends). With NAME: follow it "
            "until it ends; exit 0 promoted, 4 rolled back, 5 paused, 6 still under way at --timeout.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0, metavar="SECONDS", help="With NAME and --watch: give up after this; 0: never."),
    ] = 0.0,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """The rollouts, read from the controller's state ConfigMaps."""
    from canary.cli.rollouts import StatusScope, print_status  # noqa: PLC0415 - lazy: start-up time

    if all_namespaces and (namespace is not None or (name is not None and "/" in name)):
        raise typer.BadParameter("-A lists every namespace: leave out -n and NAMESPACE/", param_hint="-A")
    scope = StatusScope(name, namespace, all_namespaces, timeout)
    print_status(kubeconfig, context, scope, output.value, watch)


@app.command()
def explain(
    target: TargetArgument,
    output: Annotated[
        TextOrJson, typer.Option("--output", "-o", "--format", metavar="text|json", help="json for machines.")
    ] = TextOrJson.TEXT,
    prometheus_external_url: Annotated[
        str | None,
        typer.Option(
            envvar="PROMETHEUS_EXTERNAL_URL",
            metavar="URL",
            help="Prometheus as your browser reaches it: each check's query gets a graph link.",
        ),
    ] = None,
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """The latest evaluation of a rollout: each check's value, limit, stable value and canary PromQL."""
    from canary.cli.rollouts import print_explain  # noqa: PLC0415 - lazy: start-up time

    print_explain(target, namespace, kubeconfig, context, output.value, prometheus_external_url)


@app.command()
def report(
    target: TargetArgument,
    rollout: Annotated[
        str | None,
        typer.Option(
            "--rollout",
            metavar="N|REVISION",
            help="A past rollout: 1 the latest finished, 2 the one before, or its revision. "
            "Default: the one under way, else the latest.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Default: NAMESPACE-NAME-REVISION.html here."),
    ] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option(envvar="PROMETHEUS_URL", metavar="URL", help="Prometheus, for the checks' charts."),
    ] = None,
    no_charts: Annotated[
        bool, typer.Option("--no-charts", help="Do not ask Prometheus: steps, decisions and traffic only.")
    ] = False,
    policy: Annotated[
        list[Path],
        typer.Option(
            "--policy",
            metavar="PATH",
            help="The policy's file or directory (default: the PromotionPolicy object in the cluster).",
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    namespace: NamespaceOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """A self-contained HTML report of a rollout, current or past: steps, decisions, check charts."""
    from canary.cli.report import write_report  # noqa: PLC0415 - lazy: start-up time

    write_report(
        target,
        selector=rollout,
        output=output,
        prometheus_url=prometheus_url,
        no_charts=no_charts,
        policy_paths=policy,
        namespace=namespace,
        kubeconfig=kubeconfig,
        context=context,
    )


ReasonOption = Annotated[str | None, typer.Option(metavar="TEXT", help="Why, for the record.")]
WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        "--timeout",
        min=0,
        metavar="SECONDS",
        help="How long to wait for the controller's answer (it reads commands at its next evaluation); "
        "0: do not wait.",
    ),
]
NoWaitOption = Annotated[
    bool, typer.Option("--no-wait", help="Issue the command and exit 0 without waiting for the answer.")
]
RevisionOption = Annotated[
    str | None,
    typer.Option(
        metavar="REVISION",
        help="Refuse unless the rollout in progress is of this revision (default: the current).",
    ),
]
DEFAULT_WAIT = 90.0  # more than the default evaluation interval (60 s)


def _operator_command(kind: str, summary: str) -> None:
    """Register ``kind`` (pause, resume, approve, abort, promote): one signature, its own help."""

    def command(
        target: TargetArgument,
        reason: ReasonOption = None,
        wait: WaitOption = DEFAULT_WAIT,
        no_wait: NoWaitOption = False,
        revision: RevisionOption = None,
        namespace: NamespaceOption = None,
        kubeconfig: KubeconfigOption = None,
        context: ContextOption = None,
    ) -> None:
        from canary.cli.rollouts import CommandOptions, issue_command  # noqa: PLC0415 - lazy: start-up time
        from canary.rollout.state import CommandKind  # noqa: PLC0415

        options = CommandOptions(namespace, kubeconfig, context, reason, 0.0 if no_wait else wait, revision)
        issue_command(CommandKind(kind), target, options)

    command.__doc__ = summary
    app.command(kind)(command)


_operator_command(
    "pause",
    """Stop the rollout where it is (nothing is written to the InferenceService).

    Waits for the controller's answer and prints it. Exit 0: accepted; 1: refused, with the reason
    (at once when the CLI can tell: no rollout in progress, already paused, ...); 3: the controller
    did not answer within --wait (the command stays queued), or the cluster is unreachable.
    """,
)
_operator_command("resume", "Continue a paused rollout (exit codes as for pause).")
_operator_command(
    "approve", "Let a step with `approval: manual` proceed, now or when it passes (exit codes as for pause)."
)
_operator_command("abort", "Roll back now (canaryTrafficPercent: 0) (exit codes as for pause).")
_operator_command(
    "promote", "Skip the remaining steps and promote (once the canary is Ready) (exit codes as for pause)."
)


# ---------------------------------------------------------------------------------------------
# The dashboard


@app.command()
def dashboard(
    address: Annotated[str, typer.Option(metavar="ADDRESS", help="Listen on this address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", min=0, help="Listen on this port; 0: a free one.")] = 0,
    open_browser: Annotated[
        bool, typer.Option("--open/--no-browser", help="Open the page in a browser.")
    ] = True,
    namespace: Annotated[
        list[str],
        typer.Option("--namespace", "-n", metavar="NAMESPACE", help="Only these namespaces (repeatable)."),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    prometheus_url: Annotated[
        str | None,
        typer.Option(envvar="PROMETHEUS_URL", metavar="URL", help="Prometheus, for the checks' graphs."),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """A local web page of the rollouts, with their evidence and the operator commands (Ctrl-C ends)."""
    try:
        from canary.dashboard.server import run_dashboard  # noqa: PLC0415 - lazy: start-up time
    except ModuleNotFoundError as missing:
        if missing.name is None or not missing.name.startswith("canary.dashboard"):
            raise
        raise fail("error: the dashboard is not installed", EXIT_REFUSED) from None
    code = run_dashboard(
        kubeconfig=kubeconfig,
        context=context,
        namespaces=namespace,
        address=address,
        port=port,
        open_browser=open_browser,
        prometheus_url=prometheus_url,
    )
    raise typer.Exit(code)


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
    from rich.console import Console  # noqa: PLC0415 - lazy: start-up time

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


# Commands kept in modules of their own register themselves on `app` (Typer and the standard library
# only at import time, like this module).
from canary.cli import backtest as _backtest  # noqa: E402, F401
