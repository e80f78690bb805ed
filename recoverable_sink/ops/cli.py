"""recoverable-kafka-wal: inspect a WAL, finish failed writes from it, purge it.

A batch job that failed (say the brokers were down longer than ``delivery.timeout.ms``) leaves, on each
executor, the records Kafka never acknowledged. The first way to finish it is to re-run the job with
``.option("wal.writeId", <the write id>)``: it recomputes its input and sends only what was never
acknowledged. ``replay`` is the other way, without Spark: for each partition whose whole input reached
this host's WAL it sends the records no attempt got acknowledged, and refuses (exit 1, naming them)
partitions that were only partly logged here::

    recoverable-kafka-wal list   --path /data/rk-wal
    recoverable-kafka-wal replay --path /data/rk-wal --write-id 1ac57b... --bootstrap-servers broker:9092
    recoverable-kafka-wal replay --path /data/rk-wal --write-id 1ac57b... --kafka-config client.properties
    recoverable-kafka-wal purge  --path /data/rk-wal --write-id 1ac57b...
    recoverable-kafka-wal transactions --prefix recoverable-kafka- --bootstrap-servers broker:9092 [--abort]

Producer settings (the write's ``kafka.*`` options, without the prefix) come from, lowest precedence first: a
``--kafka-config`` properties file (``name=value`` lines, ``#`` comments, as a Kafka client's), environment
variables ``RECOVERABLE_KAFKA_PRODUCER_<NAME>`` (``sasl.password`` is ``..._SASL_PASSWORD``), and ``--kafka
NAME=VALUE``. Give secrets by the first two: a command line is visible to every user in ``ps``.

Run it on each executor host that holds a WAL (the abort log line names the path and write id). Never needs
Spark: this module imports no pyspark.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TextIO, TypedDict

from recoverable_sink._logging import configure, get_logger
from recoverable_sink.errors import RecoverableSinkError
from recoverable_sink.identity import DIGEST_SIZE, split
from recoverable_sink.ops.replay import ReplayCounts, replay_write
from recoverable_sink.options import is_sensitive
from recoverable_sink.wal import AttemptInfo, Wal, open_wal

log = get_logger("cli")

ENV_PREFIX = "RECOVERABLE_KAFKA_PRODUCER_"


class AttemptRow(TypedDict):
    """An attempt as ``list`` shows it."""

    write_id: str
    partition: int
    attempt: int
    host: str
    state: str
    proof_trimmed: bool
    created: float
    age_s: float
    records: int
    acknowledged: int
    unacknowledged: int
    bytes: int
    topic: str | None
    kind: str | None
    key: str
    seq: int | None
    run: str | None


def describe(wal: Wal, write_id: str | None) -> list[AttemptRow]:
    """One row per attempt: what it logged, what Kafka acknowledged, what payload it still holds."""
    rows: list[AttemptRow] = []
    now = time.time()
    for a in wal.attempts(f"{write_id}/" if write_id else ""):
        records = acked = size = 0
        for seg in wal.segments(a.key):
            records += seg.count
            acked += sum(seg.acked)
            size += seg.batch.nbytes if seg.batch is not None else 0
        rows.append({"write_id": a.write_id, "partition": a.partition, "attempt": a.attempt, "host": a.host,
                     "state": a.state.value, "proof_trimmed": a.trimmed, "created": a.created,
                     "age_s": round(now - a.created, 1), "records": records, "acknowledged": acked,
                     "unacknowledged": records - acked, "bytes": size, "topic": a.topic, "kind": a.kind,
                     "key": a.key, "seq": a.seq, "run": a.run})
    return rows


def _public(row: AttemptRow) -> dict[str, object]:
    """An attempt's row as ``list`` shows it (without the WAL key, begin order and run the totals are counted by)."""
    return {k: v for k, v in row.items() if k not in ("key", "seq", "run")}


class _WriteRecords:
    """A write's records counted once across its attempts on this host, by their digests. A retry logs again what an
    earlier attempt of its partition logged and never got acknowledged, and a re-run's partition (the same wal.writeId,
    any partitioning) what an earlier run logged in any partition: such a record matches a copy still pending from
    an attempt begun before it and is not a new one. Two partitions of one run never hold the same record (equal
    rows in both are two records). What is still pending after the last attempt is what no attempt got
    acknowledged. Only pending digests are held, by run and partition."""

    def __init__(self) -> None:
        self.records = 0
        self.pending: dict[str | None, dict[int, Counter[bytes]]] = {}  # run -> partition -> digest -> copies
        self.in_run: dict[str | None, Counter[bytes]] = {}  # run -> digest -> copies over its partitions

    def add(self, wal: Wal, attempt_key: str, run: str | None, partition: int) -> None:
        """Count the next attempt, in the order attempts began on the host."""
        later: Counter[bytes] = Counter()  # this attempt's own unacknowledged copies, pending from now on
        for seg in wal.segments(attempt_key, payload=False):
            digests = split(seg.digests) if len(seg.digests) == DIGEST_SIZE * seg.count else None
            if digests is None:  # proof trimmed: a done attempt, every record acknowledged, none to match by
                self.records += seg.count
                continue
            for digest, acked in zip(digests, seg.acked, strict=True):
                if not self._take(digest, run, partition):
                    self.records += 1
                if not acked:
                    later[digest] += 1
        if later:
            self.pending.setdefault(run, {}).setdefault(partition, Counter()).update(later)
            self.in_run.setdefault(run, Counter()).update(later)

    def _take(self, digest: bytes, run: str | None, partition: int) -> bool:
        """Take a pending copy this attempt may have logged again: its own partition's in its run, else any
        partition's of another run."""
        own = self.pending.get(run, {}).get(partition)
        if own is not None and own[digest] > 0:
            own[digest] -= 1
            self.in_run[run][digest] -= 1
            return True
        for other, copies in self.in_run.items():
            if other != run and copies[digest] > 0:
                copies[digest] -= 1
                held = next(c for c in self.pending[other].values() if c[digest] > 0)
                held[digest] -= 1
                return True
        return False

    @property
    def unacknowledged(self) -> int:
        return sum(max(0, n) for copies in self.in_run.values() for n in copies.values())


def totals_by_write(rows: Sequence[AttemptRow], wal: Wal | None = None) -> list[dict[str, object]]:
    """Per write: attempts, partitions, records, records no attempt got acknowledged, payload held, age of the newest
    attempt. With the ``wal`` the rows were read from, each record counts once however many attempts logged it
    (:class:`_WriteRecords`); without it, the attempts' counts are added up."""
    by_write: dict[str, list[AttemptRow]] = {}
    for r in rows:
        by_write.setdefault(r["write_id"], []).append(r)
    counted: dict[str, _WriteRecords] = {}
    if wal is not None:
        # In the order the attempts began (the WAL's sequence; by creation time for attempts logged before it).
        for r in sorted(rows, key=lambda r: (r["seq"] is not None, r["seq"] or 0, r["created"])):
            counted.setdefault(r["write_id"], _WriteRecords()).add(wal, r["key"], r["run"], r["partition"])
    out: list[dict[str, object]] = []
    for write_id, rs in by_write.items():
        found = counted.get(write_id)
        out.append({"write_id": write_id, "kind": rs[0]["kind"], "topic": rs[0]["topic"], "attempts": len(rs),
                    "partitions": len({r["partition"] for r in rs}), "states": sorted({r["state"] for r in rs}),
                    "records": found.records if found else sum(r["records"] for r in rs),
                    "unacknowledged": found.unacknowledged if found else sum(r["unacknowledged"] for r in rs),
                    "bytes": sum(r["bytes"] for r in rs), "age_s": min(r["age_s"] for r in rs)})
    return out


def _table(rows: Sequence[Mapping[str, object]], columns: list[str]) -> str:
    cells = [[str(r[c]) if r[c] is not None else "-" for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


class Progress:
    """Replay progress on stderr: a bar redrawn in place on a terminal, a plain line every 10 s otherwise."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        share = done / total if total else 1.0
        if self.tty:
            bar = "#" * int(share * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {done:,}/{total:,} records")
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()
        elif now - self._last >= 10.0 or done >= total:
            self._last = now
            log.info("%s: %d of %d records (%.0f%%)", self.label, done, total, 100 * share)


def _client_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", default=None,
                   help="the brokers (or bootstrap.servers in --kafka-config or the environment)")
    p.add_argument("--kafka-config", default=None, metavar="FILE",
                   help="client settings as a properties file (name=value lines); the place for secrets")
    p.add_argument("--kafka", action="append", default=[], metavar="NAME=VALUE",
                   help="a client setting, as the kafka.NAME option of the write (repeatable; visible in ps, so "
                        "not for secrets)")


_EXIT_CODES = "Exit status: 0 done, 1 an error or a refusal (named on stderr), 2 a usage error."


def _parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("recoverable-sink")
    except PackageNotFoundError:  # run from sources (--py-files)
        own = "unknown (not installed)"
    parser = argparse.ArgumentParser(prog="recoverable-kafka-wal", description=__doc__.split("\n\n")[0],
                                     epilog=_EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"%(prog)s {own}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {
        "list": ("what a WAL holds: per write, or per attempt of one write",
                 "Per write: attempts, partitions, states, records (each once, however many attempts logged it), "
                 "records no attempt got acknowledged, bytes, age. With --write-id, one row per attempt of that "
                 "write: what each logged and what was acknowledged to it."),
        "stats": ("what the WAL holds in all: payload bytes, attempts, orphaned entries",
                  "Recounts the WAL by scanning it: payload bytes (against its usage counter), attempts, and "
                  "orphaned entries (never replayed; safe to purge)."),
        "replay": ("send what Kafka never acknowledged of a failed at_least_once write, without Spark",
                   "For each partition of the write whose whole input reached this WAL, send the records no "
                   "attempt got acknowledged, then mark the partition done (a later re-run with the same "
                   "wal.writeId sends nothing twice). Refused, each named with the reason: a partition only partly "
                   "logged here (its input was cut short, or the WAL filled up: re-run the write with its "
                   "wal.writeId), a write id this WAL does not hold, partitions missing here with --partitions, and "
                   "exactly_once writes (a replay outside the partition's transaction could repeat records: re-run "
                   "the write). " + _EXIT_CODES),
        "purge": ("delete a write's attempts from the WAL",
                  "Deletes every attempt of the write, with the records it still holds. " + _EXIT_CODES),
    }
    for name, (summary, description) in commands.items():
        p = sub.add_parser(name, help=summary, description=description)
        p.add_argument("--path", required=True, help="the WAL directory (the write's wal.path); it must exist")
        if name != "stats":
            p.add_argument("--write-id", required=name in ("replay", "purge"),
                           help="the write id the abort log line names")
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        if name == "replay":
            _client_arguments(p)
            p.add_argument("--partitions", type=int, default=None,
                           help="the write's partition count: also refuse when a partition is missing here")
            p.add_argument("--allow-other-cluster", action="store_true",
                           help="send to brokers of another Kafka cluster than the write's (refused otherwise); "
                                "nothing is then recorded as delivered, so a re-run against the write's own "
                                "cluster still sends every record")
    p = sub.add_parser("transactions", help="list (and --abort) the open exactly_once transactions of a prefix",
                       description="List the transactional ids of a transactional.id.prefix that the brokers "
                                   "keep, with their state and age, read from __transaction_state (the principal "
                                   "needs DESCRIBE and READ on it). With --abort, abort the Ongoing ones older "
                                   "than --older-than: each is fenced and rolled back as a retry of its partition "
                                   "would. A running job's transactions are aborted too (its tasks then fail and "
                                   "are retried): stop the job first. Transactions already committing or aborting "
                                   "finish on their own and are left alone. " + _EXIT_CODES)
    p.add_argument("--prefix", required=True, help="the write's transactional.id.prefix (default of the sink: "
                                                   "recoverable-kafka-)")
    p.add_argument("--abort", action="store_true", help="abort the Ongoing transactions listed")
    p.add_argument("--older-than", type=float, default=60.0, metavar="SECONDS",
                   help="with --abort: only transactions begun at least this long ago (default 60)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    _client_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure("%(levelname)s %(name)s: %(message)s", logging.INFO)
    if args.command == "transactions":
        try:
            return _transactions(args)
        except RecoverableSinkError as exc:
            log.error("%s", exc)
            return 1
    try:
        if not os.path.isfile(os.path.join(args.path, "data.mdb")):
            raise RecoverableSinkError(f"--path {args.path} holds no WAL (no data.mdb there): give the write's "
                                       "wal.path on the host that ran it")
        wal = open_wal(args.path)
        if args.command == "list":
            rows = describe(wal, args.write_id)
            if args.write_id and not rows:
                raise RecoverableSinkError(f"write {args.write_id} is not in {wal.path}")
            writes = totals_by_write(rows, wal)
            if args.json:
                json.dump({"writes": writes, "attempts": [_public(r) for r in rows]}, sys.stdout, indent=1)
            elif args.write_id:
                sys.stdout.write(_table(rows, ["partition", "attempt", "state", "records", "unacknowledged",
                                               "bytes", "age_s", "host"]))
            else:
                sys.stdout.write(_table(writes, ["write_id", "kind", "topic", "attempts", "partitions", "states",
                                                 "records", "unacknowledged", "bytes", "age_s"]) if writes
                                 else f"no writes in {wal.path}")
            sys.stdout.write("\n")
            return 0
        if args.command == "stats":
            stats = asdict(wal.stats())
            sys.stdout.write(json.dumps(stats) if args.json else "\n".join(f"{k}: {v}" for k, v in stats.items()))
            sys.stdout.write("\n")
            return 0
        # A purge lists the keys alone: it must reach attempts whose records this version cannot read.
        keys = wal.attempt_keys(f"{args.write_id}/")
        if not keys:
            raise RecoverableSinkError(f"write {args.write_id} is not in {wal.path} (`recoverable-kafka-wal list "
                                       f"--path {args.path}` shows the writes it holds)")
        if args.command == "purge":
            freed = wal.purge(keys)
            if args.json:
                sys.stdout.write(json.dumps({"write_id": args.write_id, "attempts": len(keys),
                                             "payload_bytes": freed}) + "\n")
            log.info("purged %d attempt(s) of write %s (%d payload bytes)", len(keys), args.write_id, freed)
            return 0
        return _replay(wal, args, wal.attempts(f"{args.write_id}/"))
    except RecoverableSinkError as exc:
        log.error("%s", exc)
        return 1


def _read_properties(path: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise RecoverableSinkError(f"--kafka-config {path} cannot be read: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise RecoverableSinkError(f"--kafka-config {path} line {number}: expected name=value")
        settings[name.strip()] = value.strip()
    return settings


def producer_settings(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The replay's ``kafka.*`` options: the properties file, then the environment, then the command line."""
    settings = _read_properties(args.kafka_config) if args.kafka_config else {}
    for var, value in environ.items():
        if var.startswith(ENV_PREFIX) and len(var) > len(ENV_PREFIX):
            settings[var[len(ENV_PREFIX):].lower().replace("_", ".")] = value
    for item in args.kafka:
        name, _, value = item.partition("=")
        if is_sensitive(name):
            log.warning("--kafka %s=... puts a secret in this command line, which every user can see in ps; "
                        "give it in --kafka-config or %s%s instead", name, ENV_PREFIX,
                        name.upper().replace(".", "_"))
        settings[name] = value
    if args.bootstrap_servers:
        settings["bootstrap.servers"] = args.bootstrap_servers
    if not settings.get("bootstrap.servers"):
        raise RecoverableSinkError(f"{args.command} needs the brokers: --bootstrap-servers, bootstrap.servers in "
                                   f"--kafka-config, or {ENV_PREFIX}BOOTSTRAP_SERVERS")
    return {f"kafka.{name.removeprefix('kafka.')}": value for name, value in settings.items()}


def _transactions(args: argparse.Namespace) -> int:
    from recoverable_sink.ops.lingering import abort, transactions

    client = {k.removeprefix("kafka."): v for k, v in producer_settings(args, dict(os.environ)).items()}
    found = transactions(client, args.prefix)
    now_ms = int(time.time() * 1000)
    aborted: list[str] = []
    failed: list[str] = []
    if args.abort:
        for status in found:
            age = status.age_s(now_ms)
            if status.state != "Ongoing" or (age is not None and age < args.older_than):
                continue
            try:
                abort(client, status.transactional_id)
            except RecoverableSinkError as exc:
                failed.append(str(exc))
                log.error("%s", exc)
                continue
            aborted.append(status.transactional_id)
            log.info("aborted the open transaction of %s", status.transactional_id)
    rows = [{**asdict(s), "age_s": s.age_s(now_ms), "aborted": s.transactional_id in aborted} for s in found]
    if args.json:
        sys.stdout.write(json.dumps({"transactions": rows, "aborted": aborted, "failed": failed}) + "\n")
    else:
        sys.stdout.write((_table(rows, ["transactional_id", "state", "age_s", "producer_id", "timeout_ms", "aborted"])
                          if rows else f"no transactional ids with prefix {args.prefix}") + "\n")
    return 1 if failed else 0


def _replay(wal: Wal, args: argparse.Namespace, attempts: list[AttemptInfo]) -> int:
    kafka = producer_settings(args, dict(os.environ))

    def replayed(partition: int, counts: ReplayCounts) -> None:
        log.info("write %s partition %d: %s", args.write_id, partition, asdict(counts))

    result = replay_write(wal, args.write_id, attempts, kafka, expected_partitions=args.partitions,
                          progress=lambda partition: Progress(f"write {args.write_id} partition {partition}"),
                          on_partition=replayed, allow_other_cluster=args.allow_other_cluster)
    total, refused = result.total, result.refused
    report = {"write_id": args.write_id, "partitions": result.partitions, **asdict(total), "refused": refused}
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        sys.stdout.write(f"write {args.write_id}: {result.partitions} partition(s) here, {total.sent} records sent, "
                         f"{total.already_delivered} already delivered, {len(refused)} partition(s) refused\n")
    if not result.partitions:
        log.warning("no attempt of write %s in %s: nothing to replay on this host", args.write_id, wal.path)
    for problem in refused:
        log.error("%s", problem)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
