"""The PromotionPolicy CRD's schema against the policy file's models (canary.policy.crd).

* The generated ``openAPIV3Schema`` is structural (checked by :func:`structural_problems`, the rules
  of the Kubernetes docs' "Specifying a structural schema").
* Every example policy in the repository (policies/, docs/, deploy/, charts/, the README) is accepted
  by pydantic *and* by the API server's view of the CRD (:func:`api_server_problems`: the OpenAPI
  value validations, evaluated by ``jsonschema`` as draft 4 — OpenAPI 3.0's boolean
  ``exclusiveMinimum`` — plus the CEL rules, evaluated by cel-python, and list-map keys).
* Every field of the models is a field of the CRD at the same path with the same type, except where
  ``DIVERGENCES`` says otherwise (and nothing there is stale); the docs list every divergence.
* The status model's vocabulary is the rollout core's.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from canary.cli import app
from canary.policy.crd import (
    CEL_RULES,
    DIVERGENCES,
    PRINTER_COLUMNS,
    SERVER_SET_METADATA,
    SHORT_NAMES,
    DivergenceKind,
    crd_manifest,
    policy_document,
    walk_properties,
)
from canary.policy.model import API_VERSION, KIND, PolicySpec, PromotionPolicy
from canary.policy.status import (
    CheckStatus,
    CheckVerdict,
    Condition,
    ConditionStatus,
    ConditionType,
    DecisionAction,
    DecisionVerdict,
    LastDecision,
    PolicyPhase,
    PromotionPolicyStatus,
    set_condition,
    step_text,
)
from canary.rollout import state as rollout_state
from canary.rollout import vocabulary
from tests.policy.support import valid_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TREES = ("policies", "docs", "deploy", "charts")
SCHEMA: dict[str, Any] = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
_CEL = celpy.Environment()

# ---------------------------------------------------------------------------------------------
# What the API server does with an object, as far as the schema decides it


def structural_problems(node: Mapping[str, Any], path: str = "") -> list[str]:
    """The structural-schema rules: a type on every node (but int-or-string and preserve-unknown-fields
    ones), no type/description/default/nullable/additionalProperties inside a junctor (but the
    int-or-string pattern), properties xor additionalProperties, no $ref/const/additionalProperties:
    false, OpenAPI 3.0's boolean exclusive bounds, list-map keys required."""
    where = path or "<root>"
    problems = []
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    for key in ("$ref", "$defs", "definitions", "const", "oneOf", "not", "allOf"):
        if key in node:
            problems.append(f"{where}: {key}")
    if "type" not in node and not (int_or_string or preserve):
        problems.append(f"{where}: no type")
    if node.get("additionalProperties") is False:
        problems.append(f"{where}: additionalProperties: false")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{where}: properties and additionalProperties")
    if ("properties" in node or "items" in node) and "type" not in node:
        problems.append(f"{where}: fields or items on an untyped node")
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node and not isinstance(node[bound], bool):
            problems.append(f"{where}: {bound} must be a boolean in OpenAPI 3.0")
    if "anyOf" in node and (not int_or_string or node["anyOf"] != [{"type": "integer"}, {"type": "string"}]):
        problems.append(f"{where}: anyOf other than the int-or-string pattern")
    if int_or_string and "type" in node:
        problems.append(f"{where}: int-or-string with a type")
    if node.get("x-kubernetes-list-type") == "map":
        items = node.get("items") or {}
        for key in node.get("x-kubernetes-list-map-keys") or []:
            if key not in (items.get("required") or []):
                problems.append(f"{where}: list-map key {key} is not required")
    for name, child in (node.get("properties") or {}).items():
        problems.extend(structural_problems(child, f"{path}.{name}" if path else name))
    if isinstance(node.get("items"), Mapping):
        problems.extend(structural_problems(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), Mapping):
        problems.extend(structural_problems(node["additionalProperties"], f"{path}.*"))
    return problems


def prune(value: Any, node: Mapping[str, Any]) -> Any:
    """The API server's pruning of fields the schema does not name (not under preserve-unknown-fields)."""
    if isinstance(value, dict):
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties is None and not isinstance(extra, Mapping):
            return value if node.get("x-kubernetes-preserve-unknown-fields") else {}
        kept = {}
        for key, child in value.items():
            if properties is not None and key in properties:
                kept[key] = prune(child, properties[key])
            elif isinstance(extra, Mapping):
                kept[key] = prune(child, extra)
            elif node.get("x-kubernetes-preserve-unknown-fields"):
                kept[key] = child
        return kept
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [prune(item, node["items"]) for item in value]
    return value


def _nodes(
    value: Any, node: Mapping[str, Any], path: str = ""
) -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    yield path, value, node
    if isinstance(value, dict):
        for key, child in value.items():
            schema = (node.get("properties") or {}).get(key)
            if schema is not None:
                yield from _nodes(child, schema, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _nodes(item, node["items"], f"{path}[{index}]")


def api_server_problems(obj: Mapping[str, Any]) -> list[str]:
    """Why the API server would refuse ``obj`` (empty: it stores it)."""
    body = {key: value for key, value in obj.items() if key != "metadata"}  # ObjectMeta: the server's own
    body = prune(
        body, {**SCHEMA, "properties": {k: v for k, v in SCHEMA["properties"].items() if k != "metadata"}}
    )
    problems = [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in jsonschema.Draft4Validator(SCHEMA).iter_errors(body)
    ]
    for path, value, node in _nodes(body, SCHEMA):
        for validation in node.get("x-kubernetes-validations") or []:
            if isinstance(value, dict) and not cel(validation["rule"], value):
                problems.append(f"{path}: {validation['message']}")
        keys = node.get("x-kubernetes-list-map-keys")
        if keys and isinstance(value, list):
            seen = [tuple(item.get(key) for key in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                problems.append(f"{path}: Duplicate value")
    return problems


def cel(rule: str, value: Mapping[str, Any]) -> bool:
    return bool(_CEL.program(_CEL.compile(rule)).evaluate({"self": celpy.json_to_cel(dict(value))}))


def pydantic_problems(document: Mapping[str, Any]) -> list[str]:
    try:
        PromotionPolicy.model_validate(document)
    except ValidationError as error:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()]
    return []


# ---------------------------------------------------------------------------------------------
# Every example policy in the repository


def _policy_documents(text: str) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(text):
        if (
            isinstance(document, dict)
            and document.get("kind") == KIND
            and document.get("apiVersion") == API_VERSION
        ):
            yield document


def example_policies() -> list[tuple[str, dict[str, Any]]]:
    found = []
    files = [ROOT / "README.md"]
    for tree in EXAMPLE_TREES:
        files.extend(sorted(p for p in (ROOT / tree).rglob("*") if p.suffix in {".yaml", ".yml", ".md"}))
    for path in files:
        text = path.read_text()
        if "kind: PromotionPolicy" not in text:
            continue
        blocks = re.findall(r"```ya?ml\n(.*?)```", text, flags=re.DOTALL) if path.suffix == ".md" else [text]
        for block in blocks:
            for index, document in enumerate(_policy_documents(block)):
                metadata = document.setdefault("metadata", {})
                # A file may leave the namespace to its directory (policies/<namespace>/...); an object
                # always has one (kubectl fills in the current namespace).
                metadata.setdefault("namespace", path.parent.name)
                found.append((f"{path.relative_to(ROOT)}#{index}", document))
    return found


EXAMPLES = example_policies()


def test_the_examples_are_found() -> None:
    sources = {label.split("#")[0] for label, _ in EXAMPLES}
    assert {
        "README.md",
        "docs/design/policy.md",
        "docs/gitops.md",
        "policies/examples/ml/llm-vllm.yaml",
    } <= sources
    assert any(label.startswith("deploy/base/policies/") for label in sources)


@pytest.mark.parametrize(("label", "document"), EXAMPLES, ids=[label for label, _ in EXAMPLES])
def test_every_example_policy_is_accepted_by_the_models_and_the_crd(
    label: str, document: dict[str, Any]
) -> None:
    assert pydantic_problems(policy_document(document)) == [], label
    assert api_server_problems(document) == [], label


# ---------------------------------------------------------------------------------------------
# The schema itself


def test_the_crd_schema_is_structural() -> None:
    assert structural_problems(SCHEMA) == []


def test_the_structural_check_catches_what_kubernetes_refuses() -> None:
    assert structural_problems(
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "number"}, {"type": "string"}]}}}
    ) == [
        "a: no type",
        "a: anyOf other than the int-or-string pattern",
    ]
    assert structural_problems({"type": "object", "additionalProperties": False}) == [
        "<root>: additionalProperties: false"
    ]
    assert structural_problems({"type": "number", "exclusiveMinimum": 0}) == [
        "<root>: exclusiveMinimum must be a boolean in OpenAPI 3.0"
    ]


def _model_nodes(
    schema: Mapping[str, Any], definitions: Mapping[str, Any], path: str
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, node) for every field of a pydantic JSON Schema, Optional unwrapped, $refs inlined."""
    while "$ref" in schema:
        schema = {
            **definitions[schema["$ref"].rsplit("/", 1)[-1]],
            **{k: v for k, v in schema.items() if k != "$ref"},
        }
    branches = [branch for branch in schema.get("anyOf", []) if branch != {"type": "null"}]
    if len(branches) == 1:
        yield from _model_nodes(
            {**branches[0], **{k: v for k, v in schema.items() if k != "anyOf"}}, definitions, path
        )
        return
    yield path, schema
    for branch in branches:  # a union: its object branch's fields are fields too (spec.steps[].window)
        if "$ref" in branch:
            for sub_path, node in _model_nodes(branch, definitions, path):
                if sub_path != path:
                    yield sub_path, node
    for name, child in (schema.get("properties") or {}).items():
        yield from _model_nodes(child, definitions, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from _model_nodes(schema["items"], definitions, f"{path}[]")


def model_fields() -> dict[str, Mapping[str, Any]]:
    fields: dict[str, Mapping[str, Any]] = {}
    for model, path, mode in (
        (PolicySpec, "spec", "validation"),
        (PromotionPolicyStatus, "status", "serialization"),
    ):
        schema = model.model_json_schema(by_alias=True, mode=mode)  # type: ignore[attr-defined]
        fields.update(_model_nodes(schema, schema.get("$defs", {}), path))
    return fields


def crd_fields() -> dict[str, Mapping[str, Any]]:
    return {
        path: node
        for part in ("spec", "status")
        for path, node in walk_properties(SCHEMA["properties"][part], part)
    }


def test_every_field_of_the_models_is_in_the_crd_and_nothing_else() -> None:
    models, crds = model_fields(), crd_fields()
    untyped = {d.path for d in DIVERGENCES if d.kind is DivergenceKind.ANY_VALUE}
    # A field below an untyped node (the step object's window) is not spelled out in the CRD.
    missing = {path for path in set(models) - set(crds) if not any(path.startswith(f"{u}.") for u in untyped)}
    assert missing == set()
    assert set(crds) - set(models) == set(), "the CRD has fields the models do not"
    assert {"spec.steps[].window", "spec.steps[].approval", "spec.checks[].maxIncrease"} <= set(models)


def test_every_field_has_the_models_type_unless_a_divergence_says_otherwise() -> None:
    models, crds = model_fields(), crd_fields()
    documented = {d.path: d.kind for d in DIVERGENCES if d.kind is not DivergenceKind.GLOBAL}
    for path, crd_node in crds.items():
        model_node = models[path]
        kind = documented.get(path)
        if kind is DivergenceKind.DURATION:
            assert crd_node.get("x-kubernetes-int-or-string") is True, path
            assert {b.get("type") for b in model_node["anyOf"]} == {"string", "number"}, path
        elif kind is DivergenceKind.ANY_VALUE:
            assert "type" not in crd_node and crd_node["x-kubernetes-preserve-unknown-fields"] is True, path
        else:
            assert crd_node.get("type") == model_node.get("type"), path
            assert crd_node.get("enum") == model_node.get(
                "enum", [model_node["const"]] if "const" in model_node else None
            ), path
            assert crd_node.get("pattern") == model_node.get("pattern"), path
            assert crd_node.get("required") == model_node.get("required"), path


def test_unknown_fields_are_pruned_everywhere_but_the_documented_untyped_nodes() -> None:
    """Issue #34, finding 3: a namespace editor cannot store data of its own in a PromotionPolicy for
    the controller to cache; only the unions of DIVERGENCES are untyped (one value each)."""
    document = yaml.safe_load(valid_policy())
    document["spec"]["checks"][0]["maxIncrase"] = "20%"
    document["spec"]["onNoData"] = {"after": "5m", "actoin": "pause"}
    document["spec"]["timeout"] = "1h"
    document["spec"]["payload"] = {"blob": "x" * 1_000_000}
    document["status"] = {"phase": "Idle", "mood": "fine"}
    stored = prune(document, SCHEMA)
    assert "maxIncrase" not in stored["spec"]["checks"][0]
    assert stored["spec"]["onNoData"] == {"after": "5m"}
    assert "timeout" not in stored["spec"]
    assert "payload" not in stored["spec"]
    assert stored["status"] == {"phase": "Idle"}
    assert api_server_problems(document) == []
    untyped = {
        path for path, node in walk_properties(SCHEMA) if node.get("x-kubernetes-preserve-unknown-fields")
    }
    documented = {d.path for d in DIVERGENCES if d.kind is DivergenceKind.ANY_VALUE}
    assert untyped == documented


@pytest.mark.parametrize(
    ("spec_change", "file_ok", "crd_ok"),
    [
        ({"interval": 1.5, "window": 600}, True, False),  # a fraction of a second: write "1500ms"
        ({"interval": "1500ms", "window": 600}, True, True),
        ({"window": "10m", "interval": 60, "bake": 0}, True, True),
        ({"confidence": 0.9}, True, True),
        ({"confidence": "90%"}, True, True),
        ({"confidence": 2}, False, True),  # untyped in the CRD: the controller refuses it
        ({"steps": [10, {"weight": 50, "window": "20m"}, 100]}, True, True),
        ({"steps": [50, 10]}, False, True),  # increasing order: the controller's
        ({"window": "ten minutes"}, False, False),
        ({"minRequests": -1}, False, False),
    ],
)
def test_documented_divergences_behave_as_documented(
    spec_change: dict[str, Any], file_ok: bool, crd_ok: bool
) -> None:
    document = yaml.safe_load(valid_policy())
    document["spec"].update(spec_change)
    assert (pydantic_problems(document) == []) is file_ok
    assert (api_server_problems(document) == []) is crd_ok


def test_the_docs_list_every_divergence() -> None:
    text = (ROOT / "docs" / "gitops.md").read_text()
    for divergence in DIVERGENCES:
        if divergence.kind is not DivergenceKind.GLOBAL:
            assert f"`{divergence.path}`" in text, divergence.path
    for rule in CEL_RULES:
        assert rule.rule in text, rule.rule
    assert "x-kubernetes-preserve-unknown-fields" in text
    assert f"`{SHORT_NAMES[0]}`" in text


# ---------------------------------------------------------------------------------------------
# CEL rules: each says what its model_validator says


def _check(**fields: Any) -> dict[str, Any]:
    return {"name": "c", **fields}


def _with(document: dict[str, Any], **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    changed["spec"].update(spec)
    return changed


CEL_CASES = [
    ("both metric and promql", {"checks": [_check(metric="latency", promql="up{pod='{{ revision }}'}", max="1s")]}, "exactly one of 'metric'"),
    ("neither metric nor promql", {"checks": [_check(max=1)]}, "exactly one of 'metric'"),
    ("no limit", {"checks": [_check(metric="latency")]}, "needs a limit"),
    ("minStable alone", {"checks": [_check(metric="latency", max="1s", minStable="10ms")]}, "floor of 'maxIncrease'"),
    ("both slack and webhook", {"notify": [{"slack": {"webhookUrlFrom": {"env": "A"}}, "webhook": {"urlFrom": {"env": "B"}}}]}, "exactly one of 'slack'"),
    ("neither slack nor webhook", {"notify": [{"minSeverity": "warning"}]}, "exactly one of 'slack'"),
    ("env and file", {"notify": [{"slack": {"webhookUrlFrom": {"env": "A", "file": "a"}}}]}, "exactly one of 'env'"),
    ("no secret source", {"notify": [{"webhook": {"urlFrom": {"env": "B"}, "secretFrom": {}}}]}, "exactly one of 'env'"),
    ("a check name twice", {"checks": [_check(metric="latency", max="1s"), _check(metric="error-rate", max="1%")]}, "Duplicate value"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "spec", "message"), CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_the_crd_refuses_what_the_models_refuse_for_each_rule(
    case: str, spec: dict[str, Any], message: str
) -> None:
    document = _with(yaml.safe_load(valid_policy()), **spec)
    assert pydantic_problems(document), case
    problems = api_server_problems(document)
    assert any(message in problem for problem in problems), problems


def test_every_cel_rule_is_exercised_and_compiles() -> None:
    for rule in CEL_RULES:
        _CEL.compile(rule.rule)
        assert any(
            rule.message.startswith(message) or message in rule.message for _, _, message in CEL_CASES
        ), rule
    # Valid counterparts pass every rule.
    good = _with(
        yaml.safe_load(valid_policy()),
        checks=[
            _check(promql="x{pod=~'{{ revision }}'}", unit="seconds", max=1, maxIncrease="5%", minStable=0.1)
        ],
        notify=[{"webhook": {"urlFrom": {"file": "hook/url"}, "secretFrom": {"env": "KEY"}}}],
    )
    assert api_server_problems(good) == []


# ---------------------------------------------------------------------------------------------
# The status model


def full_status() -> PromotionPolicyStatus:
    now = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)
    conditions: list[Condition] = []
    for type_, status, reason in [
        (ConditionType.POLICY_VALID, True, "Valid"),
        (ConditionType.CONFLICT, False, "NoConflict"),
        (ConditionType.PROMOTED, False, "Progressing"),
        (ConditionType.ROLLED_BACK, False, "NotRolledBack"),
        (ConditionType.RECONCILING, True, "Progressing"),
        (ConditionType.STALLED, False, "Progressing"),
        (ConditionType.READY, False, "Progressing"),
    ]:
        conditions = set_condition(
            conditions,
            Condition.of(
                type_, status, reason, "revision llama-predictor-00002 holds step 2/3 at 30%", now, 4
            ),
        )
    return PromotionPolicyStatus(
        observed_generation=4,
        phase=PolicyPhase.PROGRESSING,
        canary_revision="llama-predictor-00002",
        stable_revision="llama-predictor-00001",
        target_generation=7,
        weight=30,
        step=step_text(1, 3),
        last_decision=LastDecision(
            action=DecisionAction.ADVANCE,
            verdict=DecisionVerdict.PASS,
            reason="CanaryAdvanced",
            message="step 1/3 passed",
            at=now,
        ),
        checks=[
            CheckStatus(
                name="p99", verdict=CheckVerdict.PASS, value="612ms", limit="<= 800ms", statement="met"
            ),
            CheckStatus(name="errors", verdict=CheckVerdict.NOT_YET),
        ],
        conditions=conditions,
    )


def test_a_full_status_is_accepted_by_the_crd_and_reads_back_equal() -> None:
    status = full_status()
    body = status.to_api()
    document = {**yaml.safe_load(valid_policy()), "status": body}
    assert api_server_problems(document) == []
    assert prune(document, SCHEMA)["status"] == body  # nothing of it is pruned
    assert PromotionPolicyStatus.model_validate(body) == status
    assert body["step"] == "2/3" and body["conditions"][0]["lastTransitionTime"] == "2026-12-01T14:00:00Z"
    assert {c["type"] for c in body["conditions"]} == {t.value for t in ConditionType}


def test_the_crd_refuses_a_malformed_status() -> None:
    body = full_status().to_api()
    body["conditions"][0]["reason"] = "not camel case"
    body["weight"] = 130
    problems = api_server_problems({**yaml.safe_load(valid_policy()), "status": body})
    assert any("does not match" in p for p in problems) and any("130" in p for p in problems)


def test_set_condition_moves_the_transition_time_only_when_the_status_changes() -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    first = Condition.of(ConditionType.PROMOTED, False, "Progressing", "revision r2: step 1/3", start)
    later = Condition.of(
        ConditionType.PROMOTED, False, "Progressing", "revision r2: step 2/3", start + timedelta(hours=1)
    )
    (kept,) = set_condition([first], later)
    assert kept.last_transition_time == start and kept.message.endswith("2/3")
    done = Condition.of(
        ConditionType.PROMOTED, True, "Succeeded", "revision r2 promoted", start + timedelta(hours=2)
    )
    (moved,) = set_condition([kept], done)
    assert moved.last_transition_time == start + timedelta(hours=2)
    with pytest.raises(ValidationError):
        Condition.of(ConditionType.READY, True, "Ready", "naive time", datetime(2026, 12, 1))


def test_the_status_vocabulary_is_the_rollout_core_s() -> None:
    assert {p.value for p in PolicyPhase} == {p.value for p in rollout_state.Phase} | {"Invalid"}
    assert {a.value for a in DecisionAction} == {a.value for a in vocabulary.Action}
    assert {v.value for v in DecisionVerdict} == {v.value for v in rollout_state.EvaluationVerdict}
    assert {v.value for v in CheckVerdict} == {v.value for v in vocabulary.CheckVerdict}
    assert {s.value for s in ConditionStatus} == {"True", "False", "Unknown"}
    for reason in vocabulary.EventReason:  # lastDecision.reason takes the event reasons
        LastDecision(action=DecisionAction.WAIT, reason=reason.value, at=datetime.now(UTC))


def test_the_printer_columns_name_fields_of_the_schema() -> None:
    paths = {f".{path}" for path, _ in walk_properties(SCHEMA)}
    for column in PRINTER_COLUMNS:
        assert column["jsonPath"] in paths | {".metadata.creationTimestamp"}, column
    assert [c["name"] for c in PRINTER_COLUMNS if "priority" not in c] == [
        "Target", "Phase", "Weight", "Step", "Verdict", "Age",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Objects as the API server returns them


FETCHED = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata:
  name: good
  namespace: ml
  uid: 0f3c6d1e-1111-2222-3333-444455556666
  resourceVersion: "12345"
  generation: 3
  creationTimestamp: "2026-12-01T14:00:00Z"
  managedFields:
    - {manager: kubectl, operation: Apply, apiVersion: kserve-canary.dev/v1alpha1}
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: "{}"
spec:
  target:
    inferenceService: good
  steps: [10, 30, 50, 100]
  checks:
    - {name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}
status:
  observedGeneration: 3
  phase: Idle
"""


def test_policy_document_drops_status_and_server_set_metadata_only() -> None:
    fetched = yaml.safe_load(FETCHED)
    assert pydantic_problems(fetched)  # the models alone refuse them
    document = policy_document(fetched)
    assert pydantic_problems(document) == []
    assert "status" not in document and not SERVER_SET_METADATA & set(document["metadata"])
    assert "status" in fetched and "uid" in fetched["metadata"]  # the input is not changed
    fetched["metadata"]["lables"] = {"a": "b"}  # a typo in metadata is still an error
    assert [p.split(":")[0] for p in pydantic_problems(policy_document(fetched))] == ["metadata.lables"]


def test_validate_accepts_a_manifest_fetched_from_the_api_server(tmp_path: Path) -> None:
    directory = tmp_path / "ml"
    directory.mkdir()
    (directory / "fetched.yaml").write_text(FETCHED + "---\n" + valid_policy("second"))
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output


def test_validate_accepts_a_multi_document_manifest_of_objects(tmp_path: Path) -> None:
    """Item 6 of issue 14, the part that holds: a file of several PromotionPolicy objects, as applied."""
    directory = tmp_path / "ml"
    directory.mkdir()
    documents = []
    for index, (_, example) in enumerate(EXAMPLES):
        if "notify" in example["spec"]:  # secret references need the controller's scope flags
            continue
        document = copy.deepcopy(example)
        # One InferenceService each (two policies for one would be a conflict), all in ml.
        document["metadata"].update(name=f"model-{index}", namespace="ml")
        document["spec"]["target"]["inferenceService"] = f"model-{index}"
        documents.append(document)
    (directory / "objects.yaml").write_text(yaml.safe_dump_all(documents))
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"{len(documents)} valid policies" in result.output and len(documents) >= 3
