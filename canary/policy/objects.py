"""Loading PromotionPolicy objects (custom resources): what an object may ask for in its namespace.

Part of the policy loader (:mod:`canary.policy.loader` loads files and text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from canary.policy.loader import (
    LoadedPolicy,
    ObjectRef,
    PolicyCheck,
    PolicyError,
    _validation_errors,
    format_loc,
    secret_refs,
)
from canary.policy.model import PromotionPolicy

__all__ = ["ObjectRules", "load_object"]


# What the API server adds to every object's metadata: not the author's, never validated. A
# PromotionPolicy's own metadata is name, namespace, labels and annotations (as in a file).
_AUTHORED_METADATA = ("name", "namespace", "labels", "annotations")


@dataclass(frozen=True)
class ObjectRules:
    """What a PromotionPolicy object may ask for (docs/design.md §5, "Tenancy").

    An object is written by whoever may create it in its namespace — a model team — so it reaches
    only what that namespace may: secret references name keys of one Secret in its own namespace
    (``secret_name``, read through the API), never the controller's environment or files; custom
    PromQL (``checks[].promql``, ``metrics.queries``) runs with the controller's Prometheus
    credentials and is refused unless the platform allows it.
    """

    allow_custom_promql: bool = False
    secret_name: str = "kserve-canary-notifications"  # noqa: S105 - a Secret's name, not a secret
    # Where and why an allowed custom query cannot run in the object's namespace (as for files).
    promql: PolicyCheck | None = None


_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _object_errors(policy: PromotionPolicy, rules: ObjectRules, path: str) -> list[PolicyError]:
    errors = []
    for loc, ref in secret_refs(policy):
        if ref.file is not None:
            errors.append(
                PolicyError(
                    path,
                    None,
                    format_loc((*loc, "file")),
                    "a PromotionPolicy object cannot name a file; name a key of the Secret "
                    f"{rules.secret_name} in namespace {policy.metadata.namespace} with "
                    "{env: KEY} instead",
                )
            )
        elif ref.env is not None and not _SECRET_KEY.match(ref.env):
            errors.append(
                PolicyError(
                    path,
                    None,
                    format_loc((*loc, "env")),
                    f"{ref.env!r} is not a Secret key ([-._a-zA-Z0-9]+)",
                )
            )
    if not rules.allow_custom_promql:
        refusal = (
            "is refused in a PromotionPolicy object: custom PromQL runs with the controller's "
            "Prometheus credentials, so the platform must allow it (--allow-custom-promql-from-crds); "
            "use a builtin metric, or a policy file"
        )
        for index, check in enumerate(policy.spec.checks):
            if check.promql is not None:
                errors.append(
                    PolicyError(path, None, format_loc(("spec", "checks", index, "promql")), refusal)
                )
        for name in sorted(policy.spec.metrics.queries):
            errors.append(PolicyError(path, None, format_loc(("spec", "metrics", "queries", name)), refusal))
    elif rules.promql is not None:
        errors += [PolicyError(path, None, format_loc(loc), message) for loc, message in rules.promql(policy)]
    return errors


def load_object(
    obj: Any, *, rules: ObjectRules | None = None
) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    """A PromotionPolicy object as the API serves it: the policy, or the errors ``validate`` prints.

    Errors are ``promotionpolicy/<namespace>/<name>: field.path: message`` (no line: the object has
    none). The object's namespace is the policy's namespace; ``spec.target.namespace``, if given,
    must say the same. Unknown fields are errors, as in a file (the CRD keeps them so that they are
    reported). Never raises for bad input.
    """
    rules = rules or ObjectRules()
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None, [PolicyError("promotionpolicy/?", None, "metadata", "required field is missing")]
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    generation = meta.get("generation")
    ref = ObjectRef(
        namespace,
        name,
        uid=str(meta["uid"]) if meta.get("uid") else None,
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
    )
    path = ref.origin
    try:
        return _load_object(obj, meta, ref, rules, path)
    except RecursionError:
        return None, [PolicyError(path, None, None, "the object is nested too deeply to be read")]
    except Exception as exc:  # whatever a hostile object can make pydantic raise is this object's error
        return None, [PolicyError(path, None, None, f"cannot read this object ({type(exc).__name__})")]


def _load_object(
    obj: dict[str, Any], meta: dict[str, Any], ref: ObjectRef, rules: ObjectRules, path: str
) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    data: dict[str, Any] = {key: value for key, value in obj.items() if key not in {"metadata", "status"}}
    data["metadata"] = {key: meta[key] for key in _AUTHORED_METADATA if key in meta}
    errors: list[PolicyError] = []
    spec = data.get("spec")
    target = spec.get("target") if isinstance(spec, dict) else None
    if isinstance(spec, dict) and isinstance(target, dict) and "namespace" in target:
        written = target.get("namespace")
        if written != ref.namespace:
            errors.append(
                PolicyError(
                    path,
                    None,
                    "spec.target.namespace",
                    f"is {written!r} but the PromotionPolicy lives in namespace {ref.namespace!r}: a "
                    "policy governs only InferenceServices of its own namespace (omit it, or create "
                    f"the object in {written})",
                )
            )
        # The same namespace, said twice: accepted (the model has no such field).
        data["spec"] = {**spec, "target": {k: v for k, v in target.items() if k != "namespace"}}
    try:
        policy = PromotionPolicy.model_validate(data)
    except ValidationError as exc:
        errors.extend(_validation_errors(exc, path, {}, 0))
        return None, [_without_line(error) for error in errors]
    if errors:
        return None, errors
    refused = _object_errors(policy, rules, path)
    if refused:
        return None, refused
    return LoadedPolicy(policy, path, 0, 0, 0, object=ref), []


def _without_line(error: PolicyError) -> PolicyError:
    """An object's error has no line."""
    return PolicyError(error.path, None, error.field, error.message, error.conflict)
