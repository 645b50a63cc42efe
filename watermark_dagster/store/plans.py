"""Planning: the next SCHEDULED batch, decided by
:func:`~watermark_dagster.core.planning.plan_batch` inside the compare-and-swap on
``batches``, and REPLAY batches of applied ranges (``watermark replay``, backfills).
"""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from deltalake import DeltaTable

from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.planning import UpstreamPosition, plan_from_committed
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import Batch, BatchKind
from watermark_dagster.core.replay import check_replay_range, plan_batch_replay, plan_replay
from watermark_dagster.store import codec
from watermark_dagster.store.history import History
from watermark_dagster.store.tables import BATCHES, where


class Plans(History):
    """New batches in ``batches``, each with its BATCH_PLANNED history row, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def create_batch(
        self,
        positions: Sequence[UpstreamPosition],
        pipeline_inputs: Mapping[str, Sequence[str]],
        *,
        actor: str,
        table_ids: Mapping[str, str | None] | None = None,
        schema_fingerprints: Mapping[str, str | None] | None = None,
        source_states: Mapping[str, str | None] | None = None,
        bootstrap: Sequence[str] = (),
        overwrite: Sequence[str] = (),
        locations: Mapping[str, str | None] | None = None,
        reloads_owed: Sequence[str] = (),
        frozen: Collection[str] = (),
    ) -> tuple[Batch | None, bool]:
        """Plan and record the next SCHEDULED batch in one commit, unless one is open.

        The committed watermarks are read inside the compare-and-swap, so a plan never
        starts anywhere but right after them. A cursor upstream has new data when its
        ``source_states`` entry differs from the state recorded with its committed position.
        ``locations`` (upstream -> where it was observed) are recorded with the plan.
        ``reloads_owed`` that the plan does not reload are recorded with it, so the next
        plans still owe them; ``frozen`` upstreams are planned NOOP (see
        :func:`~watermark_dagster.core.planning.plan_batch`).

        Returns:
            ``(batch, True)`` for a new batch; ``(open_batch, False)`` when a batch is
            already open (possibly planned by a concurrent coordinator); ``(None, False)``
            when there is nothing to do.
        """
        table_ids = table_ids or {}
        schema_fingerprints = schema_fingerprints or {}
        source_states = source_states or {}
        locations = locations or {}

        def decide(dt: DeltaTable) -> tuple[Batch | None, bool]:
            opened = [b for b in self._open_batches(dt) if b.kind is BatchKind.SCHEDULED]
            if opened:
                return opened[0], False
            marks = self.committed()
            plan = plan_from_committed(
                positions,
                marks,
                source_states,
                pipeline_inputs,
                bootstrap=bootstrap,
                overwrite=overwrite,
                frozen=frozen,
            )
            if not plan.has_work:
                return None, False
            batch = codec.new_batch(
                self._next_seq(dt),
                BatchKind.SCHEDULED,
                plan.inputs,
                pipelines=plan.pipelines,
                actor=actor,
                full_load=plan.full_load,
                reloads_owed=tuple(sorted(set(reloads_owed) - set(plan.full_load))),
                table_ids={u: table_ids.get(u) for u in plan.inputs},
                schema_fingerprints={u: schema_fingerprints.get(u) for u in plan.inputs},
                source_states={u: source_states.get(u) for u in plan.inputs},
                locations={u: locations.get(u) for u in plan.inputs},
            )
            latest = {
                p.name: p.latest_version for p in positions if not plan.inputs[p.name].is_cursor
            }
            committed = {u: w.committed_version for u, w in marks.items()}
            return self._insert_batch(dt, batch, committed=committed, latest=latest), True

        batch, created = self._cas(BATCHES, decide)
        if batch is not None:
            if created:
                fault_point("after_plan_commit")
            self.ensure_plan_recorded(batch, actor=actor)
        return batch, created

    def _insert_batch(self, dt: DeltaTable, batch: Batch, **context: Any) -> Batch:
        """Commit the rows of new ``batch`` and return it as read back from them."""
        rows = codec.batch_rows(batch, **context)
        self._insert(dt, BATCHES, rows)
        return codec.batches(rows)[0]

    def ensure_plan_recorded(self, batch: Batch, *, actor: str) -> bool:
        """Write the BATCH_PLANNED history row of ``batch`` unless it is there (a planner
        that died right after the plan commit left it out). Reads ``history``: a sensor
        calls it once per batch. Returns True when this call wrote it."""
        return self.record_once(
            "BATCH_PLANNED",
            actor=actor,
            batch_id=batch.batch_id,
            detail={
                "pipelines": list(batch.pipelines),
                "full_load": list(batch.full_load),
                "ranges": {u: i.describe() for u, i in batch.inputs.items()},
                **({"reloads_owed": list(batch.reloads_owed)} if batch.reloads_owed else {}),
            },
        )

    def create_range_replay(
        self,
        upstream: str,
        rng: VersionRange,
        *,
        mode: ReadMode,
        pipelines: Sequence[str],
        all_upstreams: Sequence[str],
        actor: str,
        reason: str | None = None,
    ) -> Batch:
        """Record a REPLAY batch that re-reads ``rng`` of ``upstream`` through ``pipelines``
        (``watermark replay``; a batch partition's backfill is :meth:`create_backfill_replay`).

        The other upstreams are pinned where the scheduled batch that applied version
        ``rng.end`` pinned them, and the replay writes with that batch's position
        (``order_seq``), so a merge target takes nothing older than what it holds (I5); it
        updates or deletes rows the target holds and never re-inserts a missing key (a row
        deleted by a later batch stays deleted). A replay never moves a committed watermark.

        Raises:
            BatchStateError: the range is not entirely applied yet (beyond the committed
                watermark), or no completed batch applied its end.
        """

        def decide(dt: DeltaTable) -> Batch:
            committed = self.committed_versions()
            check_replay_range(upstream, rng, committed.get(upstream))
            scheduled = codec.batches(self._rows(dt, where(kind=BatchKind.SCHEDULED.value)))
            plan = plan_replay(scheduled, upstream, rng, mode=mode, upstreams=all_upstreams)
            batch = _replay_batch(
                self._next_seq(dt),
                plan.inputs,
                sorted(pipelines),
                actor,
                plan.order_seq,
                plan.origin,
            )
            return self._insert_batch(dt, batch, committed=committed, latest={}, error=reason)

        batch = self._cas(BATCHES, decide)
        self._record_replay(batch, actor, reason, {"upstream": upstream}, range=str(rng))
        return batch

    def create_backfill_replay(
        self,
        batch_id: str,
        *,
        pipeline: str,
        upstreams: Sequence[str],
        modes: Mapping[str, ReadMode],
        actor: str,
        reason: str | None = None,
    ) -> Batch:
        """Record a REPLAY batch for a backfill of the applied batch ``batch_id``'s
        partition: it re-reads every version range ``batch_id`` pinned for ``upstreams``
        through ``pipeline`` (see :func:`~watermark_dagster.core.replay.plan_batch_replay`).

        It writes at that batch's position, pins the other upstreams where it pinned them,
        and, like :meth:`create_range_replay`, never moves a committed watermark.

        Raises:
            BatchStateError: the batch is unknown, a range is not applied yet (beyond the
                committed watermark), or the batch pins no version range to replay.
        """
        replayed = self.get_batch(batch_id)

        def decide(dt: DeltaTable) -> Batch:
            committed = self.committed_versions()
            plan = plan_batch_replay(replayed, upstreams, modes=modes, committed=committed)
            batch = _replay_batch(
                self._next_seq(dt), plan.inputs, [pipeline], actor, plan.order_seq, replayed
            )
            return self._insert_batch(dt, batch, committed=committed, latest={}, error=reason)

        batch = self._cas(BATCHES, decide)
        ranges = {u: i.describe() for u, i in batch.inputs.items()}
        self._record_replay(
            batch, actor, reason, {"pipeline": pipeline}, replays=batch_id, ranges=ranges
        )
        return batch

    def _record_replay(
        self,
        batch: Batch,
        actor: str,
        reason: str | None,
        subject: Mapping[str, str],
        **what: Any,
    ) -> None:
        """The BATCH_PLANNED history row of the REPLAY ``batch``: ``subject`` (the upstream
        or pipeline replayed) and ``what`` it re-reads, with its pipelines, position and
        reason."""
        self.record(
            "BATCH_PLANNED",
            actor=actor,
            batch_id=batch.batch_id,
            **subject,
            detail={
                "kind": BatchKind.REPLAY.value,
                **what,
                "pipelines": list(batch.pipelines),
                "order_seq": batch.order_seq,
                "reason": reason,
            },
        )


def _replay_batch(
    seq: int,
    inputs: Mapping[str, Any],
    pipelines: list[str],
    actor: str,
    order_seq: int,
    origin: Batch,
) -> Batch:
    """A REPLAY batch of ``inputs`` written at ``order_seq``, each upstream carrying the
    table id, schema fingerprint, location and cursor source state ``origin`` (the batch
    that applied the range) pinned for it: a Delta cursor source is read at the version
    the origin was planned at, not at its latest (I3)."""
    return codec.new_batch(
        seq,
        BatchKind.REPLAY,
        inputs,
        pipelines=pipelines,
        actor=actor,
        order_seq=order_seq,
        table_ids={u: origin.table_ids.get(u) for u in inputs},
        schema_fingerprints={u: origin.schema_fingerprints.get(u) for u in inputs},
        locations={u: origin.locations.get(u) for u in inputs},
        source_states={u: origin.source_states.get(u) for u in inputs},
    )


__all__ = ["Plans"]
