"""Markdown tables for the generated docs pages."""

from __future__ import annotations

from typing import Any


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = [_row(header), _row(["---"] * len(header))]
    return "\n".join(lines + [_row(r) for r in rows])
