"""The loader reads with libyaml when it can and with PyYAML's own parser otherwise: the same
policies, errors, lines and fields either way (canary/policy/loader.py ``_read_documents``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from canary.policy import loader, yaml_lines
from tests.policy.support import valid_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "policies").rglob("*.yaml") if "schema" not in p.name)


def both(text: str) -> tuple[object, object]:
    origin = loader._Origin()
    fast = loader._parse_documents(text, "p.yaml", origin, None, fast=True)
    slow = loader._parse_documents(text, "p.yaml", origin, None, fast=False)
    return fast, slow


def test_libyaml_is_there_so_the_fast_path_is_taken() -> None:
    # The PyYAML wheels ship libyaml; without it every load would take the slow path unnoticed.
    assert yaml.__with_libyaml__ and yaml_lines._LIBYAML


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_policy_reads_the_same_with_libyaml(path: Path) -> None:
    fast, slow = both(path.read_text())
    assert fast == slow


def test_errors_lines_and_duplicates_are_the_same_with_libyaml() -> None:
    text = valid_policy("a").replace("window:", "windw:") + "---\n" + valid_policy("b") + "spec: {}\n"
    fast, slow = both(text)
    assert fast == slow
    assert fast[1], "the text has errors"  # type: ignore[index]


@pytest.mark.parametrize(
    "text",
    ["[" * 3000 + "]" * 3000, "a: [1, 2\n", 'a: "\\ud83d\\ude80"\n', "a: b: c\n"],
    ids=["too-deep", "unclosed", "json-surrogates", "syntax"],
)
def test_what_libyaml_refuses_or_cannot_compose_safely_goes_to_pyyaml(text: str) -> None:
    with pytest.raises(yaml_lines._NotForLibyaml):
        loader._parse_documents(text, "p.yaml", loader._Origin(), None, fast=True)
    # What the file reports is PyYAML's reading (its words, its lines), as before libyaml was used.
    policies, errors = loader._load_documents(text, "p.yaml")
    assert not policies and errors
    assert not any("cannot read this file" in error.message for error in errors)
