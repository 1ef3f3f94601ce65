"""The exit statuses of docs/failure-behaviour.md's table, for the tests that reproduce
its rows: each such test asserts its exit status through :func:`table_exit`, so the
table is the one place a status is written, and test_docs walks the table to check that
every row has a test (and every test a row)."""
import os
import re

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "failure-behaviour.md")


def table_rows(page=PAGE):
    """{fault text: allowed exit statuses} of the table; "–" (the run carries on) is 0."""
    rows = {}
    with open(page, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 4 or cells[0] in ("fault", "---"):
                continue
            exits = cells[2]
            rows[cells[0]] = (0,) if exits == "–" else tuple(int(v) for v in re.split(r"\s*/\s*", exits))
    return rows


def row_for(fault, rows=None):
    """The one row whose fault text starts with ``fault``."""
    rows = table_rows() if rows is None else rows
    found = [text for text in rows if text.startswith(fault)]
    assert len(found) == 1, f"{fault!r} names {len(found)} rows of {PAGE}"
    return found[0]


def table_exit(fault, returncode):
    """Whether ``returncode`` (a subprocess's, -N for signal N as Python reports it, or a
    main()'s) is the exit status the table gives the row of ``fault``: the shell's
    128 + N for a signal."""
    status = 128 - returncode if returncode < 0 else returncode
    allowed = table_rows()[row_for(fault)]
    assert status in allowed, f"exit {status}, but {PAGE} says {'/'.join(map(str, allowed))} for {fault!r}"
    return True
