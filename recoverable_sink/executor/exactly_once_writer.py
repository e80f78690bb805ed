"""The exactly-once partition writer (executor): the at-least-once protocol inside one Kafka transaction per
partition attempt, committed with a marker that names the attempts whose transactions hold the partition.

What changes against :class:`~recoverable_sink.executor.writer.AtLeastOnceWriter`:
- the producer is the partition's own transactional one; opening it fences every earlier attempt on any host,
  and its marker says whether one of them already committed the partition (then the input is only counted);
- under transactions an earlier attempt's records count only if its transaction committed, so the WAL's
  digests are used only for the attempts the marker names;
- the end commits the transaction with the marker; an abort aborts it, whatever Kafka had acknowledged.
"""

from __future__ import annotations

import time

import pyarrow as pa

from recoverable_sink._logging import get_logger
from recoverable_sink.contract import SinkCommitMessage
from recoverable_sink.errors import DeliveryError, FatalProducerError, RecordError, RerunRefusedError
from recoverable_sink.executor.attempt_log import attempt_name
from recoverable_sink.executor.normalise import normalise
from recoverable_sink.executor.rerun import EarlierRuns, NoEarlierRuns, run_of
from recoverable_sink.executor.writer import AtLeastOnceWriter, Phase, final_wait_s
from recoverable_sink.identity import record_digests
from recoverable_sink.producer.marker import Marker
from recoverable_sink.producer.protocol import SinkProducer
from recoverable_sink.producer.transactions import PartitionTransaction, read_markers, transactional_id
from recoverable_sink.wal import DONE, AttemptInfo

log = get_logger("writer")


class ExactlyOnceWriter(AtLeastOnceWriter):
    """One partition attempt in one transaction (see the module's docstring)."""

    FINGERPRINT_WITHOUT_WAL = True  # the marker carries the input's fingerprint even with the WAL off

    txn: PartitionTransaction
    committed: list[AttemptInfo]  # the earlier attempts whose committed transactions hold records
    found: Marker | None  # this write's marker for the partition, as open() found it

    def _open_producer(self) -> SinkProducer:
        self.committed = []
        run = self.ident.extra.get("run")
        self.txn = PartitionTransaction(self.options, self.ident.write_id, self.ident.partition, self.where,
                                        self.ident.transaction_scope, run if isinstance(run, str) else None)
        self.found = self.txn.open(self.plan.topic_option)
        assert self.txn.producer is not None
        return self.txn.producer

    def _recover(self) -> Phase:
        """Without a marker, nothing of this run counts; a re-run takes from what earlier runs committed (in any
        partition) on this host. With a marker of this run, resume from the committed attempts if this WAL holds
        the digests of every one it names: send whatever of the recomputed partition they lack (nothing, unless an
        earlier input was cut short); otherwise skip the partition and check its fingerprint at the end. With an
        earlier run's marker, judge the partition by content (see :meth:`_rerun`)."""
        marker = self.found
        if marker is None:
            committed = self._earlier_committed(None)
            if committed:
                self.earlier = self._earlier_runs(committed)
                log.info("%s: a re-run of write %s: %d records that earlier runs committed on this host, in any "
                         "partition, are not sent again", self.where, self.ident.write_id, self.earlier.records)
            return Phase.WRITING
        if marker.run is not None and marker.run != self.txn.run:
            return self._rerun(marker)
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
        self.committed = committed
        earlier = self._earlier_committed(marker)
        if earlier:
            # This run re-ran a write: what its committed attempt took from earlier runs' partitions, a retry takes
            # again under the same claims; the rest of what the marker names is this run's own.
            ours = {a.key for a in earlier}
            delivered = self.log.delivered([a for a in committed if a.key not in ours], all_acknowledged=True)
            self.earlier = self._earlier_runs(earlier)
        self.delivered = delivered
        self.txn.begin()
        return Phase.WRITING

    def _rerun(self, marker: Marker) -> Phase:
        """A re-run whose partition an earlier run committed. The rows may have been split otherwise this time, so
        the partition is judged by content: where this host's WAL holds the digests of everything the earlier runs
        committed that it knows of, send what none of them committed (under claims shared with the run's other
        partitions); otherwise skip it, and at the end the input's fingerprint must be the committed one's, or the
        task fails without having sent anything."""
        committed = self._earlier_committed(marker)
        by_name = {attempt_name(a.key): a for a in committed}
        own = [by_name[n] for n in marker.attempts or () if n in by_name]
        proven = self.log.delivered(own, all_acknowledged=True)
        if marker.attempts is None or len(own) != len(marker.attempts) or \
                sum(proven.acked.values()) != marker.records:
            log.info("%s: run %s committed this partition and this host's WAL lacks its digests: the partition is "
                     "skipped if its input is the one committed (same fingerprint)", self.where, marker.run)
            return Phase.SKIPPING
        self.committed = own
        self.earlier = self._earlier_runs(committed)
        log.info("%s: a re-run of write %s whose partition run %s committed: %d records that earlier runs committed "
                 "on this host, in any partition, are not sent again", self.where, self.ident.write_id, marker.run,
                 self.earlier.records)
        self.txn.begin()
        return Phase.WRITING

    def _earlier_committed(self, own: Marker | None) -> list[AttemptInfo]:
        """The attempts of earlier runs of this write, in any partition, left in this WAL, whose transactions
        committed: the ones their partition's marker names (one marker read per partition found here), and those
        marked done, which an attempt is only once its commit returned. The latter keep a re-run exact after
        the brokers expired the markers (``offsets.retention.minutes``: a query down for a long weekend)."""
        attempts = self.log.earlier_attempts(self.ident)
        if not attempts:
            return []
        by_name = {attempt_name(a.key): a for a in attempts}
        committed: dict[str, AttemptInfo] = {attempt_name(a.key): a for a in attempts
                                             if a.state == DONE and a.exactly_once}
        topic = self.plan.topic_option
        for partition in sorted({a.partition for a in attempts} | ({self.ident.partition} if own else set())):
            if partition == self.ident.partition:
                markers = [own] if own is not None else []
            else:
                group = transactional_id(self.options, self.ident.transaction_scope, partition)
                markers = read_markers(self.options, group, [topic] if topic else None, self.txn.fail)
            for m in markers:
                if m.write_id == self.ident.write_id and (topic is None or (m.topic or topic) == topic):
                    committed.update({n: by_name[n] for n in m.attempts or () if n in by_name})
        return list(committed.values())

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
        ledger = self.ledger
        holders = list(self.committed)
        # Between here and commit's return a kill leaves the outcome to the next attempt's init_transactions (it
        # completes a commit under way, or aborts) and its marker read.
        if self.marker_topic is not None and ledger.produced:
            names = [attempt_name(a.key) for a in holders]
            if self.log.key is not None:
                names.append(attempt_name(self.log.key))
            self.txn.commit(self.marker_topic, self.txn.committed_records + ledger.acked,
                            final_wait_s(self.options), names, self.log.path, self.fingerprint)
            self.txn.close()
            sent = True
        else:
            self.txn.abort()  # nothing was sent: no transaction, no new marker
            sent = False
        if holders or self.earlier:
            message.committed_before = True
            log.info("%s: earlier transactions committed %d records of this partition's input; this one sent the "
                     "%d they lacked%s", self.where, message.skipped, ledger.acked,
                     f" ({message.diverged} committed earlier are no longer in the input)" if message.diverged else "")
        if self.log.key is None:
            return
        kept = {a.key for a in holders}
        # Only this run's attempts that did not commit go: an earlier run's stay as proof for the other partitions
        # of this run (and of a later one), whatever their marker says.
        dropped = [p.key for p in self._this_runs(self.log.priors) if p.key not in kept]
        if sent:
            self.log.finish([], dropped=dropped)
        else:
            self.log.purge([self.log.key, *dropped])

    def write(self, raw: pa.RecordBatch) -> None:
        if self.phase is Phase.SKIPPING and raw.num_rows:
            # Only counted, and fingerprinted: the end checks it is the input the marker's transactions committed.
            self.fingerprint.add(record_digests(normalise(raw, self.plan), self.plan.topic_option, self.cluster_id))
        super().write(raw)

    def _commit_skipped(self) -> SinkCommitMessage:
        """An earlier transaction holds the partition: nothing was sent. Its input must be the one committed (the
        marker's fingerprint; its count, for a marker without one), or part of the partition would be lost or
        repeated."""
        self.txn.close()
        marker = self.txn.marker
        assert marker is not None
        if marker.fingerprint is not None and marker.fingerprint != self.fingerprint:
            self._refuse_changed(marker)
        if marker.fingerprint is None and marker.records != self.position:
            # Seen in the fault campaign: a task reading a shuffle whose upstream fetch failed saw its input end
            # early, committed that part, and only then failed in the JVM. Skipping the partition would lose the
            # rest, and without per-record proof this attempt cannot tell which records those are.
            self._refuse_changed(marker)
        if marker.run is None or marker.run == self.txn.run:
            # A retry in the run that committed: whatever its run's earlier attempts logged is in Kafka. An earlier
            # run's logs stay, as proof for the partitions of this re-run that take from them.
            self.log.purge([p.key for p in self._this_runs(self.log.priors)])
        self.message.received = self.position
        self.message.committed_before = True
        self.message.offsets_complete = False  # an earlier attempt's transaction wrote them, this one knows not where
        self.message.seconds = time.monotonic() - self.started
        return self.message

    def _this_runs(self, attempts: list[AttemptInfo]) -> list[AttemptInfo]:
        """The attempts of this run (all of them for a task without a run: a writer driven outside Spark)."""
        if self.txn.run is None:
            return attempts
        return [a for a in attempts if run_of(a) == self.txn.run]

    def _refuse_changed(self, marker: Marker) -> None:
        proof = (f"; the digests that tell which records those are stay in WAL {marker.wal} on host "
                 f"{marker.host}, and a re-run whose tasks run there sends exactly the rest") if marker.wal else ""
        here = f"this host's WAL {self.log.path} lacks their digests" if self.log.path else "the WAL is disabled"
        if marker.run is not None and marker.run != self.txn.run:
            cause = ("this re-run split the write's rows into other partitions than the run that committed it "
                     "(another spark.sql.shuffle.partitions, cluster size, AQE or repartition()), or its source "
                     "changed")
        else:
            cause = "an earlier input was cut short (an upstream failure, e.g. a shuffle fetch) or the input changed"
        raise RerunRefusedError(
            f"{self.where}: earlier transactions committed {marker.records} records of this partition "
            f"(fingerprint {marker.fingerprint.encode() if marker.fingerprint else 'not recorded'}), but the "
            f"partition now holds {self.position} (fingerprint {self.fingerprint.encode()}): {cause}, and {here}"
            f"{proof}. Nothing of this partition was sent: skipping it could lose records and re-sending it could "
            "repeat them. Re-run the write with the same wal.writeId and the partitioning of the run that "
            "committed, or where that WAL is; or under a new wal.writeId (Kafka then holds the committed records "
            "twice)")

    def _earlier_runs(self, committed: list[AttemptInfo]) -> EarlierRuns | NoEarlierRuns:
        """What earlier runs committed, in any partition, from their digests on this host. One whose digests went
        (wal.proofMaxBytes) leaves nothing to tell which records it committed, and a re-run may have split the rows
        otherwise: refuse before anything is sent."""
        trimmed = [a for a in committed if a.trimmed]
        if trimmed:
            first = trimmed[0]
            done = time.strftime("%Y-%m-%d %H:%M", time.gmtime(first.done_at or first.created))
            raise RerunRefusedError(
                f"{self.where}: an earlier run of write {self.ident.write_id} committed partition {first.partition} "
                f"(attempt {attempt_name(first.key)}, done {done} UTC; {len(trimmed)} such attempt(s)), but this "
                f"host's WAL {self.log.path} no longer holds its digests (they went to keep wal.proofMaxBytes), so "
                "which records it committed cannot be told: nothing of this partition was sent, since skipping them "
                "could lose records and re-sending them could repeat them. If that run's records are in Kafka and "
                "the rest was written, there is nothing to re-run; otherwise re-run under a new wal.writeId (records "
                "it committed are then written twice), and raise wal.proofMaxBytes to keep a longer history")
        return self.log.earlier_runs(self.ident, committed, all_acknowledged=True)

    def _waits_on_abort(self) -> bool:
        return False  # the transaction is aborted whatever was acknowledged

    def _release_after_abort(self) -> None:
        self.txn.abort()  # the records stay in the WAL; a re-run under the same id sends them
