"""What every part of the policy model shares: the base model, the duration and ratio types, names.

Split from :mod:`canary.policy.model` so the notification and gate models
(:mod:`canary.policy.hooks`) can build on it; everything here is re-exported there.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from canary.policy.units import format_duration, parse_duration

API_VERSION = "kserve-canary.dev/v1alpha1"
KIND = "PromotionPolicy"

# Names must be valid Kubernetes names: the policy name ends up in Events and state objects.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_CHECK_NAME = re.compile(r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE_VAR = re.compile(r"{{\s*([^{}]*?)\s*}}")

# Variables a query template may use, as ``{{ name }}``. Values are escaped for PromQL string
# literals (and for regexes inside ``=~``) when they are substituted.
TEMPLATE_VARIABLES = frozenset(
    {"namespace", "inferenceService", "revision", "stableRevision", "window", "interval"}
)


def _written_duration(seconds: float) -> str | float:
    """``"1h30m"`` when that says exactly ``seconds`` (format_duration rounds, for messages), else seconds."""
    text = format_duration(seconds)
    return text if parse_duration(text) == seconds else seconds


Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(_written_duration, return_type=str | float),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d))+$|^0$"},
                {"type": "number", "minimum": 0},
            ],
            "description": 'A duration: "90s", "10m", "1h30m", "250ms", or a number of seconds.',
        }
    ),
]

_RATIO_JSON = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "pattern": r"^\d+(\.\d+)?%$"},
            {"type": "number", "minimum": 0},
        ],
        "description": 'A percentage ("20%") or a fraction (0.2).',
    }
)
_LIMIT_JSON = WithJsonSchema(
    {
        "anyOf": [{"type": "number"}, {"type": "string"}],
        "description": (
            'A limit in the check\'s unit: a duration for latencies and times ("800ms"), a '
            'percentage or fraction for rates ("1%" or 0.01), a size for memory ("70Gi"), a number '
            "for counts."
        ),
    }
)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        str_strip_whitespace=True,
    )
