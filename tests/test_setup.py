"""The two-command setup stays honest: dependencies in sync, README lists every lesson."""
from __future__ import annotations

import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _conda_deps() -> dict[str, str]:
    deps = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"\s*-\s+([A-Za-z0-9_.\-]+)\s*(.*)$", line)
        if m and m.group(1) not in ("conda-forge", "pip", "python"):
            deps[m.group(1).lower()] = m.group(2).strip()
    return deps


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_specs = project["dependencies"] + project["optional-dependencies"]["test"]
    pip = {_name(s): s[len(_name(s)):].strip() for s in pip_specs}
    conda = _conda_deps()
    assert set(pip) == set(conda), f"only in pyproject: {set(pip) - set(conda)}; only in environment.yml: {set(conda) - set(pip)}"
    for name, spec in pip.items():
        assert conda[name].replace(" ", "") == spec.replace(" ", ""), f"{name}: pyproject {spec!r} vs conda {conda[name]!r}"


def test_readme_starts_with_the_two_commands_and_lists_every_lesson():
    readme = (ROOT / "README.md").read_text()
    first_commands = re.findall(r"^make (\w+)", readme, flags=re.M)[:2]
    assert first_commands == ["lab", "test"]
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert nb.name in readme, f"README's lesson table does not list {nb.name}"


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
