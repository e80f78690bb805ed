"""The exactly-once partition writer (executor): the at-least-once protocol inside one Kafka transaction per
partition attempt, committed with a marker that names the attempts whose transactions hold the partition.

What changes against :class:`~recoverable_sink.writer.AtLeastOnceWriter`:
- the producer is the partition's own transactional one; opening it fences every earlier attempt on any host,
  and its marker says whether one of them already committed the partition (then the input is only counted);
- under transactions an earlier attempt's records count only if its transaction committed, so the WAL's
  digests are used only for the attempts the marker names;
- the end commits the transaction with the marker; an abort aborts it, whatever Kafka had acknowledged.
"""

from __future__ import annotations

import time

from recoverable_sink._logging import get_logger
from recoverable_sink.attempt_log import attempt_name
from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError
from recoverable_sink.producer import SinkProducer
from recoverable_sink.transactions import PartitionTransaction
from recoverable_sink.wal import AttemptInfo
from recoverable_sink.writer import AtLeastOnceWriter, Phase, final_wait_s

log = get_logger("task")


class ExactlyOnceWriter(AtLeastOnceWriter):
    """One partition attempt in one transaction (see the module's docstring)."""

    txn: PartitionTransaction
    committed: list[AttemptInfo]  # the earlier attempts whose committed transactions hold records

    def _open_producer(self) -> SinkProducer:
        self.committed = []
        self.txn = PartitionTransaction(self.options, self.ident.write_id, self.ident.partition, self.where,
                                        self.ident.transaction_scope)
        self._marker_found = self.txn.open(self.plan.topic_option)
        assert self.txn.producer is not None
        return self.txn.producer

    def _recover(self) -> Phase:
        """Without a marker, nothing earlier counts. With one, resume from the committed attempts if this WAL holds
        the digests of every one the marker names: send whatever of the recomputed partition they lack (nothing,
        unless an earlier input was cut short). Otherwise skip the partition and check its count at the end."""
        if not self._marker_found:
            return Phase.WRITING
        names = self.txn.committed_attempts
        by_name = {attempt_name(p.key): p for p in self.log.priors}
        if not names or any(n not in by_name for n in names):
            return Phase.SKIPPING
        committed = [by_name[n] for n in names]
        delivered = self.log.delivered(committed, all_acknowledged=True)
        if sum(delivered.acked.values()) != self.txn.committed_records:
            # Digests missing here (an attempt purged or swept meanwhile) would make records go out twice.
            log.warning("%s: this WAL's digests of the committed attempts do not add up to the marker's %d records; "
                        "not resuming from them", self.where, self.txn.committed_records)
            return Phase.SKIPPING
        self.committed, self.delivered = committed, delivered
        self.txn.begin()
        return Phase.WRITING

    def _begun(self) -> None:
        """Nothing more: the transaction fences every earlier attempt, and the marker says what they committed."""

    def _release_after_failed_start(self) -> None:
        self.txn.abort()  # no transaction of this attempt stays open behind a failed start
        self.log.drop()

    def _before_send(self) -> None:
        self.txn.sending()

    def _located(self, exc: DeliveryError | RecordError) -> DeliveryError | RecordError:
        hint = ""
        if isinstance(exc, FatalProducerError):
            timed_out = self.txn.timed_out()
            hint = (f"; {timed_out.strip()}" if timed_out else
                    "; under exactly_once this most often means another attempt of this partition (a retry or "
                    "a speculative copy) fenced this one: its transaction is aborted and the other attempt's "
                    "data is the one that counts")
        return type(exc)(f"{self.where}: {self.options.scrub(str(exc))}{hint}")

    def _keep_proof(self, message: SinkCommitMessage) -> None:
        """Commit what this attempt sent with the marker, which then names every attempt whose transaction holds
        records of the partition. Their WAL digests stay as proof (released like at_least_once's); attempts
        whose transactions did not commit are dropped."""
        tracker = self.tracker
        holders = list(self.committed)
        # Between here and commit's return a kill leaves the outcome to the next attempt's init_transactions (it
        # completes a commit under way, or aborts) and its marker read.
        if self.marker_topic is not None and tracker.produced:
            names = [attempt_name(a.key) for a in holders]
            if self.log.key is not None:
                names.append(attempt_name(self.log.key))
            self.txn.commit(self.marker_topic, self.txn.committed_records + tracker.acked,
                            final_wait_s(self.options), names, self.log.path)
            self.txn.close()
            sent = True
        else:
            self.txn.abort()  # nothing was sent: no transaction, no new marker
            sent = False
        if holders:
            message.committed_before = True
            log.info("%s: earlier attempts committed %d records of this partition; this one sent the %d they "
                     "lacked%s", self.where, self.txn.committed_records, tracker.acked,
                     f" ({message.diverged} committed earlier are no longer in the input)" if message.diverged else "")
        if self.log.key is None:
            return
        kept = {a.key for a in holders}
        dropped = [p.key for p in self.log.priors if p.key not in kept]
        if sent:
            self.log.finish([], dropped=dropped)
        else:
            self.log.purge([self.log.key, *dropped])

    def _commit_skipped(self) -> SinkCommitMessage:
        """An earlier attempt's transaction holds the partition: nothing was sent. Its count must match the input,
        or part of the partition would be lost."""
        self.txn.close()
        marker = self.txn.marker or {}
        committed = marker.get("records")
        if isinstance(committed, int) and committed != self.position:
            # Seen in the fault campaign: a task reading a shuffle whose upstream fetch failed saw its input end
            # early, committed that part, and only then failed in the JVM. Skipping the partition would lose the
            # rest, and without per-record proof this attempt cannot tell which records those are.
            proof = (f"; the digests that tell which records those are stay in WAL {marker.get('wal')} on host "
                     f"{marker.get('host')}, and a retry there sends exactly the rest") if marker.get("wal") else ""
            here = f"this host's WAL {self.log.path} lacks their digests" if self.log.path else "the WAL is disabled"
            raise DeliveryError(
                f"{self.where}: earlier attempts committed {committed} records of this partition in their "
                f"transactions, but the partition now has {self.position}: an earlier input was cut short "
                f"(an upstream failure, e.g. a shuffle fetch) or the input changed, and {here}{proof}. Not "
                "skipping the partition, which could lose records, nor re-sending it, which could repeat them: re-run "
                "the write with the same wal.writeId where that WAL is, or under a new wal.writeId (Kafka then holds "
                "the committed records twice)")
        self.log.purge([p.key for p in self.log.priors])  # whatever they logged is in Kafka
        self.message.received = self.position
        self.message.committed_before = True
        self.message.seconds = time.monotonic() - self.started
        return self.message

    def _waits_on_abort(self) -> bool:
        return False  # the transaction is aborted whatever was acknowledged

    def _release_after_abort(self) -> None:
        self.txn.abort()  # the records stay in the WAL; a re-run under the same id sends them
