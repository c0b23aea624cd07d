"""A small, honest subset of CEL for CRDs' ``x-kubernetes-validations`` rules.

The emulator evaluates a rule only when every part of it is in this subset:

- ``self`` and ``oldSelf``; field selection (``self.spec.x``), indexing (``self.steps[0]``,
  ``self.labels['a']``); ``has(self.x)``;
- literals: integers, doubles, strings (single or double quotes), ``true``, ``false``, ``null``, lists;
- ``!``, unary ``-``, ``* / %``, ``+ -`` (numbers, string and list concatenation), ``== != < <= > >=``,
  ``in`` (lists and map keys), ``&&``, ``||`` (with CEL's commutative error absorption), ``? :``;
- ``size(x)``/``x.size()``, ``x.startsWith(s)``, ``x.endsWith(s)``, ``x.contains(s)``;
- the ``filter`` macro on lists, ``x.filter(v, predicate)``: the items for which the predicate is true,
  in order (cel-go ``parser/macro.go`` ``MakeFilter``: a comprehension whose step appends the item when
  the predicate holds; a predicate that is not a boolean is an error).

Anything else (the other macros ``all``/``exists``/``map``, ``matches``, ``messageExpression``, the
Kubernetes libraries: quantities, URLs, regex, ``optional``) is *not* evaluated: :func:`compile_rule`
raises :class:`Unsupported`, the CRD write answers with a ``Warning`` header and a log line naming the
rule, and objects are accepted without it. The emulator never pretends to have checked a rule it did not
evaluate.

Evaluation follows apiextensions (``pkg/apiserver/schema/cel``):

- a rule runs where its schema node has a value;
- a transition rule (one that uses ``oldSelf``) runs only on updates where the old object had a value
  at that node: never on create, never inside the items of a changed list (plain lists are not
  correlatable);
- a rule without ``oldSelf`` is ratcheted: not re-checked when its value is unchanged on update;
- a rule that evaluates to false is a ``FieldValueInvalid`` cause at the node (plus ``fieldPath``) with
  the rule's ``message`` or ``failed rule: <rule>``, and the node's type as the value:
  ``spec: Invalid value: "object": failed rule: self.min <= self.max``;
- a runtime error (a missing field without ``has()``) is reported the same way,
  ``<error> evaluating rule: <message or rule>`` (``ruleErrorString`` in
  ``apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go``);
- rules at the root see only ``metadata.name`` and ``metadata.generateName``, as there (the real server
  refuses a rule that uses other metadata fields when the CRD is written; the emulator answers
  ``no such key`` when an object is).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from canary_sandbox.emulator.errors import FieldError

__all__ = ["CelError", "Rule", "Unsupported", "compile_rule", "evaluate_rules", "rules_in"]

JsonObject = dict[str, Any]
Schema = Mapping[str, Any]
_ABSENT = object()


class Unsupported(Exception):
    """The rule uses CEL the emulator does not evaluate."""


class CelError(Exception):
    """A runtime error while evaluating a rule (CEL's ``no such key`` and type errors)."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<double>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
      | (?P<int>\d+)(?P<unsigned>[uU])?
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>&&|\|\||==|!=|<=|>=|[<>!+\-*/%?:.,()\[\]{}])
    )""",
    re.VERBOSE,
)
_METHODS = {"size", "startsWith", "endsWith", "contains"}
_FUNCTIONS = {"size", "has"}
# Identifiers the emulator knows it does not support: named to make the warning precise.
_KNOWN_UNSUPPORTED = {
    "all", "exists", "exists_one", "map", "matches", "quantity", "isQuantity", "url", "isURL",
    "optional", "hasValue", "orValue", "int", "uint", "double", "string", "bytes", "type", "dyn",
    "duration", "timestamp", "lowerAscii", "upperAscii", "split", "join", "replace", "find", "findAll",
    "indexOf", "lastIndexOf", "trim", "substring", "isSorted", "sum", "min", "max", "ip", "cidr", "format",
}  # fmt: skip


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise Unsupported(f"cannot read {text[position:]!r}")
        position = match.end()
        kind = match.lastgroup
        assert kind is not None
        if kind == "unsigned":
            raise Unsupported("unsigned integers")
        tokens.append((kind, match.group(kind)))
    return tokens


Node = Callable[[dict[str, Any]], Any]


class _Parser:
    """Recursive descent over CEL's grammar, building closures over an environment."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.position = 0
        self.uses_old_self = False
        self.bound: set[str] = set()  # the variables of the macros being parsed

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        index = self.position + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def accept(self, value: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] == value:
            self.position += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.accept(value):
            raise Unsupported(f"expected {value!r}")

    def parse(self) -> Node:
        node = self.conditional()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        return node

    def conditional(self) -> Node:
        condition = self.logical_or()
        if not self.accept("?"):
            return condition
        then = self.conditional()
        self.expect(":")
        otherwise = self.conditional()

        def choose(env: dict[str, Any]) -> Any:
            return then(env) if _boolean(condition(env)) else otherwise(env)

        return choose

    def logical_or(self) -> Node:
        node = self.logical_and()
        while self.accept("||"):
            node = _or(node, self.logical_and())
        return node

    def logical_and(self) -> Node:
        node = self.relation()
        while self.accept("&&"):
            node = _and(node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.addition()
        token = self.peek()
        while token is not None and (
            (token[0] == "op" and token[1] in ("==", "!=", "<", "<=", ">", ">="))
            or (token[0] == "ident" and token[1] == "in")
        ):
            self.position += 1
            node = _relation(token[1], node, self.addition())
            token = self.peek()
        return node

    def addition(self) -> Node:
        node = self.multiplication()
        while True:
            token = self.peek()
            if token is None or token[0] != "op" or token[1] not in ("+", "-"):
                return node
            self.position += 1
            node = _arithmetic(token[1], node, self.multiplication())

    def multiplication(self) -> Node:
        node = self.unary()
        while True:
            token = self.peek()
            if token is None or token[0] != "op" or token[1] not in ("*", "/", "%"):
                return node
            self.position += 1
            node = _arithmetic(token[1], node, self.unary())

    def unary(self) -> Node:
        if self.accept("!"):
            operand = self.unary()
            return lambda env: not _boolean(operand(env))
        if self.accept("-"):
            negated = self.unary()

            def negate(env: dict[str, Any]) -> Any:
                value = negated(env)
                if not _is_number(value):
                    raise CelError("no such overload: -_")
                return -value

            return negate
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                token = self.peek()
                if token is None or token[0] != "ident":
                    raise Unsupported("expected a field name")
                self.position += 1
                name = token[1]
                if name == "filter" and self.accept("("):
                    node = self.filter(node)
                elif self.accept("("):
                    if name not in _METHODS:
                        raise Unsupported(f"the method {name}()")
                    arguments = self.arguments()
                    node = _method(name, node, arguments)
                else:
                    node = _select(node, name)
            elif self.accept("["):
                index = self.conditional()
                self.expect("]")
                node = _index(node, index)
            else:
                return node

    def filter(self, target: Node) -> Node:
        """``target.filter(v, predicate)`` (after its ``(``)."""
        token = self.peek()
        if token is None or token[0] != "ident" or token[1] in ("self", "oldSelf"):
            raise Unsupported("filter() needs a variable name")
        self.position += 1
        variable = token[1]
        self.expect(",")
        outer = variable in self.bound
        self.bound.add(variable)
        predicate = self.conditional()
        if not outer:
            self.bound.discard(variable)
        self.expect(")")

        def evaluate(env: dict[str, Any]) -> list[Any]:
            items = target(env)
            if not isinstance(items, list):
                raise CelError("no matching overload for filter()")
            return [item for item in items if _boolean(predicate({**env, variable: item}))]

        return evaluate

    def arguments(self) -> list[Node]:
        arguments: list[Node] = []
        if self.accept(")"):
            return arguments
        while True:
            arguments.append(self.conditional())
            if self.accept(")"):
                return arguments
            self.expect(",")

    def primary(self) -> Node:
        token = self.peek()
        if token is None:
            raise Unsupported("unexpected end of rule")
        kind, text = token
        self.position += 1
        if kind == "int":
            value_int = int(text)
            return lambda env: value_int
        if kind == "double":
            value_float = float(text)
            return lambda env: value_float
        if kind == "string":
            value_str = _unquote(text)
            return lambda env: value_str
        if kind == "ident":
            if text in ("true", "false"):
                truth = text == "true"
                return lambda env: truth
            if text == "null":
                return lambda env: None
            if text in self.bound:
                return lambda env: env[text]
            if text in ("self", "oldSelf"):
                if text == "oldSelf":
                    self.uses_old_self = True
                return lambda env: env[text]
            if text in _FUNCTIONS and self.accept("("):
                if text == "has":
                    return self.presence()
                arguments = self.arguments()
                if len(arguments) != 1:
                    raise Unsupported("size() takes one argument")
                return _method("size", arguments[0], [])
            if text in _KNOWN_UNSUPPORTED:
                raise Unsupported(f"{text}")
            raise Unsupported(f"the identifier {text!r}")
        if text == "(":
            node = self.conditional()
            self.expect(")")
            return node
        if text == "[":
            items: list[Node] = []
            if not self.accept("]"):
                while True:
                    items.append(self.conditional())
                    if self.accept("]"):
                        break
                    self.expect(",")
            return lambda env: [item(env) for item in items]
        raise Unsupported(f"{text!r}")

    def presence(self) -> Node:
        """``has(x.f)``: whether field ``f`` is present in ``x`` (a selection is required)."""
        target = self.member_before_last_field()
        self.expect(")")
        return target

    def member_before_last_field(self) -> Node:
        start = self.position
        base = self.primary()
        fields: list[str] = []
        while self.accept("."):
            token = self.peek()
            if token is None or token[0] != "ident":
                raise Unsupported("has() needs a field selection")
            self.position += 1
            fields.append(token[1])
        if not fields or start == self.position:
            raise Unsupported("has() needs a field selection")
        node = base
        for name in fields[:-1]:
            node = _select(node, name)
        last = fields[-1]
        parent = node

        def present(env: dict[str, Any]) -> bool:
            value = parent(env)
            if not isinstance(value, Mapping):
                raise CelError(f"invalid type for field selection: {last}")
            return last in value

        return present


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), body)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError("no matching overload for a boolean operator")
    return value


def _or(left: Node, right: Node) -> Node:
    def evaluate(env: dict[str, Any]) -> bool:
        # CEL's || is commutative: an error on one side is absorbed when the other side is true.
        try:
            if _boolean(left(env)):
                return True
        except CelError:
            if _boolean(right(env)):
                return True
            raise
        return _boolean(right(env))

    return evaluate


def _and(left: Node, right: Node) -> Node:
    def evaluate(env: dict[str, Any]) -> bool:
        try:
            if not _boolean(left(env)):
                return False
        except CelError:
            if not _boolean(right(env)):
                return False
            raise
        return _boolean(right(env))

    return evaluate


def _comparable(left: Any, right: Any) -> bool:
    if _is_number(left) and _is_number(right):
        return True
    return type(left) is type(right) and isinstance(left, str | bool)


def _relation(operator: str, left: Node, right: Node) -> Node:
    def evaluate(env: dict[str, Any]) -> bool:
        a, b = left(env), right(env)
        if operator == "in":
            if isinstance(b, list):
                return any(_equal(a, item) for item in b)
            if isinstance(b, Mapping):
                return a in b
            raise CelError("no such overload: in")
        if operator == "==":
            return _equal(a, b)
        if operator == "!=":
            return not _equal(a, b)
        if not _comparable(a, b):
            raise CelError(f"no such overload: {operator}")
        result: bool = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[operator]
        return result

    return evaluate


def _equal(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b) and not (a is None or b is None):
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            return dict(a) == dict(b)
        raise CelError("no such overload: ==")
    return bool(a == b)


def _arithmetic(operator: str, left: Node, right: Node) -> Node:
    def evaluate(env: dict[str, Any]) -> Any:
        a, b = left(env), right(env)
        if operator == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if operator == "+" and isinstance(a, list) and isinstance(b, list):
            return a + b
        if not (_is_number(a) and _is_number(b)) or isinstance(a, int) != isinstance(b, int):
            # CEL has no implicit int/double conversion in arithmetic
            raise CelError(f"no such overload: {operator}")
        if operator == "+":
            return a + b
        if operator == "-":
            return a - b
        if operator == "*":
            return a * b
        if b == 0 and isinstance(a, int):
            raise CelError("division by zero" if operator == "/" else "modulus by zero")
        if operator == "/":
            return int(a / b) if isinstance(a, int) else a / b
        if isinstance(a, int):
            return a - b * int(a / b)  # CEL's % truncates toward zero, like Go
        raise CelError("no such overload: %")

    return evaluate


def _select(target: Node, name: str) -> Node:
    def evaluate(env: dict[str, Any]) -> Any:
        value = target(env)
        if not isinstance(value, Mapping):
            raise CelError(f"invalid type for field selection: {name}")
        if name not in value:
            raise CelError(f"no such key: {name}")
        return value[name]

    return evaluate


def _index(target: Node, index: Node) -> Node:
    def evaluate(env: dict[str, Any]) -> Any:
        value, key = target(env), index(env)
        if isinstance(value, list):
            if not isinstance(key, int) or isinstance(key, bool):
                raise CelError("no such overload: _[_]")
            if not 0 <= key < len(value):
                raise CelError(f"index out of bounds: {key}")
            return value[key]
        if isinstance(value, Mapping):
            if key not in value:
                raise CelError(f"no such key: {key}")
            return value[key]
        raise CelError("no such overload: _[_]")

    return evaluate


def _method(name: str, target: Node, arguments: list[Node]) -> Node:
    def evaluate(env: dict[str, Any]) -> Any:
        value = target(env)
        args = [argument(env) for argument in arguments]
        if name == "size" and not args:
            if isinstance(value, str | list | Mapping):
                return len(value)
            raise CelError("no such overload: size")
        if len(args) == 1 and isinstance(value, str) and isinstance(args[0], str):
            if name == "startsWith":
                return value.startswith(args[0])
            if name == "endsWith":
                return value.endswith(args[0])
            if name == "contains":
                return args[0] in value
        raise CelError(f"no such overload: {name}")

    return evaluate


@dataclass(frozen=True)
class Rule:
    """One compiled ``x-kubernetes-validations`` entry."""

    text: str
    message: str
    field_path: str
    reason: str
    transition: bool
    evaluate: Node


def compile_rule(entry: Mapping[str, Any]) -> Rule:
    """The rule, compiled; :class:`Unsupported` when it is outside the subset the emulator evaluates."""
    text = str(entry.get("rule") or "")
    if entry.get("messageExpression"):
        raise Unsupported("messageExpression")
    parser = _Parser(text)
    node = parser.parse()
    return Rule(
        text=text.strip(),
        message=str(entry.get("message") or "").strip(),
        field_path=str(entry.get("fieldPath") or ""),
        reason=str(entry.get("reason") or "FieldValueInvalid"),
        transition=parser.uses_old_self,
        evaluate=node,
    )


def rules_in(schema: Schema, path: str = "") -> list[tuple[str, Mapping[str, Any]]]:
    """Every ``x-kubernetes-validations`` entry in ``schema`` with the schema path it sits at."""
    found = [
        (path, entry) for entry in schema.get("x-kubernetes-validations") or [] if isinstance(entry, Mapping)
    ]
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, Mapping):
            found.extend(rules_in(prop, f"{path}.properties[{key}]"))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            found.extend(rules_in(schema[key], f"{path}.{key}"))
    return found


def _type_of(schema: Schema, value: Any) -> str:
    return str(schema.get("type") or ("object" if isinstance(value, Mapping) else "string"))


def evaluate_rules(
    obj: JsonObject, old: JsonObject | None, schema: Schema
) -> tuple[list[FieldError], list[str]]:
    """(causes, rules not evaluated) for ``obj``; ``old`` is the stored object on updates, None on create."""
    errors: list[FieldError] = []
    skipped: list[str] = []
    _walk(_cel_view(obj), _ABSENT if old is None else _cel_view(old), schema, "", errors, skipped)
    return errors, skipped


def _cel_view(obj: JsonObject) -> JsonObject:
    """The object as root rules see it: of metadata, CEL sees only ``name`` and ``generateName``."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return obj
    kept = {key: metadata[key] for key in ("name", "generateName") if key in metadata}
    return {**obj, "metadata": kept}


def _walk(
    value: Any, old: Any, schema: Schema, path: str, errors: list[FieldError], skipped: list[str]
) -> None:
    for entry in schema.get("x-kubernetes-validations") or []:
        if not isinstance(entry, Mapping):
            continue
        try:
            rule = compile_rule(entry)
        except Unsupported:
            skipped.append(str(entry.get("rule")))
            continue
        if rule.transition and old is _ABSENT:
            continue
        if not rule.transition and old is not _ABSENT and _same(value, old):
            # Ratcheting (Kubernetes >= 1.30): a rule without oldSelf is not re-checked on an
            # unchanged value, so objects stored before a rule was added can still be updated.
            continue
        where = path + rule.field_path if rule.field_path else path
        shown = where or "<nil>"
        try:
            passed = rule.evaluate({"self": value, "oldSelf": None if old is _ABSENT else old})
            if not isinstance(passed, bool):
                raise CelError("rule did not evaluate to a boolean")
        except CelError as error:
            errors.append(
                FieldError(
                    shown,
                    "FieldValueInvalid",
                    f'Invalid value: "{_type_of(schema, value)}": {error} evaluating rule: '
                    f"{rule.message or rule.text}",
                )
            )
            continue
        except RecursionError:
            skipped.append(rule.text)
            continue
        if not passed:
            message = rule.message or f"failed rule: {rule.text}"
            if rule.reason == "FieldValueForbidden":
                errors.append(FieldError(shown, rule.reason, f"Forbidden: {message}"))
            elif rule.reason == "FieldValueRequired":
                errors.append(FieldError(shown, rule.reason, f"Required value: {message}"))
            elif rule.reason == "FieldValueDuplicate":
                errors.append(
                    FieldError(shown, rule.reason, f'Duplicate value: "{_type_of(schema, value)}": {message}')
                )
            else:
                errors.append(
                    FieldError(
                        shown, "FieldValueInvalid", f'Invalid value: "{_type_of(schema, value)}": {message}'
                    )
                )
    if isinstance(value, Mapping):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            child_schema = properties.get(key) or (additional if isinstance(additional, Mapping) else None)
            if child_schema is None:
                continue
            child_old = old.get(key, _ABSENT) if isinstance(old, Mapping) else _ABSENT
            _walk(item, child_old, child_schema, f"{path}.{key}" if path else key, errors, skipped)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        unchanged = isinstance(old, list) and _same(value, old)
        for index, item in enumerate(value):
            # Plain lists are not correlatable: no oldSelf for the items of a changed list (an
            # unchanged list's items are trivially their old selves).
            item_old = old[index] if unchanged else _ABSENT
            _walk(item, item_old, schema["items"], f"{path}[{index}]", errors, skipped)


def _same(left: Any, right: Any) -> bool:
    return type(left) is type(right) and bool(left == right)
