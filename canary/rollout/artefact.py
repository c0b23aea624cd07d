"""What a predictor revision serves: its model's location, its image, its serving runtime and format.

KServe's InferenceService holds only the newest predictor spec; nothing on the object says what the
previous revision served. The state therefore records the :class:`Artefact` of the revision under
management with its spec fingerprint, and a new rollout keeps the previous one's as the stable
revision's (``RolloutState.stable_artefact``). A state written before this existed has none: the
surfaces say "unknown".

Values are stored as the shell read them, already made safe to show (``canary.kserve.artefact``
strips a URI's userinfo and query string: presigned S3 links and ``https://user:pass@...``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

__all__ = ["UNKNOWN_ARTEFACT", "Artefact", "describe_artefact"]

UNKNOWN_ARTEFACT = "unknown"


@dataclass(frozen=True, slots=True)
class Artefact:
    """One revision's model: ``storageUri`` (or ``storageUris``), the container image of a custom
    predictor (or an image override), the ServingRuntime named by ``model.runtime`` and the model
    format (``name`` or ``name:version``). Any of them may be absent."""

    __pydantic_config__ = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    storage_uri: str | None = None
    image: str | None = None
    runtime: str | None = None
    model_format: str | None = None

    def describe(self) -> str:
        """``s3://models/llm/v2 (runtime kserve-vllm, format huggingface)``, for people."""
        main = [part for part in (self.storage_uri, f"image {self.image}" if self.image else None) if part]
        extra = [
            part
            for part in (
                f"runtime {self.runtime}" if self.runtime else None,
                f"format {self.model_format}" if self.model_format else None,
            )
            if part
        ]
        text = " on ".join(main) or "no storageUri or image in the spec"
        return f"{text} ({', '.join(extra)})" if extra else text

    def as_dict(self) -> dict[str, str | None]:
        """The JSON form surfaces publish (webhook payload, status -o json, the dashboard's API)."""
        return {
            "storageUri": self.storage_uri,
            "image": self.image,
            "runtime": self.runtime,
            "modelFormat": self.model_format,
        }


def describe_artefact(artefact: Artefact | None) -> str:
    """The artefact for people; ``unknown`` when it was never recorded (an older state, or a rollout
    the controller first saw already under way)."""
    return UNKNOWN_ARTEFACT if artefact is None else artefact.describe()
