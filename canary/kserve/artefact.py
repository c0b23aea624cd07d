"""The artefact a predictor spec serves (:class:`canary.rollout.artefact.Artefact`), made safe to show.

Where KServe keeps it (serving.kserve.io/v1beta1, kserve pkg/apis/serving/v1beta1/):

* ``spec.predictor.model``: ``storageUri``, ``runtime``, ``modelFormat.{name,version}`` and, through
  the inlined container, ``image`` (predictor_model.go lines 30-51, ``ModelSpec`` inlines
  ``PredictorExtensionSpec``, predictor.go lines 108-126). KServe's defaulting webhook rewrites the
  older framework forms into this one (inference_service_defaults.go, ``setPredictorModelDefaults``);
* ``spec.predictor.<framework>`` (``sklearn``, ``xgboost``, ``tensorflow``, ``pytorch``, ``triton``,
  ``onnx``, ``huggingface``, ``pmml``, ``lightgbm``, ``paddle``: predictor.go lines 32-52) where the
  webhook did not run: ``storageUri`` and ``image``, the framework as the format;
* ``spec.predictor.storageUris[].uri`` (predictor.go line 60);
* a custom predictor, ``spec.predictor.containers[]``: the container named ``kserve-container``, else
  the first (predictor.go lines 150-162); its ``image``, and its ``STORAGE_URI`` env var as the
  storageUri (predictor_custom.go lines 75-87).

A URI may carry credentials: ``https://user:token@host/...`` or an S3/GCS presigned query string.
:func:`public_uri` keeps the scheme, host, port and path only, so what the state, status, Events and
notifications show is never a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from canary.rollout.artefact import Artefact

__all__ = ["artefact_of", "public_uri"]

_FRAMEWORKS = (
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
)
_PREDICTOR_CONTAINER = "kserve-container"
_STORAGE_URI_ENV = "STORAGE_URI"
_MAX_CHARS = 512  # a stored value's bound: the state stays small whatever the spec holds


def public_uri(uri: str) -> str:
    """``uri`` without userinfo, query string or fragment (``s3://bucket/model``), bounded in length."""
    text = uri.strip()
    try:
        parts = urlsplit(text)
        host = parts.netloc.rpartition("@")[2]
        text = urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:  # an invalid IPv6 netloc and the like: keep what precedes any credential
        text = text.split("?", 1)[0].split("#", 1)[0]
        scheme, sep, rest = text.partition("://")
        text = f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else text
    return _bounded(text) or ""


def artefact_of(predictor: Mapping[str, Any]) -> Artefact | None:
    """The artefact ``spec.predictor`` names; None when it names none of the forms above."""
    model = predictor.get("model")
    if isinstance(model, Mapping):
        return _from_extension(model, predictor, runtime=_text(model.get("runtime")), fmt=_format(model))
    for framework in _FRAMEWORKS:
        spec = predictor.get(framework)
        if isinstance(spec, Mapping):
            return _from_extension(spec, predictor, runtime=None, fmt=framework)
    container = _predictor_container(predictor.get("containers"))
    if container is None:
        return None
    uri = next(
        (
            _text(env.get("value"))
            for env in container.get("env") or ()
            if isinstance(env, Mapping) and env.get("name") == _STORAGE_URI_ENV
        ),
        None,
    )
    return Artefact(
        storage_uri=public_uri(uri) if uri else None, image=_bounded(_text(container.get("image")))
    )


def _from_extension(
    spec: Mapping[str, Any], predictor: Mapping[str, Any], *, runtime: str | None, fmt: str | None
) -> Artefact:
    uri = _text(spec.get("storageUri"))
    return Artefact(
        storage_uri=public_uri(uri) if uri else _storage_uris(predictor.get("storageUris")),
        image=_bounded(_text(spec.get("image"))),
        runtime=_bounded(runtime),
        model_format=_bounded(fmt),
    )


def _storage_uris(entries: object) -> str | None:
    if not isinstance(entries, list):
        return None
    uris = [
        public_uri(uri)
        for entry in entries
        if isinstance(entry, Mapping) and (uri := _text(entry.get("uri")))
    ]
    return _bounded(", ".join(uris)) or None


def _predictor_container(containers: object) -> Mapping[str, Any] | None:
    if not isinstance(containers, list):
        return None
    mappings = [container for container in containers if isinstance(container, Mapping)]
    named = [container for container in mappings if container.get("name") == _PREDICTOR_CONTAINER]
    found = named or mappings
    return found[0] if found else None


def _format(model: Mapping[str, Any]) -> str | None:
    found = model.get("modelFormat")
    if not isinstance(found, Mapping):
        return None
    name, version = _text(found.get("name")), _text(found.get("version"))
    return f"{name}:{version}" if name and version else name


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _bounded(value: str | None) -> str | None:
    if value is None or len(value) <= _MAX_CHARS:
        return value
    return value[: _MAX_CHARS - 1] + "…"
