"""Where a policy reaches out: secrets by reference, notification targets, and gates.

Part of the policy model (:mod:`canary.policy.model` re-exports every name).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from canary.policy.base import _CHECK_NAME, _ENV_NAME, Duration, _Model
from canary.policy.units import format_duration


class SecretRef(_Model):
    """Where a secret comes from: an environment variable or a mounted file. Never the value itself."""

    env: str | None = Field(
        default=None,
        description="Environment variable holding the value; only names the operator allowed for the "
        "policy's namespace (`--secret-env-allow NAMESPACE=GLOB`).",
    )
    file: str | None = Field(
        default=None,
        description="File holding the value, relative to the namespace's secret directory "
        "(`<secret file root>/<namespace>/`); regular files of at most 64 KiB.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        if self.env is not None and not _ENV_NAME.match(self.env):
            raise ValueError(f"{self.env!r} is not a valid environment variable name")
        return self


_INLINE_SECRET_KEYS = {"url", "webhookUrl", "secret", "token", "password"}


class _SecretsByReference(_Model):
    @model_validator(mode="before")
    @classmethod
    def _no_inline_secrets(cls, data: object) -> object:
        if isinstance(data, dict):
            inline = sorted(key for key in data if key in _INLINE_SECRET_KEYS)
            if inline:
                raise ValueError(
                    f"'{inline[0]}' would put a secret in the policy file; reference it instead "
                    f"with '{inline[0]}From: {{env: NAME}}' or '{{file: relative/path}}'"
                )
        return data


class SlackTarget(_SecretsByReference):
    webhook_url_from: SecretRef = Field(description="The Slack incoming-webhook URL (it is a secret).")
    channel: str | None = Field(default=None, description="Override the webhook's default channel.")


class TeamsTarget(_SecretsByReference):
    webhook_url_from: SecretRef = Field(
        description="The Microsoft Teams Workflows webhook URL (it is a secret); it receives an "
        "Adaptive Card."
    )


class DiscordTarget(_SecretsByReference):
    webhook_url_from: SecretRef = Field(description="The Discord channel webhook URL (it is a secret).")


class WebhookTarget(_SecretsByReference):
    url_from: SecretRef = Field(description="The webhook URL.")
    secret_from: SecretRef | None = Field(
        default=None, description="HMAC-SHA256 key; the payload signature is sent in a header."
    )


_NOTIFY_KINDS = ("slack", "teams", "discord", "webhook")


class NotifyTarget(_Model):
    slack: SlackTarget | None = None
    teams: TeamsTarget | None = None
    discord: DiscordTarget | None = None
    webhook: WebhookTarget | None = None
    min_severity: Literal["info", "warning"] = Field(
        default="info", description="warning: only rollbacks, pauses and problems."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        given = [kind for kind in _NOTIFY_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(
                "each notify entry needs exactly one of 'slack', 'teams', 'discord' or 'webhook'"
            )
        return self

    @property
    def chat(self) -> SlackTarget | TeamsTarget | DiscordTarget | None:
        """The chat target (Slack, Teams or Discord) of this entry; None for a generic webhook."""
        return self.slack or self.teams or self.discord


# ---------------------------------------------------------------------------------------------
# Gates: webhooks a rollout waits for (docs/design.md, "Gates")


class GateStage(StrEnum):
    """Where a gate stands in the rollout."""

    PRE_ROLLOUT = "pre-rollout"  # once the canary is Ready, before its first step gets traffic
    STEP = "step"  # at every held step, once the step's window and checks passed
    PRE_PROMOTION = "pre-promotion"  # before the final write that promotes


class GateFailurePolicy(StrEnum):
    """What a gate's ``deadline`` passing without a pass does."""

    HOLD = "hold"  # keep holding the step and calling the gate (a warning is told)
    ROLLBACK = "rollback"  # roll the canary back


MAX_GATE_TIMEOUT = 300.0  # seconds: a gate call is bounded, whatever the policy says


class GateWebhook(_SecretsByReference):
    url_from: SecretRef = Field(description="The gate's URL (it may carry a token: it is a secret).")
    secret_from: SecretRef | None = Field(
        default=None,
        description="HMAC-SHA256 key: the body is signed in the X-Kserve-Canary-Signature header.",
    )
    timeout: Duration = Field(
        default=30.0, description="How long one call may take (at most 5m); a timeout is a failed attempt."
    )

    @field_validator("timeout")
    @classmethod
    def _bounded(cls, timeout: float) -> float:
        if not 0 < timeout <= MAX_GATE_TIMEOUT:
            raise ValueError(f"must be longer than 0s and at most {format_duration(MAX_GATE_TIMEOUT)}")
        return timeout


class Gate(_Model):
    """An HTTP call the rollout waits for: 2xx passes; anything else is retried and holds the step."""

    name: str | None = Field(
        default=None, description="Shown in decisions and notifications; default '<at>-<position>'."
    )
    at: GateStage = Field(description="pre-rollout, step (every held step) or pre-promotion.")
    webhook: GateWebhook
    deadline: Duration = Field(
        default=900.0,
        description="How long the gate may hold the rollout without passing before failurePolicy applies.",
    )
    failure_policy: GateFailurePolicy = Field(
        default=GateFailurePolicy.HOLD,
        description="After the deadline: hold (keep holding and calling, with a warning) or rollback.",
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str | None) -> str | None:
        if name is not None and (not _CHECK_NAME.match(name) or len(name) > 63):
            raise ValueError(
                "must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
            )
        return name

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, deadline: float) -> float:
        if deadline <= 0:
            raise ValueError("must be longer than 0s")
        return deadline
