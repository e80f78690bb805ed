"""``recoverable-kafka-wal``: inspect a WAL, re-send what failed writes left in it, purge it.

A batch job that failed (say the brokers were down longer than ``delivery.timeout.ms``) leaves, on each
executor, the records Kafka never acknowledged. Re-running the job would send everything again under a new
write id; ``replay`` instead sends exactly the unacknowledged records of that write, in their original order,
then purges them::

    recoverable-kafka-wal list   --path /data/rk-wal
    recoverable-kafka-wal replay --path /data/rk-wal --write-id 1ac57b... --bootstrap-servers broker:9092
    recoverable-kafka-wal purge  --path /data/rk-wal --write-id 1ac57b...

Run it on each executor host that holds a WAL (the abort log line names the path and write id).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence

from recoverable_sink.delivery import DeliveryTracker, delivery_timeout_s, get_producer, produce, wait_for_acks
from recoverable_sink.errors import DeliveryError, RecoverableSinkError
from recoverable_sink.options import parse_options
from recoverable_sink.records import to_records
from recoverable_sink.task import ReplayPlan
from recoverable_sink.wal import AttemptInfo, Wal, open_wal

log = logging.getLogger("recoverable_sink.cli")


def describe(wal: Wal, write_id: str | None) -> list[dict[str, object]]:
    rows = []
    for a in wal.attempts(f"{write_id}/" if write_id else ""):
        records = acked = size = 0
        for seg in wal.segments(a.key):
            records += seg.batch.num_rows
            acked += sum(seg.acked)
            size += seg.batch.nbytes
        rows.append({"write_id": a.write_id, "partition": a.partition, "attempt": a.attempt, "host": a.host,
                     "created": a.created, "records": records, "acknowledged": acked,
                     "unacknowledged": records - acked, "bytes": size, "topic": a.extra.get("topic"),
                     "kind": a.extra.get("kind")})
    return rows


def replay_partition(wal: Wal, attempts: list[AttemptInfo], kafka: dict[str, str]) -> dict[str, int]:
    """Send every position no attempt got acknowledged, from the newest attempt that holds it."""
    options = parse_options(kafka)
    producer = get_producer(options)
    counts = {"records": 0, "sent": 0, "already_delivered": 0}
    covered = 0
    for index in range(len(attempts) - 1, -1, -1):
        attempt = attempts[index]
        plan = ReplayPlan(wal, attempts[:index])
        tracker = DeliveryTracker()
        topic = attempt.extra.get("topic")
        end = covered
        for seg in wal.segments(attempt.key):
            if seg.end <= covered:
                continue
            offset = max(0, covered - seg.first)
            batch = seg.batch.slice(offset)
            first = seg.first + offset
            skip_prior, _, _ = plan.mask(first, batch)
            skip = [bool(seg.acked[offset + i]) or bool(skip_prior and skip_prior[i]) for i in range(batch.num_rows)]
            # Positions before `offset` belong to a newer attempt and were handled with it.
            sent = produce(producer, to_records(seg.batch), topic if isinstance(topic, str) else None, seg.first,
                           [True] * offset + skip, tracker, options.scrub)
            counts["records"] += batch.num_rows
            counts["sent"] += sent
            counts["already_delivered"] += batch.num_rows - sent
            end = max(end, seg.end)
            wait_for_acks(producer, tracker, delivery_timeout_s(options) + 30)
            wal.save_acks(attempt.key, tracker.take_dirty())
        if tracker.failed or tracker.outstanding:
            raise DeliveryError(f"replay of partition {attempt.partition} of write {attempt.write_id}: "
                                f"{options.scrub(tracker.first_error() or 'records unacknowledged')}; "
                                "the WAL keeps them, run replay again")
        covered = end
    wal.purge([a.key for a in attempts])
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="recoverable-kafka-wal", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "replay", "purge"):
        p = sub.add_parser(name)
        p.add_argument("--path", required=True, help="the wal.path of the write")
        p.add_argument("--write-id", required=name != "list", help="the write id the abort log line names")
        if name == "replay":
            p.add_argument("--bootstrap-servers", required=True)
            p.add_argument("--kafka", action="append", default=[], metavar="NAME=VALUE",
                           help="a producer setting, as the kafka.NAME option of the write (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        wal = open_wal(args.path)
        if args.command == "list":
            json.dump(describe(wal, args.write_id), sys.stdout, indent=1)
            sys.stdout.write("\n")
            return 0
        attempts = wal.attempts(f"{args.write_id}/")
        if not attempts:
            log.info("no attempt of write %s in %s", args.write_id, wal.path)
            return 0
        if args.command == "purge":
            freed = wal.purge([a.key for a in attempts])
            log.info("purged %d attempt(s) of write %s (%d bytes)", len(attempts), args.write_id, freed)
            return 0
        kafka = {"kafka.bootstrap.servers": args.bootstrap_servers}
        for item in args.kafka:
            name, _, value = item.partition("=")
            kafka[f"kafka.{name}"] = value
        by_partition: dict[int, list[AttemptInfo]] = defaultdict(list)
        for a in attempts:
            by_partition[a.partition].append(a)
        total = {"records": 0, "sent": 0, "already_delivered": 0}
        for partition in sorted(by_partition):
            counts = replay_partition(wal, by_partition[partition], kafka)
            log.info("write %s partition %d: %s", args.write_id, partition, counts)
            for k in total:
                total[k] += counts[k]
        json.dump({"write_id": args.write_id, "partitions": len(by_partition), **total}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    except RecoverableSinkError as exc:
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
