"""What a predictor spec serves, in every form KServe accepts (kserve pkg/apis/serving/v1beta1/
predictor.go, predictor_model.go, predictor_custom.go), with a URI's credentials never kept."""

from __future__ import annotations

import pytest

from canary.kserve.artefact import artefact_of, public_uri
from canary.kserve.view import observe
from canary.rollout.artefact import Artefact, describe_artefact


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("s3://bucket/llama/v2", "s3://bucket/llama/v2"),
        # An S3 presigned URL: the signature and the access key id are in the query string.
        (
            "https://bucket.s3.amazonaws.com/m/v2?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA1234"
            "&X-Amz-Signature=abcdef",
            "https://bucket.s3.amazonaws.com/m/v2",
        ),
        ("https://user:p4ss@models.example.com:8443/m/v1#frag", "https://models.example.com:8443/m/v1"),
        ("gs://token@bucket/m?sig=1", "gs://bucket/m"),
        ("hf://meta-llama/Llama-3.1-8B-Instruct", "hf://meta-llama/Llama-3.1-8B-Instruct"),
        ("pvc://models-pvc/llama", "pvc://models-pvc/llama"),
        ("/mnt/models?x=1", "/mnt/models"),
        ("https://u:p@[::1/broken?q=s", "https://[::1/broken"),  # unparseable netloc: still stripped
    ],
)
def test_a_uri_is_shown_without_userinfo_query_or_fragment(uri: str, shown: str) -> None:
    assert public_uri(uri) == shown


def test_the_model_form_with_runtime_format_and_an_image_override() -> None:
    predictor = {
        "model": {
            "modelFormat": {"name": "huggingface", "version": "1"},
            "runtime": "kserve-vllm",
            "storageUri": "s3://m/llama?versionId=7",
            "image": "ghcr.io/acme/vllm@sha256:0123",
        }
    }
    artefact = artefact_of(predictor)
    assert artefact == Artefact(
        "s3://m/llama", "ghcr.io/acme/vllm@sha256:0123", "kserve-vllm", "huggingface:1"
    )
    assert artefact.describe() == (
        "s3://m/llama on image ghcr.io/acme/vllm@sha256:0123 (runtime kserve-vllm, format huggingface:1)"
    )


def test_the_older_framework_form_and_storage_uris() -> None:
    assert artefact_of({"sklearn": {"storageUri": "gs://kfserving-examples/models/sklearn/1.0/model"}}) == (
        Artefact("gs://kfserving-examples/models/sklearn/1.0/model", model_format="sklearn")
    )
    multiple = {
        "model": {"modelFormat": {"name": "pytorch"}},
        "storageUris": [{"uri": "s3://a?s=1"}, {"uri": "s3://b"}],
    }
    assert artefact_of(multiple) == Artefact("s3://a, s3://b", model_format="pytorch")


def test_a_custom_predictor_names_its_kserve_container_image_and_storage_uri_env() -> None:
    predictor = {
        "containers": [
            {"name": "sidecar", "image": "envoy:1"},
            {
                "name": "kserve-container",
                "image": "ghcr.io/acme/server:2.1",
                "env": [{"name": "STORAGE_URI", "value": "https://u:secret@h/m?token=x"}],
            },
        ]
    }
    assert artefact_of(predictor) == Artefact("https://h/m", "ghcr.io/acme/server:2.1")
    # Without a kserve-container, KServe takes the first container (predictor.go GetImplementations).
    assert artefact_of({"containers": [{"image": "acme:1"}]}) == Artefact(image="acme:1")


def test_nothing_named_or_malformed_is_no_artefact_and_reads_as_unknown() -> None:
    assert artefact_of({}) is None
    assert artefact_of({"containers": "not a list"}) is None
    assert describe_artefact(None) == "unknown"
    assert Artefact().describe() == "no storageUri or image in the spec"
    assert observe({"spec": {"predictor": {"model": {"storageUri": 7}}}}).artefact == Artefact()
