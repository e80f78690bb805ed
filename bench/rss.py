"""Peak resident memory of Spark's Python workers, sampled from /proc while a write runs (Linux only)."""

from __future__ import annotations

import os
import threading

_MARKERS = ("pyspark.daemon", "pyspark.worker")


def proc_stat(pid: int) -> list[str] | None:
    """A process's /proc stat fields after its command name (state, ppid, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # The command name may hold spaces or parentheses: the fields after its last ")" are safe to split.
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ppid(pid: int) -> int | None:
    fields = proc_stat(pid)
    return int(fields[1]) if fields else None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of a process, in clock ticks."""
    fields = proc_stat(pid)
    return int(fields[11]) + int(fields[12]) if fields else None


def rss_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) in KiB. VmRSS also counts the LMDB file pages the worker has mapped (page cache it
    shares with the kernel); RssAnon is the worker's own heap, which is what can run an executor out of memory."""
    total = anon = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return (total, anon or 0) if total is not None else None


def descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        parent = _ppid(pid)
        if parent is None:
            return False
        pid, seen = parent, seen + 1
    return False


class WorkerRssSampler:
    """Every ``interval_s``, VmRSS of each process below this one (the Spark JVM's children) whose command
    line names a PySpark daemon or worker; keeps each process's maximum, and reports the largest among the
    workers that used CPU meanwhile (at least 0.2 s). Forked workers inherit the daemon's
    command line, so both markers match them."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_kib: dict[int, int] = {}
        self.peak_anon_kib: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._me = os.getpid()
        self._known: dict[int, bool] = {}  # pid -> is a PySpark worker of ours (decided once per pid)
        self._cpu: dict[int, tuple[int, int]] = {}  # pid -> CPU ticks (first seen, last seen)

    def __enter__(self) -> WorkerRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _is_worker(self, pid: int) -> bool:
        known = self._known.get(pid)
        if known is None:
            cmd = cmdline(pid)
            known = any(m in cmd for m in _MARKERS) and descends_from(pid, self._me)
            self._known[pid] = known
        return known

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == self._me or not self._is_worker(pid):
                continue
            rss, ticks = rss_kib(pid), _cpu_ticks(pid)
            if rss is None or ticks is None:
                continue
            self._cpu[pid] = (self._cpu.get(pid, (ticks, ticks))[0], ticks)
            self.peak_kib[pid] = max(self.peak_kib.get(pid, 0), rss[0])
            self.peak_anon_kib[pid] = max(self.peak_anon_kib.get(pid, 0), rss[1])

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def _busy(self) -> list[int]:
        """The workers that ran the write: an idle worker keeps the memory its last task left (RSS does not
        shrink), which would otherwise stand for this write's peak."""
        busy_ticks = 0.2 * os.sysconf("SC_CLK_TCK")
        return [pid for pid, (first, last) in self._cpu.items() if last - first >= busy_ticks]

    def peak_mib(self) -> float:
        return max((self.peak_kib[pid] for pid in self._busy()), default=0) / 1024

    def peak_anon_mib(self) -> float:
        return max((self.peak_anon_kib[pid] for pid in self._busy()), default=0) / 1024
