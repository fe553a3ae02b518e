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
    assert set(pip) == set(conda), (
        f"only in pyproject: {set(pip) - set(conda)}; only in environment.yml: {set(conda) - set(pip)}"
    )
    for name, spec in pip.items():
        assert conda[name].replace(" ", "") == spec.replace(" ", ""), (
            f"{name}: pyproject {spec!r} vs conda {conda[name]!r}"
        )


def test_readme_starts_with_the_two_commands_and_lists_every_lesson():
    readme = (ROOT / "README.md").read_text()
    first_commands = re.findall(r"^make (\w+)", readme, flags=re.M)[:2]
    assert first_commands == ["lab", "test"]
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert nb.name in readme, f"README's lesson table does not list {nb.name}"


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_the_installed_package_works_outside_the_checkout(tmp_path):
    """Installed (not editable) into a folder of its own and run from elsewhere: a lesson's
    functions on real workers, and the grader on a solution with the instructor's checks."""
    import os
    import shutil
    import subprocess

    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                            str(ROOT)], capture_output=True, text=True, timeout=300)
    if build.returncode != 0 and "Could not" in build.stderr:
        pytest.skip(f"pip could not build the package here (no package index?): {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr[-2000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "solutions" / "00_cluster_in_your_laptop.ipynb", work / "alice.ipynb")
    env = dict(os.environ, PYTHONPATH=str(site))
    program = ("import course_lib, pathlib\n"
               f"assert pathlib.Path(course_lib.__file__).is_relative_to({str(site)!r}), course_lib.__file__\n"
               "from course_lib import Cluster, costs\n"
               "with Cluster(2, start_method='spawn') as c:\n"
               "    assert list(c.run(lambda comm: comm.allreduce(comm.rank + 1))) == [3, 3]\n"
               "assert costs.predict('allreduce', 'ring', 4, 1e6, costs.CostModel()) > 0\n")
    run = subprocess.run([sys.executable, "-c", program], cwd=work, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    grade = subprocess.run([sys.executable, "-m", "course_lib.grade", "alice.ipynb", "--out", "out",
                            "--hidden", str(ROOT / "tests" / "hidden")], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
    assert grade.returncode == 0, grade.stdout[-2000:] + grade.stderr[-2000:]
    rows = (work / "out" / "scores.csv").read_text().splitlines()
    assert rows[0].startswith("submission,ex00_1") and rows[1].endswith(",5,5"), rows
