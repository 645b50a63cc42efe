"""The model-based exactly-once check: random histories, failures, crashes and replays.

One case, from a seed: three upstreams (``src`` with change data feed, ``log`` append-only
without it, ``clicks`` a Delta table read through a timestamp cursor) get random commits
(inserts, updates, deletes, appends, OPTIMIZE, RESTORE and whole-table rewrites that
delete and re-insert keys in one commit, late cursor rows below the committed position,
deletes of cursor rows already read); between
them the system runs cycles — plan, run the pipelines, finalize — interrupted at random by
a failing pipeline, a crash at a random fault point (the in-process stand-in for SIGKILL:
nothing records it), replays of applied ranges and backfills of old batches. When the
history is over the system drains, and then every target must equal a reference computed
independently from the upstreams' final snapshots, and every committed watermark must be
the latest version (all consumers applied everything). I2 (monotonic watermarks) is
checked after every step.

The driver mirrors the sensors through the same production functions
(``look_before_planning``, ``plan_next``, ``execute_pipeline``, ``finalize_batch``); the
sensors themselves are exercised by the flow and live tests.
"""

import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable as RsTable
from deltalake import QueryBuilder, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.core.faults import SimulatedCrash, simulate_crash_at
from watermark_dagster.core.outcomes import succeeded_pipelines
from watermark_dagster.core.planning import delta_source_version
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.errors import BatchStateError
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations import manual
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.decide import decide_pipeline
from watermark_dagster.operations.run_pipeline import execute_pipeline, run_pipeline
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write.layout import REWRITE_BELOW_BYTES, REWRITE_BELOW_CONF

CRASH_POINTS = (
    "after_plan_commit",
    "after_target_commit",
    "after_checkpoint",
    "after_watermark_commit",
    "before_batch_complete",
)


@dataclass
class Failures:
    """Pipelines whose transform raises while named here (a user's bug, then fixed)."""

    failing: set[str] = field(default_factory=set)

    def wrap(self, name: str, transform: Callable[[BatchContext], DataFrame]):
        def run(batch: BatchContext) -> DataFrame:
            if name in self.failing:
                raise RuntimeError(f"injected failure in {name}")
            return transform(batch)

        return run


def _copy(batch: BatchContext) -> DataFrame:
    return batch["src"].net_changes(["id"]).drop("_commit_timestamp")


def _events(batch: BatchContext) -> DataFrame:
    return batch["log"].changes.select("id", "value")


def _clicks_log(batch: BatchContext) -> DataFrame:
    return batch["clicks"].changes.select("id", "value")


def _clicks_copy(batch: BatchContext) -> DataFrame:
    return batch["clicks"].net_changes(["id"]).select("id", "value")


# Cursor rows: normal rows arrive in cursor order; late rows carry a cursor below every
# window already pinned, so by design they are never read.
CLICKS_BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _micros(ts: datetime) -> int:
    return int(ts.timestamp() * 1_000_000)


@dataclass
class Stats:
    """What a case did, summed over a soak run."""

    cases: int = 0
    commits: int = 0
    cycles: int = 0
    crashes: int = 0
    failures: int = 0
    replays: int = 0
    backfills: int = 0
    batches: int = 0
    forces: int = 0
    late_writes: int = 0

    def add(self, other: "Stats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Case:
    """One random history, run against real Spark and Delta tables under ``root``."""

    def __init__(self, spark: SparkSession, root: Path, seed: int, steps: int = 5) -> None:
        self.spark, self.root, self.seed, self.steps = spark, root, seed, steps
        self.rng = random.Random(seed)
        self.merges = random.Random(f"{seed}-merges")  # apart, so histories stay as seeded
        self.failures = Failures()
        self.stats = Stats(cases=1)
        self.next_id = 0
        self.src, self.log = str(root / "src"), str(root / "log")
        self.clicks = str(root / "clicks")
        clicks = CursorUpstream(
            name="clicks",
            path=self.clicks,
            format="delta",
            cursor="ts",
            tie_break=("id",),
        )
        self.registry = Registry(
            upstreams=[
                DeltaUpstream(name="src", path=self.src),
                DeltaUpstream(name="log", path=self.log),
                clicks,
            ],
            pipelines=[
                Pipeline(
                    name="copy",
                    upstreams=("src",),
                    target=str(root / "copy"),
                    keys=("id",),
                    transform=self.failures.wrap("copy", _copy),
                ),
                Pipeline(
                    name="events",
                    upstreams=("log",),
                    target=str(root / "events"),
                    keys=(),
                    transform=self.failures.wrap("events", _events),
                    write="append",
                ),
                Pipeline(
                    name="clicks_log",
                    upstreams=("clicks",),
                    target=str(root / "clicks_log"),
                    keys=(),
                    transform=self.failures.wrap("clicks_log", _clicks_log),
                    write="append",
                ),
                Pipeline(
                    name="clicks_copy",
                    upstreams=("clicks",),
                    target=str(root / "clicks_copy"),
                    keys=("id",),
                    transform=self.failures.wrap("clicks_copy", _clicks_copy),
                ),
            ],
        )
        self.consumers = {
            "src": ["copy"],
            "log": ["events"],
            "clicks": ["clicks_log", "clicks_copy"],
        }
        # Cursor rows the pipelines must end up with: id -> (position, value).
        self.clicks_expected: dict[int, tuple[tuple[int, int], int]] = {}
        self.clicks_deleted: dict[int, int] = {}  # id -> the clicks version without it
        self.store = WatermarkStore(root / "control")
        self.observer = Observer()
        self.high_water: dict[str, int] = {}

    # ---------------------------------------------------------------- upstream commits

    # Upstream commits are made with delta-rs, as a producer outside Spark would: they take
    # milliseconds instead of a Spark job each, and Spark reads their change data feed.

    def _rows(self, ids: list[int]) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "value": pa.array([self.rng.randint(0, 999) for _ in ids], pa.int64()),
            }
        )

    def _new_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def seed_tables(self) -> None:
        write_deltalake(
            self.src,
            self._rows(self._new_ids(6)),
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        write_deltalake(self.log, self._rows(self._new_ids(4)))
        self._add_clicks(self._new_ids(3), late=False)
        self.stats.commits += 3

    def _pinned_high(self) -> tuple:
        """The greatest cursor position any window of ``clicks`` reads up to: its pinned
        end, or for a window not pinned yet, the newest row of the source at the version
        its batch was planned at (the batch reads ``clicks`` as of that version)."""
        ends: list[tuple] = []
        for b in self.store.batches():
            window = b.inputs["clicks"].window if "clicks" in b.inputs else None
            if window is None:
                continue
            if window.end is not None:
                ends.append(tuple(window.end))
                continue
            version = delta_source_version(b.source_states.get("clicks"))
            assert version is not None, b.source_states
            planned = RsTable(self.clicks, version=version)
            table = planned.to_pyarrow_table(columns=["id", "ts"])
            ends.extend(
                (_micros(ts), i)
                for i, ts in zip(table["id"].to_pylist(), table["ts"].to_pylist(), strict=True)
            )
        return max(ends, default=())

    def _add_clicks(self, ids: list[int], *, late: bool) -> None:
        """Append cursor rows; a late row's cursor is below every window pinned so far."""
        if late:
            stamps = [CLICKS_BASE - timedelta(days=1, seconds=i) for i in ids]
        else:
            stamps = [CLICKS_BASE + timedelta(seconds=i) for i in ids]
        rows = self._rows(ids).append_column("ts", pa.array(stamps, pa.timestamp("us", tz="UTC")))
        high = self._pinned_high()
        for i, ts, value in zip(ids, stamps, rows.column("value").to_pylist(), strict=True):
            position = (_micros(ts), i)
            if position > high:  # a window pinned later reads it; else it is never read
                self.clicks_expected[i] = (position, value)
        write_deltalake(self.clicks, rows, mode="append")

    def commit(self) -> None:
        """One random upstream commit."""
        kind = self.rng.choice(
            ["insert", "update", "delete", "append", "append", "optimize", "rewrite", "restore"]
            + ["click", "click", "late_click", "delete_click"]
        )
        if kind.endswith("click"):
            self._commit_clicks(kind)
            self.stats.commits += 1
            return
        src = RsTable(self.src)
        existing = sorted(src.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
        if kind == "insert" or (kind in ("update", "delete") and not existing):
            write_deltalake(
                self.src, self._rows(self._new_ids(self.rng.randint(1, 3))), mode="append"
            )
        elif kind == "update":
            picked = self.rng.sample(existing, min(len(existing), self.rng.randint(1, 3)))
            src.update(
                predicate=f"id IN ({', '.join(str(int(i)) for i in picked)})",
                updates={"value": "value + 1000"},
            )
        elif kind == "delete":
            src.delete(f"id = {int(self.rng.choice(existing))}")
        elif kind == "append":
            write_deltalake(
                self.log, self._rows(self._new_ids(self.rng.randint(1, 3))), mode="append"
            )
        elif kind == "rewrite":
            # One commit that deletes every key and inserts it again (some values changed):
            # a delete and an insert of the same key share one commit version.
            table = src.to_pyarrow_table(columns=["id", "value"])
            values = [v + 1 if self.rng.random() < 0.3 else v for v in table["value"].to_pylist()]
            table = table.set_column(1, "value", pa.array(values, pa.int64()))
            write_deltalake(self.src, table, mode="overwrite")
        elif kind == "restore":
            # RESTORE to an older version: files removed and re-added in one commit.
            if src.version() < 1:
                return self.commit()
            src.restore(self.rng.randint(max(0, src.version() - 3), src.version() - 1))
        else:
            RsTable(self.rng.choice([self.src, self.log, self.clicks])).optimize.compact()
        self.stats.commits += 1

    def _commit_clicks(self, kind: str) -> None:
        if kind == "click":
            self._add_clicks(self._new_ids(self.rng.randint(1, 3)), late=False)
        elif kind == "late_click":
            self._add_clicks(self._new_ids(1), late=True)
        else:
            # Delete a row some window already read (the targets keep it, by design).
            high = self._pinned_high()
            table = RsTable(self.clicks).to_pyarrow_table(columns=["id", "ts"])
            read = [
                i
                for i, ts in zip(table["id"].to_pylist(), table["ts"].to_pylist(), strict=True)
                if (_micros(ts), i) <= high
            ]
            if not read:
                self._add_clicks(self._new_ids(1), late=False)
                return
            gone = int(self.rng.choice(read))
            RsTable(self.clicks).delete(f"id = {gone}")
            self.clicks_deleted[gone] = RsTable(self.clicks).version()

    # ---------------------------------------------------------------- the system

    def cycle(self) -> bool:
        """Plan (or resume), run the unfinished pipelines, finalize. False when idle."""
        self.stats.cycles += 1
        batch = self.store.open_batch()
        if batch is None:
            look = look_before_planning(self.registry, self.observer, self.store, actor="model")
            batch, created = plan_next(self.store, look, actor="model")
            if batch is None:
                return False
            self.stats.batches += int(created)
        draw_merge_mode(self.spark, self.merges)
        done = self._succeeded(batch.batch_id)
        for pipeline in batch.pipelines:
            if pipeline in done:
                continue
            try:
                execute_pipeline(
                    spark=self.spark,
                    store=self.store,
                    registry=self.registry,
                    pipeline_name=pipeline,
                    batch_id=batch.batch_id,
                    run_id="model",
                )
            except RuntimeError as e:
                if "injected failure" not in str(e):
                    raise
        finalize_batch(
            self.store, self.store.get_batch(batch.batch_id), registry=self.registry, actor="model"
        )
        return True

    def _succeeded(self, batch_id: str) -> frozenset[str]:
        return succeeded_pipelines(batch_id, self.store.checkpoints(batch_id=batch_id))

    def crash_cycle(self) -> None:
        point = self.rng.choice(CRASH_POINTS)
        self.stats.crashes += 1
        try:
            with simulate_crash_at(point):
                self.cycle()
        except SimulatedCrash:
            pass

    def failing_cycle(self) -> None:
        name = self.rng.choice(["copy", "events", "clicks_log", "clicks_copy"])
        self.failures.failing.add(name)
        self.stats.failures += 1
        try:
            self.cycle()
        finally:
            self.failures.failing.discard(name)

    def replay(self) -> None:
        """Re-read an applied range of a random upstream through its consumers."""
        upstream = self.rng.choice(["src", "log"])
        committed = self.store.committed_versions().get(upstream)
        if committed is None or committed < 1:
            return
        start = self.rng.randint(1, committed)
        end = self.rng.randint(start, committed)
        has_cdf = upstream == "src"
        try:
            batch = self.store.create_range_replay(
                upstream,
                VersionRange(start, end),
                mode=ReadMode.CDF if has_cdf else ReadMode.APPEND_ONLY,
                pipelines=self.consumers[upstream],
                all_upstreams=[upstream],
                actor="model",
                reason=f"seed {self.seed}",
            )
        except BatchStateError:
            return  # e.g. the range end was applied by a snapshot load only
        self.stats.replays += 1
        for pipeline in batch.pipelines:
            try:
                execute_pipeline(
                    spark=self.spark,
                    store=self.store,
                    registry=self.registry,
                    pipeline_name=pipeline,
                    batch_id=batch.batch_id,
                    run_id="model-replay",
                )
            except Exception as e:
                if "DataChanged" not in type(e).__name__ and "injected" not in str(e):
                    raise
        self.store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="model")

    def backfill(self) -> None:
        """Re-materialize an old completed batch of a random pipeline (an asset backfill)."""
        done = [
            b
            for b in self.store.batches()
            if b.status is BatchStatus.COMPLETED and b.kind.value == "SCHEDULED"
        ]
        if not done:
            return
        batch = self.rng.choice(done)
        pipelines = [p for p in batch.pipelines]
        if not pipelines:
            return
        self.stats.backfills += 1
        execute_pipeline(
            spark=self.spark,
            store=self.store,
            registry=self.registry,
            pipeline_name=self.rng.choice(pipelines),
            batch_id=batch.batch_id,
            run_id="model-backfill",
        )

    def force(self, upstream: str | None = None, point: str | None = None) -> None:
        """`watermark reset --force` of a random versioned upstream, often while a batch is
        open (a crash left it so), sometimes killed at one of its fault points and run
        again; then a run of the abandoned batch that passed its own check before the
        abandon tries to write each target (the fence must stop it). A reset reloads the
        upstream's consumers in full, so the references hold."""
        drawn = self.rng.choice(["src", "log"]), self.rng.choice([None, *FORCE_CRASH_POINTS])
        if upstream is None:
            upstream, point = drawn
        fencing = manual.Fencing(stop_runs=lambda _batch: (), spark=lambda: self.spark)
        open_batch = self.store.open_batch()

        def attempt() -> None:
            preview = manual.preview_change(
                self.store, self.registry, upstream, None, force=True, actor="model"
            )
            if preview.changed:
                manual.apply_change(
                    self.store, self.registry, preview, reason="model", force=True, fencing=fencing
                )

        # Runs in flight: each decided to run before the forced change.
        decisions = []
        if open_batch is not None:
            done = self._succeeded(open_batch.batch_id)
            for pipeline in open_batch.pipelines:
                if pipeline in done:
                    continue
                decision = decide_pipeline(
                    store=self.store,
                    registry=self.registry,
                    pipeline_name=pipeline,
                    batch_id=open_batch.batch_id,
                )
                if decision.skip is None:
                    decisions.append(decision)
        # A target that does not exist has no log to fence: a late first write may land.
        unfenceable = {
            d.pipeline.name for d in decisions if existing_target(d.pipeline.target, None) is None
        }
        self.stats.forces += 1
        if point is not None:
            self.stats.crashes += 1
            try:
                with simulate_crash_at(point):
                    attempt()
            except SimulatedCrash:
                pass
        attempt()  # the operator runs it (again)
        if open_batch is None:
            return
        if self.store.get_batch(open_batch.batch_id).status is not BatchStatus.ABANDONED:
            return
        for decision in decisions:
            self.stats.late_writes += 1
            target = existing_target(decision.pipeline.target, None)
            before = None if target is None else target.version()
            try:
                with _past_its_check():
                    run_pipeline(
                        spark=self.spark,
                        store=self.store,
                        registry=self.registry,
                        decision=decision,
                        run_id="model-late",
                    )
            except BatchStateError as e:
                if "fenced against it" not in str(e):
                    raise
                continue
            except RuntimeError as e:
                if "injected failure" not in str(e):
                    raise
                continue
            # Only a write into a target that did not exist may land (nothing to fence);
            # the next plan finds it in the target's log and reloads the target in full.
            # A run whose write the forced change recovered commits nothing again.
            target = existing_target(decision.pipeline.target, None)
            landed = target is not None and (before is None or target.version() != before)
            assert not landed or decision.pipeline.name in unfenceable, (
                f"seed {self.seed}: a late write of {decision.pipeline.name} for abandoned "
                f"batch {open_batch.batch_id} landed"
            )

    def _expected_clicks(self, pipeline: str) -> list[tuple[int, int]]:
        """What a clicks target holds: its last full load (the first load, or a reload
        owed after a forced change) read the source as of its batch's pinned version up to
        the window's end, deleted and late rows included; every row read by a later window
        follows. Rows deleted after a window read them stay (a cursor does not see
        deletes), but not one deleted before the load that only an abandoned batch's
        window had read."""
        # A batch a forced change abandoned after its window advanced counts: it applied.
        loads = [
            b
            for b in self.store.batches()
            if pipeline in b.full_load
            and (b.status is not BatchStatus.ABANDONED or "clicks" in b.advanced)
            and pipeline in self._succeeded(b.batch_id)
        ]
        last = max(loads, key=lambda b: b.seq)
        window = last.inputs["clicks"].window
        assert window is not None, last
        assert window.end is not None, last
        end = tuple(window.end)
        version = delta_source_version(last.source_states.get("clicks"))
        assert version is not None, last.source_states
        table = RsTable(self.clicks, version=version).to_pyarrow_table(
            columns=["id", "ts", "value"]
        )
        loaded = {
            i: v
            for i, ts, v in zip(*(table[c].to_pylist() for c in ("id", "ts", "value")), strict=True)
            if (_micros(ts), i) <= end
        }
        # A row only an abandoned batch's window read, deleted before the load: gone.
        later = {
            i: v
            for i, (position, v) in self.clicks_expected.items()
            if position > end and self.clicks_deleted.get(i, version + 1) > version
        }
        return sorted({**loaded, **later}.items())

    def check_monotonic(self) -> None:
        """I2: no committed watermark ever moved backwards."""
        for upstream, version in self.store.committed_versions().items():
            if version is None:
                continue
            previous = self.high_water.get(upstream, -1)
            assert version >= previous, f"seed {self.seed}: {upstream} went {previous} -> {version}"
            self.high_water[upstream] = version

    # ---------------------------------------------------------------- the run

    def run(self) -> Stats:
        self.seed_tables()
        for _ in range(self.steps):
            for _ in range(self.rng.randint(1, 3)):
                self.commit()
            action = self.rng.choices(
                ["cycle", "crash", "fail", "replay", "backfill", "force"],
                weights=[4, 3, 2, 1, 1, 1],
            )[0]
            {
                "cycle": self.cycle,
                "crash": self.crash_cycle,
                "fail": self.failing_cycle,
                "replay": self.replay,
                "backfill": self.backfill,
                "force": self.force,
            }[action]()
            self.check_monotonic()
        for _ in range(20):
            if not self.cycle() and self.store.open_batch() is None:
                break
            self.check_monotonic()
        else:
            raise AssertionError(f"seed {self.seed}: the system did not drain in 20 cycles")
        self.verify()
        return self.stats

    def verify(self) -> None:
        """Targets equal references computed from the upstreams' final snapshots; every
        watermark is at the latest version. Tables are read with delta-rs, not Spark, so
        the check shares no reader with the system under test."""
        latest = {u: latest_local_version(p) for u, p in (("src", self.src), ("log", self.log))}
        committed = self.store.committed_versions()
        versioned = {u: committed.get(u) for u in latest}
        assert versioned == latest, f"seed {self.seed}: committed {versioned} != latest {latest}"
        # Idle: nothing new is planned once drained (an empty cursor window records the
        # source state it was read at, so late rows, deletes and OPTIMIZE go quiet).
        assert not self.cycle(), f"seed {self.seed}: a batch was planned after draining"
        for target in ("clicks_log", "clicks_copy"):
            got = sorted(_pairs(str(self.root / target)))
            expected = self._expected_clicks(target)
            assert got == expected, f"seed {self.seed}: {target} lost or doubled rows"
        position = self.store.committed()["clicks"].committed_cursor
        newest = max((p for p, _ in self.clicks_expected.values()), default=())
        assert position is not None, (
            f"seed {self.seed}: clicks committed at {position}, rows up to {newest} were due"
        )
        assert tuple(position) >= newest, (
            f"seed {self.seed}: clicks committed at {position}, rows up to {newest} were due"
        )
        source = dict(_pairs(self.src))
        copy = _pairs(str(self.root / "copy"))
        copy_ids = [key for key, _ in copy]
        assert len(copy_ids) == len(set(copy_ids)), f"seed {self.seed}: duplicate keys in copy"
        assert dict(copy) == source, f"seed {self.seed}: copy differs"
        assert sorted(_pairs(str(self.root / "events"))) == sorted(_pairs(self.log)), (
            f"seed {self.seed}: events differ from log (lost or doubled rows)"
        )


FORCE_CRASH_POINTS = ("after_fence", "after_abandon", "after_manual_watermark_commit")


@contextmanager
def _past_its_check() -> Iterator[None]:
    """A run that re-read its batch just before the abandon: its check before the write
    passes (fault injection of the race the fence closes)."""
    from watermark_dagster.operations import run_pipeline

    checked = run_pipeline._refuse_abandoned  # pyright: ignore[reportPrivateUsage]
    run_pipeline._refuse_abandoned = lambda *_args, **_kwargs: None  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        run_pipeline._refuse_abandoned = checked  # pyright: ignore[reportPrivateUsage]


def _pairs(path: str) -> list[tuple[int, int]]:
    """The (id, value) rows of a Delta table's current snapshot. Read through delta-rs's
    query engine, which applies deletion vectors (merge targets have them; its plain
    pyarrow reader refuses such tables)."""
    rows = QueryBuilder().register("t", RsTable(path)).execute("SELECT * FROM t").read_all()
    table = pa.table(rows).select(["id", "value"])
    return list(zip(table.column("id").to_pylist(), table.column("value").to_pylist(), strict=True))


def draw_merge_mode(spark: SparkSession, rng: random.Random) -> str:
    """Draw how the next batch's MERGEs write these small targets: by rewriting the files
    they touch (what production does under ``REWRITE_BELOW_BYTES``) or with deletion vectors
    (what it does above); the targets must not tell them apart. :func:`run_case` and the
    declared cases unset the setting when they end."""
    value = rng.choice(["0", str(REWRITE_BELOW_BYTES)])
    spark.conf.set(REWRITE_BELOW_CONF, value)
    return "deletion vectors" if value == "0" else "rewrite"


def run_case(spark: SparkSession, root: Path, seed: int, steps: int = 5) -> Stats:
    """Run one case in a fresh folder under ``root``; print the seed when it fails."""
    folder = root / f"case-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        return Case(spark, folder, seed, steps).run()
    except BaseException:
        print(
            f"model case failed: seed={seed} steps={steps} (replay: run_case(spark, root, {seed}))"
        )
        raise
    finally:
        spark.conf.unset(REWRITE_BELOW_CONF)
        shutil.rmtree(folder, ignore_errors=True)


def summary(stats: Stats) -> dict[str, Any]:
    """Counts for the README and the closing note."""
    return {name: getattr(stats, name) for name in stats.__dataclass_fields__}
