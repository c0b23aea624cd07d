"""``validate`` and ``schema``: policy files checked as the controller reads them.

Imported by those commands only; no Kubernetes client here.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from canary.cli.help import EXIT_USAGE, fail
from canary.cli.output import printable
from canary.metrics.buckets import resolution_warnings
from canary.metrics.tenancy import Tenancy, parse_allow, parse_labels
from canary.metrics.windows import window_warnings
from canary.policy import PromotionPolicy, load_paths
from canary.policy.loader import format_loc, secret_refs
from canary.policy.scope import NamespaceSource, SecretScope, parse_env_allow
from canary.policy.units import format_duration
from canary.rollout.knative import policy_deadline_warning
from canary.rollout.sampled import horizon_requests

__all__ = ["print_schema", "promql_tenancy", "secret_scope", "validate_paths"]


def secret_scope(file_root: Path | None, env_allow: list[str]) -> SecretScope:
    try:
        allowed = parse_env_allow(env_allow)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--secret-env-allow") from None
    return SecretScope(file_root=file_root, env_allow=allowed)


def promql_tenancy(allow: list[str], labels: list[str]) -> Tenancy:
    """``--custom-promql-allow-metric`` and ``--custom-promql-tenancy-label``."""
    try:
        allowed = parse_allow(allow)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--custom-promql-allow-metric") from None
    try:
        named = parse_labels(labels)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--custom-promql-tenancy-label") from None
    return Tenancy(allow=allowed, labels=named)


def validate_paths(
    paths: list[Path],
    output: str,
    policy_namespaces: str,
    secret_file_root: Path | None,
    secret_env_allow: list[str],
    scrape_interval: float = 30.0,
    tenancy: Tenancy | None = None,
) -> None:
    missing = [path for path in paths if not path.exists()]
    if missing:
        # A path that is not there is a mistake on the command line (exit 2), not an invalid policy.
        raise fail(
            f"error: {', '.join(str(path) for path in missing)}: no such file or directory",
            EXIT_USAGE,
        )
    # Which secrets a namespace may read is the controller's setting: without it on the command line,
    # validate checks the policy and says what it left to the controller instead of refusing it.
    checked = secret_file_root is not None or bool(secret_env_allow)
    result = load_paths(
        paths,
        namespaces=NamespaceSource(policy_namespaces),
        secrets=secret_scope(secret_file_root, secret_env_allow) if checked else None,
        promql=(tenancy or Tenancy()).refusals,
    )
    errors = sorted(result.errors, key=lambda error: error.sort_key)
    if output == "json":
        document = {
            "valid": result.ok,
            "files": result.files,
            "policies": [
                {
                    "name": loaded.policy.metadata.name,
                    "target": loaded.policy.key,
                    "path": loaded.path,
                    "line": loaded.line,
                    "horizons": horizons(loaded.policy),
                    "atHorizon": loaded.policy.spec.at_horizon.value,
                    "horizonRequests": horizon_requests(loaded.policy),
                    "warnings": policy_warnings(loaded.policy, scrape_interval),
                    "notChecked": [] if checked else unchecked_secrets(loaded.policy),
                }
                for loaded in result.policies
            ],
            "errors": [error.as_dict() for error in errors],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        lines = [str(error) for error in errors]
        for loaded in result.policies:
            lines.append(f"ok  {loaded.origin}: {loaded.policy.metadata.name} -> {loaded.policy.key}")
            lines += [f"    {line}" for line in judge_advice(loaded.policy, scrape_interval)]
            if not checked:
                lines += [f"    not checked here: {line}" for line in unchecked_secrets(loaded.policy)]
        summary = f"{len(result.policies)} valid {'policy' if len(result.policies) == 1 else 'policies'}"
        summary += f", {len(errors)} {'error' if len(errors) == 1 else 'errors'}"
        summary += f" in {len(result.files)} {'file' if len(result.files) == 1 else 'files'}"
        lines.append(summary)
        typer.echo(printable("\n".join(lines)))
    raise typer.Exit(0 if result.ok else 1)


def policy_warnings(policy: PromotionPolicy, scrape_interval: float = 30.0) -> list[str]:
    """What may keep the policy from judging what it means: limits no bucket edge resolves, windows
    the scrapes cannot cover, a progressDeadline Knative does not wait for."""
    beyond_knative = policy_deadline_warning(policy.spec.progress_deadline)
    return (
        resolution_warnings(policy)
        + window_warnings(policy, scrape_interval)
        + ([beyond_knative] if beyond_knative else [])
    )


def unchecked_secrets(policy: PromotionPolicy) -> list[str]:
    """The secret references whose scope only the controller's flags decide, each with that flag."""
    lines = []
    for loc, ref in secret_refs(policy):
        if ref.env is not None:
            flag = f"--secret-env-allow {policy.metadata.namespace}=GLOB"
            lines.append(f"{format_loc((*loc, 'env'))} {ref.env}: the controller's {flag} decides")
        else:
            flag = f"--secret-file-root (file {ref.file} under DIR/{policy.metadata.namespace}/)"
            lines.append(f"{format_loc((*loc, 'file'))}: the controller's {flag} decides")
    return lines


def judge_advice(policy: PromotionPolicy, scrape_interval: float = 30.0) -> list[str]:
    """What a policy author should know before the first rollout: when each step is decided at the
    latest, what a horizon estimate rests on, and limits the bucket layouts cannot resolve."""
    spec = policy.spec
    steps = ", ".join(f"{step['weight']}% by {format_duration(step['horizon'])}" for step in horizons(policy))
    then = "decided on their estimate" if spec.at_horizon.value == "decide" else "paused for a person"
    lines = [
        f"horizons: every step decided by its horizon of evidence time at the latest ({steps}); there, "
        f"undecided checks are {then}"
    ]
    for name, size in horizon_requests(policy).items():
        if size is not None:
            lines.append(
                f"{name}: a horizon estimate rests on at least {size:,} canary requests of its step "
                f"(a share half or twice the allowed is judged right at {spec.confidence:.0%})"
            )
    lines.extend(f"warning: {warning}" for warning in policy_warnings(policy, scrape_interval))
    return lines


def horizons(policy: PromotionPolicy) -> list[dict[str, float]]:
    """Per held step, its weight and horizon in seconds of evidence time."""
    spec = policy.spec
    return [{"weight": step.weight, "horizon": spec.step_horizon(step)} for step in spec.canary_steps]


def print_schema(crd: bool) -> None:
    if crd:
        from canary.policy.crd import crd_yaml  # noqa: PLC0415 - --crd only

        typer.echo(crd_yaml(), nl=False)
        return
    from canary.policy.schema import policy_json_schema  # noqa: PLC0415 - the schema only

    typer.echo(json.dumps(policy_json_schema(), indent=2, sort_keys=True))
