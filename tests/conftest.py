"""Shared by both tiers: the end of a run lists the test files that took longest in total, and writes every test's
time to build/test-durations.json, so a file that grows slow is seen before the suite outgrows CI's limit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

_SLOWEST_FILES = 8


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    totals: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                totals[report.nodeid.split("::", 1)[0]] += report.duration
                tests[report.nodeid] += report.duration
    if len(totals) < 2:
        return
    out = Path(__file__).resolve().parent.parent / "build" / "test-durations.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({k: round(v, 1) for k, v in tests.most_common()}, indent=1))
    terminalreporter.write_sep("=", f"slowest {min(_SLOWEST_FILES, len(totals))} test files (setup, call and "
                                    f"teardown), of {sum(totals.values()):.0f} s in all")
    for path, seconds in totals.most_common(_SLOWEST_FILES):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
