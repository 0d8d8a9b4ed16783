"""The suite's own scheduling: the long files it starts first are files that exist."""

from __future__ import annotations

from batchserve.testing.deployment import ROOT
from tests.conftest import LONG_FILES


def test_the_long_files_started_first_exist_and_are_named_once() -> None:
    missing = [path for path in LONG_FILES if not (ROOT / path).is_file()]
    assert missing == []
    assert len(set(LONG_FILES)) == len(LONG_FILES)
