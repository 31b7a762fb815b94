"""containers/: the Dockerfile and the Apptainer definition of the image `make install` makes (issue 65). Neither can
be built here (no registry for base images), so they are read: every line an instruction or section the tools know,
the install is the Makefile's (`make install INSTALL_FOR=...`, no pins repeated), the local venv stays out, and the
PATH puts `marti-ibrl`, `ray` and `python` where the recipes look (recipes/prologue.sh)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
DEFINITION = ROOT / "containers" / "marti-ibrl.def"
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "CMD", "LABEL", "ENTRYPOINT", "USER"}
SECTIONS = {"%arguments", "%files", "%post", "%environment", "%runscript", "%labels", "%help", "%test", "%setup"}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, comments dropped and continuation lines joined."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [tuple(line.split(None, 1)) for line in joined.splitlines()]


def _install_for_values() -> set[str]:
    make = (ROOT / "Makefile").read_text()
    return set(re.search(r'case "\$\(INSTALL_FOR\)" in ([\w|]+)\)', make).group(1).split("|"))


def test_the_dockerfile_reads_as_one_and_installs_as_make_does() -> None:
    steps = _instructions(DOCKERFILE.read_text())
    assert {op for op, _ in steps} <= INSTRUCTIONS and all(op.isupper() for op, _ in steps), steps
    assert steps[0] == ("ARG", "BASE=python:3.11-slim-bookworm") and steps[1] == ("FROM", "${BASE}")
    args = dict(a.split("=", 1) for op, a in steps if op == "ARG")
    assert args["INSTALL_FOR"] in _install_for_values() == {"auto", "cpu", "gpu"}
    runs = " ".join(a for op, a in steps if op == "RUN")
    assert "make install PYTHON=python3 INSTALL_FOR=${INSTALL_FOR}" in runs and "torch==" not in runs
    assert ("ENV", "PATH=/opt/marti-ibrl/.venv/bin:${PATH}") in steps
    ignored = (ROOT / "containers" / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", "runs"} <= set(ignored)


def test_the_apptainer_definition_reads_as_one_and_installs_as_make_does() -> None:
    text = DEFINITION.read_text()
    body = [line for line in text.splitlines() if not line.startswith("#")]
    header = dict(line.split(": ", 1) for line in body[: body.index("")] if line)
    assert header == {"Bootstrap": "docker", "From": "{{ BASE }}"}
    sections = {line.split()[0]: i for i, line in enumerate(body) if line.startswith("%")}
    assert set(sections) <= SECTIONS and {"%arguments", "%files", "%post", "%environment"} <= set(sections)

    def section(name: str) -> list[str]:
        start = sections[name] + 1
        end = min((i for i in sections.values() if i > sections[name]), default=len(body))
        return [line.strip() for line in body[start:end] if line.strip()]

    arguments = dict(line.split("=", 1) for line in section("%arguments"))
    assert arguments["BASE"] == "python:3.11-slim-bookworm" and arguments["INSTALL_FOR"] in _install_for_values()
    used = set(re.findall(r"\{\{ (\w+) \}\}", text))
    assert used == set(arguments)  # every templated name has a default
    assert section("%files") == [". /opt/marti-ibrl"]
    post = " ".join(section("%post"))
    assert "rm -rf .venv runs" in post and "make install PYTHON=python3 INSTALL_FOR={{ INSTALL_FOR }}" in post
    assert section("%environment") == ["export PATH=/opt/marti-ibrl/.venv/bin:$PATH"]


def test_both_build_the_same_image() -> None:
    """The same base, packages and install in both files (one changed without the other would drift)."""
    docker = DOCKERFILE.read_text()
    apptainer = DEFINITION.read_text()
    packages = "make patch git g++ python3 python3-venv python3-dev"
    assert packages in docker and packages in apptainer
    assert '.venv/bin/pip install --no-build-isolation -e ".[gpu]"' in docker and apptainer.count('-e ".[gpu]"') == 1
