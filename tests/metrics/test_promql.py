"""Escaping and template rendering: values from names can never change a query's shape."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.metrics.promql import (
    TemplateError,
    format_duration_seconds,
    regex_alternation,
    regex_literal,
    render_template,
    string_literal,
)

VARIABLES = {
    "namespace": "ml",
    "inferenceService": "llama",
    "revision": "llama-predictor-00002",
    "stableRevision": "llama-predictor-00001",
    "window": "300s",
    "interval": "60s",
}


def _unescaped_quotes(literal: str, quote: str) -> list[int]:
    """Positions of ``quote`` not preceded by an odd number of backslashes (they would end the string)."""
    positions = []
    for index, char in enumerate(literal):
        if char == quote:
            backslashes = len(literal[:index]) - len(literal[:index].rstrip("\\"))
            if backslashes % 2 == 0:
                positions.append(index)
    return positions


@given(st.text())
def test_string_literal_never_lets_a_double_quote_end_the_string(value: str) -> None:
    escaped = string_literal(value)
    assert _unescaped_quotes(escaped, '"') == []
    assert "\n" not in escaped
    # A trailing lone backslash would escape the closing quote.
    assert (len(escaped) - len(escaped.rstrip("\\"))) % 2 == 0


@given(st.text())
def test_string_literal_for_single_quotes(value: str) -> None:
    assert _unescaped_quotes(string_literal(value, "'"), "'") == []


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1))
def test_regex_literal_matches_exactly_the_value(value: str) -> None:
    pattern = regex_literal(value)
    assert re.fullmatch(pattern, value, flags=re.DOTALL)


@pytest.mark.parametrize(
    ("value", "lookalike"),
    [
        ("a.b", "axb"),
        ("rev+1", "revv1"),
        ("x(y)", "xy"),
        ("a|b", "a"),
        ("[ab]", "a"),
        ("a*", "aaa"),
        ("^a$", "a"),
    ],
)
def test_regex_literal_does_not_match_lookalikes(value: str, lookalike: str) -> None:
    assert re.fullmatch(regex_literal(value), value)
    assert not re.fullmatch(regex_literal(value), lookalike)


def test_regex_alternation_is_sorted_and_deduplicated() -> None:
    assert regex_alternation(["b.c", "a", "b.c"]) == r"(a|b\.c)"


@pytest.mark.parametrize(
    ("seconds", "text"), [(300.0, "300s"), (299.6, "300s"), (0.2, "1s"), (3600, "3600s")]
)
def test_durations_are_whole_seconds(seconds: float, text: str) -> None:
    assert format_duration_seconds(seconds) == text


def test_duration_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        format_duration_seconds(float("inf"))


def test_renders_plain_and_regex_contexts_differently() -> None:
    template = 'sum(x{namespace="{{ namespace }}", pod=~"{{ revision }}-deployment-.*"}[{{ window }}])'
    variables = {**VARIABLES, "namespace": 'n"s\\', "revision": "r.1"}
    assert render_template(template, variables) == (
        'sum(x{namespace="n\\"s\\\\", pod=~"r\\\\.1-deployment-.*"}[300s])'
    )


def test_spaces_inside_braces_and_regex_negation() -> None:
    template = "x{pod!~'{{revision}}'} offset {{  interval  }}"
    assert render_template(template, {**VARIABLES, "revision": "a.b'"}) == "x{pod!~'a\\\\.b\\''} offset 60s"


def test_raw_strings_get_regex_escaping_only_and_refuse_backticks() -> None:
    assert (
        render_template("x{pod=~`{{ revision }}.*`}", {**VARIABLES, "revision": "a.b"}) == "x{pod=~`a\\.b.*`}"
    )
    with pytest.raises(TemplateError, match="backtick"):
        render_template("x{pod=`{{ revision }}`}", {**VARIABLES, "revision": "a`b"})


def test_a_name_outside_quotes_is_refused() -> None:
    with pytest.raises(TemplateError, match="inside a quoted string"):
        render_template("sum(x) by ({{ namespace }})", VARIABLES)


def test_unknown_variable_is_refused() -> None:
    with pytest.raises(TemplateError, match="unknown template variable 'pod'"):
        render_template('x{pod="{{ pod }}"}', VARIABLES)


def test_quotes_in_comments_do_not_confuse_the_lexer() -> None:
    template = '# a "comment\nx{namespace="{{ namespace }}"}'
    assert render_template(template, {**VARIABLES, "namespace": 'a"'}) == '# a "comment\nx{namespace="a\\""}'


def test_escaped_quote_inside_a_template_string_keeps_the_string_open() -> None:
    template = 'x{a="q\\"{{ namespace }}"}'
    assert render_template(template, {**VARIABLES, "namespace": '"'}) == 'x{a="q\\"\\""}'


def test_unterminated_string_is_refused() -> None:
    with pytest.raises(TemplateError, match="unterminated"):
        render_template('x{a="{{ namespace }}}', VARIABLES)


def test_a_carriage_return_ends_a_comment_as_in_prometheus() -> None:
    """Prometheus' lexer ends a ``#`` comment at ``\\r`` too: what follows is code again."""
    template = '# p99 of the canary\rsum(x{namespace="{{ namespace }}"})'
    assert render_template(template, {**VARIABLES, "namespace": 'a"'}) == (
        '# p99 of the canary\rsum(x{namespace="a\\""})'
    )
    # After "\r" a name outside quotes is code (Prometheus would run it): refused, not skipped as
    # part of a comment.
    with pytest.raises(TemplateError, match="inside a quoted string"):
        render_template("up # c\r+ {{ namespace }}", VARIABLES)
    # And a quote after "\r" opens a string whose end the lexer follows.
    assert render_template("up # it's\r+ x{a='{{ namespace }}'}", {**VARIABLES, "namespace": "'"}) == (
        "up # it's\r+ x{a='\\''}"
    )


def test_label_replace_regex_argument_is_regex_escaped() -> None:
    template = 'label_replace(up{ns="{{ namespace }}"}, "dst", "$1", "pod", "({{ revision }})-.*")'
    rendered = render_template(template, {**VARIABLES, "namespace": "a.b", "revision": "r.1+"})
    # The selector's string is a plain string; the fifth argument is an RE2 pattern.
    assert rendered == 'label_replace(up{ns="a.b"}, "dst", "$1", "pod", "(r\\\\.1\\\\+)-.*")'
    # Commas inside braces and nested calls do not count as label_replace's arguments.
    nested = (
        "label_replace(rate(x{a='{{ namespace }}', b='c'}[{{ window }}]), 'dst', '{{ namespace }}', 'src', "
        "'{{ revision }}')"
    )
    assert render_template(nested, {**VARIABLES, "namespace": "n.s", "revision": "r.2"}) == (
        "label_replace(rate(x{a='n.s', b='c'}[300s]), 'dst', 'n.s', 'src', 'r\\\\.2')"
    )
    # Raw strings there get the regex escaping only.
    raw = render_template(
        "label_replace(up, `d`, `$1`, `s`, `{{ revision }}`)", {**VARIABLES, "revision": "a.b"}
    )
    assert raw == "label_replace(up, `d`, `$1`, `s`, `a\\.b`)"
