"""Shared test helpers of kernelbench-eval's tests."""

import pytest


def _md_row(md: str, *cells: str) -> bool:
    """Whether a Markdown table row of ``md`` begins with these cells (each stripped): a test
    checks what a report's row says (the label, the counts, the figures), not its spacing."""
    want = tuple(str(c).strip() for c in cells)
    for line in md.splitlines():
        line = line.strip()
        if line.startswith("|"):
            row = tuple(c.strip() for c in line.strip("|").split("|"))
            if row[: len(want)] == want:
                return True
    return False


@pytest.fixture
def md_row():
    """``md_row(md, *cells)``: a row of one of ``md``'s tables begins with ``cells``."""
    return _md_row
