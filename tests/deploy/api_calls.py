"""Which Kubernetes API requests the code can make, read from the code itself.

Every method of the official client's ``*Api`` classes is generated with its HTTP method and path in
``_<method>_serialize``; the AST of each module of the product (not the emulator and test harnesses)
names the API methods it calls or hands to ``watch.Watch().stream``. Custom-object calls get their
group and plural from the call's arguments (constants resolved in the module). Together that is the
set of (API group, resource, verb) the code may ask the apiserver for.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.deploy.rbac import attributes

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "canary"
# Tools that talk to the API emulator on a developer's machine, never to a cluster's apiserver:
# the emulator itself, test and demo harnesses, the simulated serving fleet.
NOT_SHIPPED_TO_CLUSTERS = ("emulator", "testing", "simulation", "demo")

_SERIALIZE = re.compile(r"method='(?P<method>[A-Z]+)',\s*resource_path='(?P<path>[^']+)'")


@dataclass(frozen=True)
class Endpoint:
    api_class: str
    method: str  # HTTP
    path: str  # template, e.g. /api/v1/namespaces/{namespace}/configmaps/{name}
    parameters: tuple[str, ...]  # the Python method's positional parameters


@functools.cache
def _api_classes() -> dict[str, type]:
    classes = {
        name: getattr(client, name) for name in dir(client) if name.endswith("Api") and name != "ApiClient"
    }
    return {name: cls for name, cls in classes.items() if inspect.isclass(cls)}


@functools.cache
def api_method_names() -> frozenset[str]:
    """Every public request method of every generated API class (cheap: no source is read)."""
    return frozenset(
        name
        for cls in _api_classes().values()
        for name in vars(cls)
        if not name.startswith("_")
        and not name.endswith("_with_http_info")
        and hasattr(cls, f"_{name}_serialize")
    )


@functools.cache
def endpoint(class_name: str, name: str) -> Endpoint | None:
    """The HTTP method and path of ``class_name.name``, from its generated serializer."""
    api_class = _api_classes().get(class_name)
    serializer = getattr(api_class, f"_{name}_serialize", None) if api_class else None
    if serializer is None:
        return None
    match = _SERIALIZE.search(inspect.getsource(serializer))
    if match is None:
        return None
    parameters = tuple(
        p.name
        for p in inspect.signature(getattr(api_class, name)).parameters.values()
        if p.name != "self" and p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    )
    return Endpoint(class_name, match["method"], match["path"], parameters)


@dataclass(frozen=True)
class ApiCall:
    module: str
    line: int
    api_method: str
    api_class: str
    group: str
    resource: str
    verbs: tuple[str, ...]
    namespaced: bool

    @property
    def triples(self) -> set[tuple[str, str, str]]:
        return {(self.group, self.resource, verb) for verb in self.verbs}

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.api_class}.{self.api_method} -> {', '.join(self.verbs)} {self.resource}"


def shipped_modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in NOT_SHIPPED_TO_CLUSTERS
    )


def _api_classes_instantiated(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            callee = node.func
            name = (
                callee.attr
                if isinstance(callee, ast.Attribute)
                else callee.id
                if isinstance(callee, ast.Name)
                else ""
            )
            if name.endswith("Api") and name != "ApiClient" and hasattr(client, name):
                names.add(name)
    return names


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    current = parents.get(node)
    while current is not None and not isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef):
        current = parents.get(current)
    return current


def _resolve(node: ast.expr, module_name: str) -> Any:
    """A constant, or a module-level name of the module (imported only then)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        module = importlib.import_module(module_name)
        if hasattr(module, node.id):
            return getattr(module, node.id)
    raise LookupError(ast.unparse(node))


def scan(paths: Iterable[Path] | None = None) -> list[ApiCall]:
    """Every Kubernetes API call site in the shipped code (or ``paths``). Raises when a site cannot
    be attributed to one API class, or a custom object's group and plural cannot be resolved."""
    known = api_method_names()
    calls: list[ApiCall] = []
    for path in shipped_modules() if paths is None else paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        module_name = ".".join(relative.with_suffix("").parts)
        instantiated = _api_classes_instantiated(tree)
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in known):
                continue
            candidates = {
                name: found
                for name in sorted(instantiated)
                if (found := endpoint(name, node.attr)) is not None
            }
            if len(candidates) != 1:
                raise AssertionError(
                    f"{relative}:{node.lineno}: cannot tell which API class {node.attr} belongs to "
                    f"(instantiated here: {sorted(instantiated)})"
                )
            ((api_class, target),) = candidates.items()
            parent = parents.get(node)
            if isinstance(parent, ast.Call) and parent.func is node:
                call_keywords, arguments, watched = parent.keywords, parent.args, False
            else:
                # Handed to ``watch.Watch().stream`` — directly, or as the head of an argument tuple
                # that is splatted into it: a list that is watched.
                function = _enclosing_function(node, parents)
                streams = [
                    n
                    for n in ast.walk(function or tree)
                    if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "stream"
                ]
                if not streams or target.method != "GET":
                    raise AssertionError(
                        f"{relative}:{node.lineno}: {node.attr} used neither as a call nor a watch"
                    )
                if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
                    call_keywords, arguments = parent.keywords, parent.args[1:]
                elif isinstance(parent, ast.Tuple | ast.List) and parent.elts and parent.elts[0] is node:
                    call_keywords, arguments = [], parent.elts[1:]
                else:
                    raise AssertionError(
                        f"{relative}:{node.lineno}: cannot find the arguments of {node.attr}"
                    )
                watched = True
            bound = dict(zip(target.parameters, arguments, strict=False))
            bound.update({k.arg: k.value for k in call_keywords if k.arg})
            template = target.path
            if "{group}" in template or "{plural}" in template:
                try:
                    template = template.replace("{group}", str(_resolve(bound["group"], module_name)))
                    template = template.replace("{plural}", str(_resolve(bound["plural"], module_name)))
                except (KeyError, LookupError, ImportError) as error:
                    raise AssertionError(
                        f"{relative}:{node.lineno}: cannot resolve group/plural: {error}"
                    ) from None
            example = template.replace("{namespace}", "ns").replace("{name}", "x")
            example = re.sub(r"\{[a-z_]+\}", "v", example)
            request = attributes(target.method, example)
            assert request is not None, example
            verbs = (request.verb, "watch") if watched else (request.verb,)
            calls.append(
                ApiCall(
                    str(relative),
                    node.lineno,
                    node.attr,
                    api_class,
                    request.group,
                    request.resource,
                    verbs,
                    "{namespace}" in target.path,
                )
            )
    return calls
