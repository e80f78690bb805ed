"""CPU time of the processes a benchmark measures: this driver, its Spark JVM and every Python worker (and the
raw client), never the broker. On a 2-core machine shared by the broker, the JVM and the workers, wall time can
favour a case that burns more CPU; CPU per record is what a cluster's user pays.

Two ways to count, the first that works:

* ``cgroup``: this process moves itself into a cpuacct cgroup of its own (cgroup v1 ``cpuacct`` or v2 ``cpu.stat``;
  needs root), after the broker started, so every process it starts from then on is counted, however short-lived,
  and the broker is not.
* ``proc``: the user + system time in ``/proc`` of this process and its living descendants, plus what their
  reaped children left them (``cutime``/``cstime``), the broker's process tree left out. A worker that exits and is
  reaped between two reads is still counted, through its parent.

``CpuMeter.seconds()`` is a running total; a case's CPU is the difference around its write.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.rss import proc_stat

_TICK = os.sysconf("SC_CLK_TCK")
_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = Path("/sys/fs/cgroup")


class CpuMeter:
    """A running total of the CPU seconds spent by this process and what it starts, the broker's pids excluded."""

    def __init__(self, exclude_pids: set[int]) -> None:
        self.exclude = set(exclude_pids)
        self.method = "proc"
        self._usage: Path | None = None
        self._cgroup: Path | None = None
        self._join_cgroup()

    def _join_cgroup(self) -> None:
        name = f"recoverable-bench-{os.getpid()}"
        for stale in [*_V1.glob("recoverable-bench-*"), *_V2.glob("recoverable-bench-*")]:
            try:
                stale.rmdir()  # an earlier run's, empty now (removal fails, harmlessly, while one still runs)
            except OSError:
                pass
        candidates = []
        if (_V1 / "cpuacct.usage").exists():
            candidates.append((_V1 / name, "cpuacct.usage"))
        if (_V2 / "cgroup.controllers").exists():
            candidates.append((_V2 / name, "cpu.stat"))
        for folder, usage in candidates:
            try:
                folder.mkdir(exist_ok=True)
                (folder / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                continue
            self._cgroup, self._usage, self.method = folder, folder / usage, "cgroup"
            return

    def seconds(self) -> float:
        """CPU seconds (user + system) so far."""
        if self._usage is not None:
            text = self._usage.read_text()
            if self._usage.name == "cpuacct.usage":
                return int(text) / 1e9
            usec = dict(line.split() for line in text.splitlines())["usage_usec"]
            return int(usec) / 1e6
        return _tree_seconds(os.getpid(), self.exclude)

    def close(self, wait_s: float = 30.0) -> None:
        """Leave the cgroup and remove it once the processes started in it (Spark's JVM, exiting) are gone."""
        if self._cgroup is None:
            return
        try:
            (self._cgroup.parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._cgroup.rmdir()
                return
            except OSError:  # still holds a process that is exiting
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.2)


def _tree_seconds(root: int, exclude: set[int]) -> float:
    """User + system seconds of ``root`` and its living descendants, with their reaped children's, in ticks."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, ticks)
    for entry in os.scandir("/proc"):
        fields = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is None:
            continue
        # After the name: state, ppid, ..., utime (14th field overall), stime, cutime, cstime.
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid not in stats:
            continue
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total / _TICK
