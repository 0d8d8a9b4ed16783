"""Every source path the README and docs/ name exists: a file moved or renamed fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A file (with its extension) or a folder (with its slash); `batchserve/tokenizer`, a tokenizer's
# hub name in a command line, is neither.
PATH = re.compile(r"(?<![\w/.~$])((?:batchserve|tests|scripts)/(?:[\w-]+/)*(?:[\w-]+\.\w+)?)")


def test_every_named_source_path_exists() -> None:
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for path in PATH.findall(line):
                if not (ROOT / path).exists():
                    missing.append(f"{doc.name}:{number}: {path}")
    assert not missing, "\n".join(missing)


def test_the_package_is_the_only_top_level_source_folder() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders == {"batchserve", "tests"}, folders


def test_the_readme_shows_the_migrations_head_revision() -> None:
    from alembic.script import ScriptDirectory

    from batchserve.core.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    shown = re.findall(r"^database at revision (\w+)$", (ROOT / "README.md").read_text(), re.M)
    assert shown == [head], (shown, head)
