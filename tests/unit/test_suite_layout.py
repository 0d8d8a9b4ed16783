"""`make test` runs the suite in parallel processes, the images' test among them (their layers
built during the setup, beside the installs: minutes of downloads, unpacking and copying), and
afterwards and alone the tests that take a shared server down.
A test module that restarts Postgres, RabbitMQ or Redis and is not marked so
would break whatever runs beside it: it fails here instead."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAKES_A_SERVER_DOWN = re.compile(r"\b(?:restart|stop)_(?:postgres|redis|rabbitmq)\b")
MARKED = re.compile(r"^pytestmark = pytest\.mark\.exclusive$", re.MULTILINE)
IMAGES = re.compile(r"^\s+pytest\.mark\.images,$", re.MULTILINE)


def test_every_module_that_takes_a_server_down_runs_alone() -> None:
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    downing = [m for m in modules if TAKES_A_SERVER_DOWN.search(m.read_text())]
    assert downing, "the server chaos tests moved: update this test"
    unmarked = [str(m.relative_to(ROOT)) for m in downing if not MARKED.search(m.read_text())]
    assert unmarked == []
    marked = [m for m in modules if MARKED.search(m.read_text())]
    assert marked == downing  # nothing runs alone that need not


def test_make_test_runs_the_rest_in_parallel_then_the_exclusive_ones() -> None:
    lines = _recipe("test").splitlines()
    runs = [line.strip() for line in lines if "pytest" in line and "#" not in line]
    assert len(runs) == 2, runs
    parallel = '-m "not exclusive"'
    assert " -n " in runs[0] and parallel in runs[0] and "--dist loadfile" in runs[0]
    assert " -n " not in runs[1] and "-m exclusive" in runs[1]
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert [m.name for m in modules if IMAGES.search(m.read_text())] == ["test_images_live.py"]


def test_make_test_installs_the_debian_tools_its_tests_need() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.split("\ntest:", 1)[1].split("\n", 1)[0].split() == ["debian-tools"]
    tools = re.search(r"^DEBIAN_TOOLS := (.*)$", makefile, re.MULTILINE)
    assert tools is not None
    commands = {pair.split(":")[0] for pair in tools.group(1).split()}
    assert commands == {"kubectl", "buildah", "mmdebstrap"}


def _recipe(target: str) -> str:
    """The Makefile's lines for ``target``, up to the blank line after them."""
    return (ROOT / "Makefile").read_text().split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]


def _setup_targets() -> list[str]:
    """What `make test` makes at once before its tests (its one ``$(MAKE)`` line)."""
    (setup,) = [line for line in _recipe("test").splitlines() if "$(MAKE)" in line]
    return setup.split()


def test_make_test_installs_the_dashboard_browser_during_setup() -> None:
    assert "test-browser" in _setup_targets()
    assert "-m tests.support.browser" in _recipe("test-browser")
    assert (
        "ensure_chromium()"
        in (ROOT / "tests/support/browser.py").read_text().split('if __name__ == "__main__":', 1)[1]
    )


def test_make_test_builds_the_images_layers_during_setup_as_their_test_does() -> None:
    assert "image-layers" in _setup_targets()
    assert "$(PYTHON) -m tests.support.images" in _recipe("image-layers")
    # It starts with the setup, not after an install: the system's Python runs it, on the
    # standard library alone (no site-packages here).
    assert _recipe("image-layers").split("\n", 1)[0].split() == ["debian-tools"]
    alone = [sys.executable, "-S", "-c", "import tests.support.images"]
    assert subprocess.run(alone, cwd=ROOT, capture_output=True, check=False).returncode == 0
    main = (ROOT / "tests/support/images.py").read_text().split("def main()", 1)[1]
    fixture = (ROOT / "tests/e2e/test_images_live.py").read_text()
    assert 'build("test", log)' in main and 'images.build("test", log)' in fixture
    # The test takes what the setup built, from this tree (the stamp the build leaves).
    assert "stamp.write_text(" in main and 'images.prebuilt("test") or' in fixture
