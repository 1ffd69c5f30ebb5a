"""Thin sessions: each installs the package and calls it. No logic lives here.

nox -s matrix                      # run the default matrix (matrix/glm5-nvfp4.toml)
nox -s matrix -- matrix/cpu-smoke.toml --select mode=static
nox -s report                      # a report of the store, into .servematrix/report/
nox -s recommend                   # which stack to pick, per GPU kind
nox -s plan -- matrix/glm5-nvfp4.toml --format json
nox -s tests                       # the whole test suite (needs ci/install-system-deps.sh once)
nox -s tests -- -m "not slow"      # the quick tests
nox -s lint                        # ruff, mypy, shellcheck (pinned)
nox -s docs                        # the docs site (mkdocs) from the published results
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]
nox.needs_version = ">=2024.4.15"
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


@nox.session
def matrix(session: nox.Session) -> None:
    """Run a matrix: nox -s matrix -- [MATRIX] [--select EXPR]... [--stages ...] (see servematrix run --help)."""
    session.install(".")
    session.run("servematrix", "run", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """A report of the store: nox -s report -- [--store PATH] [--out DIR] [--publish] (see servematrix report --help)."""
    session.install(".")
    session.run("servematrix", "report", *session.posargs)


@nox.session
def recommend(session: nox.Session) -> None:
    """Which stack to pick per GPU kind: nox -s recommend -- [MATRIX] [--store PATH] [--format json]."""
    session.install(".")
    session.run("servematrix", "recommend", *session.posargs)


@nox.session
def plan(session: nox.Session) -> None:
    """A matrix's cells: nox -s plan -- [MATRIX] [--select EXPR]... [--format table|json|github]."""
    session.install(".")
    session.run("servematrix", "plan", *session.posargs)


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve a lock per environment: nox -s lock -- [MATRIX] [--select EXPR]... [--format json]."""
    session.install(".")
    session.run("servematrix", "lock", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite, slow integration tests included: nox -s tests -- [pytest args] (quick: -m "not slow")."""
    # Installed as users install it (not editable), so the tests see the wheel's contents.
    session.install(".[test]")
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site: its generated pages rendered again from the published results (docs/results/latest.json,
    never a local store), then mkdocs build --strict into site/."""
    session.install(".", "mkdocs-material>=9.5")
    session.run("servematrix", "report", "--publish", "--from-published", *session.posargs)
    session.run("mkdocs", "build", "--strict")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy and shellcheck, at the versions pinned in pyproject's `lint` extra."""
    session.install("-e", ".[lint]")
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")
    session.run("mypy")
    session.run("shellcheck", *sorted(str(p) for p in Path("ci").rglob("*.sh")), ".ci/run")
