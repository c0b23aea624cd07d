"""The container image, without a container engine: what the Dockerfile puts in it, and how big it is.

No Docker engine runs where these tests run, so the image is not built here. What can be checked
without one is checked: the Dockerfile is linted (hadolint), its structure asserted, the list of
distributions it prunes recomputed from the dependency graph, the controller run with those
distributions made unimportable (tests/deploy/scenario.py), and the virtualenv layer's size
computed from the installed files of exactly the distributions the image keeps.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PROJECT = "kserve-canary"
# Distributions kserve-canary's dependencies declare but only code it never imports uses:
# the kubernetes client's asyncio twin (kubernetes.aio) needs aiohttp and aiohttp-retry.
UNUSED_EDGES = {("kubernetes", "aiohttp"), ("kubernetes", "aiohttp-retry")}
# Removed from the kept distributions' files (paths relative to site-packages).
PRUNED_PATHS = ("kubernetes/aio/",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile_prune_list() -> set[str]:
    match = re.search(r'ARG PRUNE_DISTRIBUTIONS="([^"]+)"', DOCKERFILE.read_text())
    assert match, "Dockerfile: ARG PRUNE_DISTRIBUTIONS is missing"
    return {canonical(name) for name in match.group(1).split()}


def _requirements(distribution: str) -> list[str]:
    """Runtime requirements of an installed distribution (no extras), markers evaluated here."""
    found = []
    for text in metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        found.append(canonical(requirement.name))
    return found


def closure(root: str = PROJECT, skip_edges: Iterable[tuple[str, str]] = ()) -> set[str]:
    """Every distribution the runtime needs, following requirements from ``root``."""
    skipped = {(canonical(a), canonical(b)) for a, b in skip_edges}
    seen: set[str] = set()
    pending = [canonical(root)]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        pending.extend(req for req in _requirements(name) if (name, req) not in skipped)
    return seen


def expected_prune_list() -> set[str]:
    """What the image can drop: needed only through the unused edges."""
    return closure() - closure(skip_edges=UNUSED_EDGES)


def top_level_modules(distributions: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for distribution in distributions:
        for file in metadata.files(distribution) or []:
            parts = file.parts
            if (
                parts
                and not parts[0].endswith((".dist-info", ".data"))
                and parts[0] not in {"..", "__pycache__"}
            ):
                top = parts[0].removesuffix(".py")
                if top.isidentifier():
                    names.add(top.split(".")[0])
    return names


@functools.cache
def blocked_modules() -> tuple[str, ...]:
    """Modules the image does not have: the pruned distributions' and ``kubernetes.aio``."""
    return tuple(sorted(top_level_modules(dockerfile_prune_list()) | {"kubernetes.aio"}))


def blocking_launcher() -> str:
    """``python -c`` source running ``kserve-canary`` where the pruned modules cannot be imported."""
    blocked = json.dumps(blocked_modules())
    return (
        "import sys, importlib.abc\n"
        f"BLOCKED = {blocked}\n"
        "class Pruned(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == b or name.startswith(b + '.') for b in BLOCKED):\n"
        "            raise ImportError(f'{name} is not in the kserve-canary image (Dockerfile prunes it)')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Pruned())\n"
        "sys.argv[0] = 'kserve-canary'\n"
        "from canary.cli import main\n"
        "main()\n"
    )


def _installed_bytes(distribution: str) -> int:
    total = 0
    for file in metadata.files(distribution) or []:
        text = str(file)
        if "__pycache__" in file.parts or text.endswith(".pyc") or text.startswith(".."):
            continue
        if any(text.startswith(prefix) for prefix in PRUNED_PATHS):
            continue
        located = Path(str(file.locate()))
        if located.is_file():
            total += located.stat().st_size
    return total


def _project_bytes() -> int:
    """kserve-canary's own wheel content: the canary package's Python files and py.typed."""
    package = ROOT / "canary"
    return sum(p.stat().st_size for p in package.rglob("*") if p.suffix == ".py" or p.name == "py.typed")


def _bytecode_bytes() -> int:
    """Bytecode the Dockerfile compiles: every module `kserve-canary run` loads (canary.cli.controller; canary.cli itself imports only Typer), compiled afresh."""
    script = (
        blocking_launcher().split("sys.argv[0]")[0]
        + "import canary.cli, canary.cli.controller, json, os, py_compile, tempfile\n"
        + f"package = {str(ROOT / 'canary')!r}\n"
        + "target, total = tempfile.mkdtemp(), 0\n"
        + "for i, module in enumerate(list(sys.modules.values())):\n"
        + "    path = getattr(module, '__file__', None) or ''\n"
        + "    if path.endswith('.py') and ('site-packages' in path or path.startswith(package)):\n"
        + "        out = os.path.join(target, f'{i}.pyc')\n"
        + "        py_compile.compile(path, cfile=out, doraise=True,"
        + " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
        + "        total += os.path.getsize(out)\n"
        + "print(json.dumps(total))\n"
    )
    with tempfile.TemporaryDirectory() as cwd:
        completed = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120, cwd=cwd
        )
    return int(json.loads(completed.stdout.strip().splitlines()[-1]))


def venv_layer_bytes() -> dict[str, int]:
    """The virtualenv layer, by distribution (plus bytecode), as the Dockerfile builds it."""
    kept = closure() - dockerfile_prune_list()
    sizes = {name: _installed_bytes(name) for name in sorted(kept - {PROJECT})}
    sizes[PROJECT] = _project_bytes()
    sizes["(bytecode of imported modules)"] = _bytecode_bytes()
    return sizes
