"""The policy file's JSON Schema, for editors (yaml-language-server) and CI linters."""

from __future__ import annotations

from typing import Any

from canary.policy.model import API_VERSION, KIND, PromotionPolicy

SCHEMA_ID = "https://kserve-canary.dev/schemas/v1alpha1/promotionpolicy.json"


def policy_json_schema() -> dict[str, Any]:
    schema = PromotionPolicy.model_json_schema(by_alias=True, mode="validation")
    # metadata.namespace is filled in from the policy's directory (DIR/<namespace>/) before validation,
    # so a file may omit it; only --policy-namespaces metadata requires it (the loader says so).
    metadata = schema["$defs"]["Metadata"]
    metadata["required"] = [name for name in metadata.get("required", []) if name != "namespace"]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"{KIND} ({API_VERSION})",
        **{key: value for key, value in schema.items() if key != "title"},
    }
