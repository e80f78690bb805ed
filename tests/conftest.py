"""Shared by both tiers: the end of a run lists the test files that took longest in total, so a file that grows
slow is seen before the suite outgrows CI's limit."""

from __future__ import annotations

from collections import Counter

import pytest

_SLOWEST_FILES = 8


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    totals: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                totals[report.nodeid.split("::", 1)[0]] += report.duration
    if len(totals) < 2:
        return
    terminalreporter.write_sep("=", f"slowest {min(_SLOWEST_FILES, len(totals))} test files (setup, call and "
                                    f"teardown), of {sum(totals.values()):.0f} s in all")
    for path, seconds in totals.most_common(_SLOWEST_FILES):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
