"""Generate docs/policy-reference.md from the policy's JSON Schema (the one `kserve-canary schema` prints).

    python docs/tools/policy_reference.py           # rewrite docs/policy-reference.md
    python docs/tools/policy_reference.py --check   # exit 1 if it is stale (tests/deploy/test_docs.py)

Every field of every object in the schema gets a row: its type as written in a policy file, whether
it is required or its default, its constraints and its description. Defaults the schema cannot
express (lists and objects built by a factory) are read from the model itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from canary.metrics.catalog import KIND_FAMILY
from canary.policy.model import MetricKind, PromotionPolicy
from canary.policy.schema import SCHEMA_ID, policy_json_schema

TARGET = Path(__file__).resolve().parents[1] / "policy-reference.md"

# Sections in reading order: (schema $defs name or "", path shown, introduction).
SECTIONS = [
    (
        "",
        "",
        "The file: one policy per model, in YAML (several documents per file are allowed; a file with "
        "any invalid document is rejected whole). It lives in its namespace's directory, "
        "`<policy dir>/<namespace>/**/*.yaml`: the directory decides which namespace it may govern "
        "(see [notifications.md](notifications.md#secrets-and-namespaces)).",
    ),
    (
        "Metadata",
        "metadata",
        "Which policy this is. The namespace is the InferenceService's, and the policy directory's: "
        "omit it, or write the same.",
    ),
    ("PolicySpec", "spec", "How rollouts of the target's new revisions proceed."),
    ("Target", "spec.target", "The InferenceService this policy governs (at most one policy each)."),
    (
        "Step",
        "spec.steps[]",
        "A step is a weight (`30`) or an object. A final `100` is the promotion: when the step "
        "before it passes, the controller removes `canaryTrafficPercent`.",
    ),
    ("OnNoData", "spec.onNoData", "What happens when evaluations stay inconclusive (no data)."),
    ("MetricsSpec", "spec.metrics", "Metric profiles (see [metric-profiles.md](metric-profiles.md))."),
    (
        "MetricLabels",
        "spec.metrics.labels",
        "Label names replacing those of a family's label style, each a Prometheus label name "
        "(see [metric-profiles.md](metric-profiles.md#label-styles-scraped-otlp-exported)).",
    ),
    ("JoinLabelNames", "spec.metrics.labels.requests", "Also `spec.metrics.labels.gpu`."),
    ("KubeStateLabelNames", "spec.metrics.labels.kubeStateMetrics", "kube-state-metrics' labels."),
    (
        "Check",
        "spec.checks[]",
        "One measured quantity with at least one limit: a builtin `metric` or a custom `promql` template.",
    ),
    ("NotifyTarget", "spec.notify[]", "Where decisions are announced besides Kubernetes Events."),
    ("SlackTarget", "spec.notify[].slack", "A Slack incoming webhook."),
    ("TeamsTarget", "spec.notify[].teams", "A Microsoft Teams Workflows webhook (an Adaptive Card)."),
    ("DiscordTarget", "spec.notify[].discord", "A Discord channel webhook."),
    (
        "WebhookTarget",
        "spec.notify[].webhook",
        "A generic JSON webhook (see [notifications.md](notifications.md)).",
    ),
    (
        "Gate",
        "spec.gates[]",
        "A webhook the rollout waits for (see [gates.md](gates.md)): before the first step "
        "(`pre-rollout`), at every held step once it passed (`step`), or before the promotion "
        "(`pre-promotion`). 2xx passes; anything else is retried and holds, until `deadline`, then "
        "`failurePolicy`.",
    ),
    ("GateWebhook", "spec.gates[].webhook", "Where a gate is called, how it is signed, how long one call may take."),
    (
        "SecretRef",
        "SecretRef",
        "`webhookUrlFrom`, `urlFrom`, `secretFrom`: a secret by reference, exactly one of `env` or `file`. "
        "Scoped to the policy's namespace: `file` is relative to `<secret file root>/<namespace>/`, "
        "`env` must be allowed for the namespace with `--secret-env-allow NAMESPACE=GLOB`; anything else "
        "is refused (see [notifications.md](notifications.md#secrets-and-namespaces)).",
    ),
]
ANCHORS = {name: path for name, path, _ in SECTIONS if name}

# What each builtin metric measures (the rest of its row comes from the code).
MEASURES = {
    MetricKind.LATENCY: "request latency quantile at Knative's queue-proxy",
    MetricKind.ERROR_RATE: "5xx responses / all responses",
    MetricKind.OOM_KILLS: "container restarts whose last termination reason is OOMKilled (kserve-container "
    "and the storage-initializer init container)",
    MetricKind.RESTARTS: "container restarts of any reason (a CUDA out-of-memory usually exits with an error "
    "code, not OOMKilled)",
    MetricKind.GPU_MEMORY_PEAK: "DCGM framebuffer used, peak over the window (bytes); `maxFraction` "
    "compares used / (used + free + reserved)",
    MetricKind.KV_CACHE_USAGE: "vLLM KV-cache usage, peak over the window",
    MetricKind.WARMUP_TIME: "pod created -> Ready, the slowest pod of the revision",
    MetricKind.TTFT: "vLLM time to first token quantile",
    MetricKind.E2E_LATENCY: "vLLM end-to-end request latency quantile",
}


def metric_table() -> list[str]:
    out = [
        "| `metric` | unit | `quantile` | `maxIncrease` | exporter | measures |",
        "|---|---|---|---|---|---|",
    ]
    for kind in MetricKind:
        out.append(
            f"| `{kind.value}` | {kind.unit.value} | {'yes' if kind.has_quantile else '—'}"
            f" | {'yes' if kind.comparable_to_stable else 'no (absolute limits only)'}"
            f" | {KIND_FAMILY[kind.value].value} | {MEASURES[kind]} |"
        )
    return out


def _anchor(path: str) -> str:
    return "".join(c for c in path.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _link(name: str) -> str:
    path = ANCHORS[name]
    return f"[{name}](#{_anchor(path)})"


def _is_duration(node: dict[str, Any]) -> bool:
    return any("(ms|s|m|h|d)" in str(option.get("pattern", "")) for option in node.get("anyOf", []))


def _is_ratio(node: dict[str, Any]) -> bool:
    return any(str(option.get("pattern", "")).endswith("%$") for option in node.get("anyOf", []))


def _without_null(node: dict[str, Any]) -> dict[str, Any]:
    options = [o for o in node.get("anyOf", []) if o.get("type") != "null"]
    if "anyOf" in node and len(options) == 1:
        return {**options[0], **{k: v for k, v in node.items() if k not in {"anyOf", "type"}}}
    return node


def type_of(node: dict[str, Any]) -> str:
    node = _without_null(node)
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        referenced = policy_json_schema()["$defs"][name]
        return type_of(referenced) if "enum" in referenced else _link(name)
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
    if _is_duration(node):
        return "duration"
    if _is_ratio(node):
        return "percentage or fraction"
    if "anyOf" in node:
        kinds = {o.get("type") for o in node["anyOf"]}
        if kinds == {"number", "string"}:
            return "number or quantity"
        return " or ".join(type_of(o) for o in node["anyOf"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {type_of(node.get('items', {}))}"
    if kind == "object" and "additionalProperties" in node and isinstance(node["additionalProperties"], dict):
        return f"map of {type_of(node['additionalProperties'])}"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}.get(
        str(kind), str(kind)
    )


def constraints(node: dict[str, Any]) -> list[str]:
    node = _without_null(node)
    found = []
    for option in [node, *node.get("anyOf", [])]:
        if "minimum" in option and "maximum" in option:
            found.append(f"{option['minimum']}..{option['maximum']}")
        elif "minimum" in option and not _is_duration(node) and not _is_ratio(node):
            found.append(f"≥ {option['minimum']}")
        if "exclusiveMinimum" in option and "exclusiveMaximum" in option:
            found.append(f"between {option['exclusiveMinimum']} and {option['exclusiveMaximum']} (exclusive)")
        if (
            option.get("type") == "string"
            and "pattern" in option
            and not (_is_duration(node) or _is_ratio(node))
        ):
            found.append(f"matches `{option['pattern']}`")
    if "minItems" in node:
        found.append(f"at least {node['minItems']}")
    return found


def _seconds(value: float) -> str:
    if value == 0:
        return "0s"
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value}s"


def _format_default(value: Any, node: dict[str, Any]) -> str:
    if _is_duration(_without_null(node)) and isinstance(value, int | float):
        return f"`{_seconds(float(value))}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list) and all(isinstance(v, dict) and set(v) >= {"weight"} for v in value):
        return "`[" + ", ".join(str(v["weight"]) for v in value) + "]`"
    if value in ({}, []):
        return f"`{value}`"
    if isinstance(value, dict):
        return "see below"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _model_defaults() -> dict[str, Any]:
    """Defaults of a minimal policy, as the model fills them in (by alias, JSON mode)."""
    minimal = {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {
            "target": {"inferenceService": "x"},
            "checks": [{"name": "c", "metric": "restarts", "max": 0}],
        },
    }
    return PromotionPolicy.model_validate(minimal).model_dump(mode="json", by_alias=True)


def rows(name: str, schema: dict[str, Any], defaults: dict[str, Any]) -> Iterator[str]:
    definition = schema if not name else schema["$defs"][name]
    required = set(definition.get("required", []))
    for field, node in sorted(
        definition.get("properties", {}).items(), key=lambda item: item[0] not in required
    ):
        if field in required:
            default = "**required**"
        elif "default" in node and node["default"] is not None:
            default = _format_default(node["default"], node)
        elif field in defaults and defaults[field] is not None:
            default = _format_default(defaults[field], node)
        else:
            default = "—"
        description = " ".join(str(node.get("description", "")).split())
        extra = constraints(node)
        if extra:
            description = (description + " " if description else "") + "(" + "; ".join(extra) + ")"
        yield f"| `{field}` | {type_of(node)} | {default} | {description} |"


def render() -> str:
    schema = policy_json_schema()
    model_defaults = _model_defaults()
    section_defaults = {"": model_defaults, "PolicySpec": model_defaults["spec"]}
    section_defaults["OnNoData"] = model_defaults["spec"]["onNoData"]
    section_defaults["MetricsSpec"] = model_defaults["spec"]["metrics"]
    out = [
        "# Policy reference",
        "",
        "<!-- Generated by docs/tools/policy_reference.py from the policy JSON Schema; do not edit by hand."
        " tests/deploy/test_docs.py fails when this file is stale. -->",
        "",
        f"Every field of a `PromotionPolicy` (`{SCHEMA_ID}`), generated from the JSON Schema that "
        "`kserve-canary schema` prints and [`policies/schema.json`](../policies/schema.json) commits. "
        "Check files exactly as the controller reads them with `kserve-canary validate DIR`.",
        "",
        "Values are normalised when a file is read:",
        "",
        "* **duration** — `250ms`, `90s`, `10m`, `1h30m`, `1d`, or a number of seconds;",
        "* **percentage or fraction** — `20%` or `0.2`;",
        "* **number or quantity** — a limit in the metric's unit: `800ms` (seconds), `1%` (a ratio), "
        "`70Gi` / `512Mi` (bytes), `0` (a count).",
        "",
        "Where a peer reads a bare number in another unit, the unit is required: a latency limit "
        "(`latency`, `ttft`, `e2e-latency`) is `800ms` or `0.8s`, never `800` (Flagger's milliseconds, "
        "13m20s here), and a ratio limit of 1 or more (`max: 1` is 100 % here, 1 % in Flagger) or a "
        "bare `maxIncrease` above 1 is refused with the percentage to write.",
        "",
        "Unknown fields are errors everywhere: a typo never silently disables a check.",
        "",
        "Contents: "
        + ", ".join(
            f"[`{path or 'PromotionPolicy'}`](#{_anchor(path or 'PromotionPolicy')})"
            for _, path, _ in SECTIONS
        )
        + ".",
    ]
    for name, path, intro in SECTIONS:
        title = path or "PromotionPolicy"
        definition = schema if not name else schema["$defs"][name]
        out += ["", f"## {title}", "", intro]
        if definition.get("description") and name not in {"", "Step"}:
            out += ["", " ".join(definition["description"].split())]
        out += ["", "| field | type | default | meaning |", "|---|---|---|---|"]
        out += list(rows(name, schema, section_defaults.get(name, {})))
    out += [
        "",
        "## Builtin metrics",
        "",
        "`maxIncrease` needs the stable revision to have the same metric over the same window;",
        "restarts, OOM kills and warm-up of the stable revision happened long before, so they take",
        "absolute limits only. Which exporter's series a metric reads, per install, is in",
        "[metric-profiles.md](metric-profiles.md).",
        "",
        *metric_table(),
    ]
    enums = [(n, d) for n, d in schema["$defs"].items() if "enum" in d]
    out += ["", "## Enumerations", ""]
    for enum_name, definition in sorted(enums):
        values = ", ".join(f"`{value}`" for value in definition["enum"])
        description = " ".join(str(definition.get("description", "")).split())
        out.append(f"* **{enum_name}**: {values}." + (f" {description}" if description else ""))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is stale: run python docs/tools/policy_reference.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
