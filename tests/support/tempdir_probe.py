"""A role that prints the temporary directory Python's ``tempfile`` gives it (its TMPDIR)."""

from __future__ import annotations

import tempfile

if __name__ == "__main__":
    print(f"tempdir {tempfile.gettempdir()}", flush=True)
