"""The retention-horizon check: interval parsing, the needed version, real Delta tables
written with delta-rs (no JVM), and the asset check run through a real Dagster instance.

Ages are measured at an explicit ``now`` against the commit times the log records, so no
test sleeps or depends on how fast the machine is.
"""

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DagsterInstance,
    Definitions,
    materialize,
)
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream, Upstream
from watermark_dagster.core.planning import PlannedInput, UpstreamPosition
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.dagster_defs.checks import RETENTION_CHECK
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.needed_version import needed_version
from watermark_dagster.observe.retention import RetentionState, check_retention, commit_time
from watermark_dagster.observe.retention_properties import (
    DELETED_FILE_RETENTION,
    LOG_RETENTION,
    parse_interval,
)
from watermark_dagster.store import WatermarkStore


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _write_versions(path: Path, count: int, configuration: dict[str, str] | None = None) -> None:
    """Versions 0..count-1 of a small table (the first commit sets the properties)."""
    for i in range(count):
        write_deltalake(
            str(path),
            pa.table({"id": pa.array([i], pa.int64())}),
            mode="append",
            configuration=configuration if i == 0 else None,
        )


def _upstream(tmp_path: Path, name: str, versions: int, **props: str) -> Upstream:
    path = tmp_path / name
    _write_versions(path, versions, dict(props) or None)
    return DeltaUpstream(name=name, path=str(path))


# ------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval 7 days", timedelta(days=7)),
        ("interval 1 week", timedelta(weeks=1)),
        ("interval 1 hours", timedelta(hours=1)),
        ("interval 168 hours", timedelta(hours=168)),
        ("interval 30 seconds", timedelta(seconds=30)),
        ("INTERVAL 2 Weeks", timedelta(weeks=2)),
        ("interval 1 minute", timedelta(minutes=1)),
        ("interval 500 milliseconds", timedelta(milliseconds=500)),
        ("interval 1 day 12 hours", timedelta(hours=36)),
        ("7 days", timedelta(days=7)),
    ],
    ids=lambda v: str(v).replace(" ", "_"),
)
def test_delta_intervals_parse(text: str, expected: timedelta) -> None:
    assert parse_interval(text, upstream="orders", prop=LOG_RETENTION) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("banana", "expected '<integer> <unit>' parts"),
        ("interval", "it is empty"),
        ("interval 7", "expected '<integer> <unit>' parts"),
        ("interval -1 days", "expected '<integer> <unit>' parts"),
        ("interval 7 dayz", "unknown unit 'dayz'"),
        ("interval 3 months", "cannot use months or years"),
    ],
    ids=["word", "empty", "no_unit", "negative", "bad_unit", "months"],
)
def test_unreadable_intervals_name_table_property_and_value(text: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_interval(text, upstream="orders", prop=DELETED_FILE_RETENTION)
    message = str(raised.value)
    assert f"Upstream 'orders': table property {DELETED_FILE_RETENTION} = {text!r}" in message
    assert why in message
    assert "SET TBLPROPERTIES" in message
    assert raised.value.upstream == "orders"


@pytest.mark.parametrize(
    ("committed", "open_input", "expected"),
    [
        (None, None, None),
        (3, None, 4),
        (3, PlannedInput("orders", ReadMode.CDF, VersionRange(4, 7), 7), 4),
        # A NOOP input reads the snapshot at the committed version: the files it needs can
        # only be vacuumed after the next commit removed them.
        (3, PlannedInput("orders", ReadMode.NOOP, None, 3), 4),
    ],
    ids=["nothing_committed", "next_batch", "open_range", "open_noop"],
)
def test_needed_version(
    committed: int | None, open_input: PlannedInput | None, expected: int | None
) -> None:
    needed = needed_version(committed=committed, open_input=open_input, batch_id="b000002")
    assert needed.version == expected


def test_a_first_load_needs_only_what_its_snapshot_needs() -> None:
    # A SNAPSHOT input pins [0, end] but reads only the table as of its end.
    first_load = PlannedInput("orders", ReadMode.SNAPSHOT, VersionRange(0, 5), 5)
    needed = needed_version(committed=None, open_input=first_load, batch_id="b000001")
    assert needed.version == 6
    assert "whose snapshot open batch b000001 reads" in needed.why


# ------------------------------------------------------------- real delta-rs tables


def test_short_retention_fails_as_the_needed_version_nears_and_passes_the_horizon(
    tmp_path: Path,
) -> None:
    orders = _upstream(tmp_path, "orders", 3, **{DELETED_FILE_RETENTION: "interval 2 seconds"})
    committed_at = commit_time(orders, 1)
    assert committed_at is not None
    history = {h["version"]: h["timestamp"] for h in DeltaTable(orders.path).history()}
    assert committed_at == datetime.fromtimestamp(history[1] / 1000, tz=UTC)

    # Horizon 2 s (the log keeps 30 days), default margin a quarter of it: fails from 1.5 s.
    def at(seconds: float):
        return check_retention(orders, committed=0, now=committed_at + timedelta(seconds=seconds))

    fresh = at(1.0)
    assert (fresh.state, fresh.passed) == (RetentionState.WITHIN_HORIZON, True)
    assert fresh.needed.version == 1
    assert fresh.horizon == timedelta(seconds=2)
    assert fresh.log_retention == timedelta(days=30)
    assert fresh.time_left == timedelta(seconds=1)

    near = at(1.6)
    assert (near.state, near.passed) == (RetentionState.NEAR_HORIZON, False)
    for part in (
        "Upstream 'orders': version 1",
        "committed watermark 0",
        "only 400ms left",
        "`watermark run`",
        f"ALTER TABLE delta.`{orders.path}` SET TBLPROPERTIES",
        "`watermark reset -t orders`",
        "`watermark set -t orders --version 2`",
    ):
        assert part in near.message

    gone = at(3.0)
    assert (gone.state, gone.passed) == (RetentionState.PAST_HORIZON, False)
    assert "passed 1s ago" in gone.message

    # A wider margin warns earlier; a fixed one works too.
    assert not check_retention(
        orders, committed=0, now=committed_at + timedelta(seconds=1), margin=0.6
    ).passed
    assert check_retention(
        orders,
        committed=0,
        now=committed_at + timedelta(seconds=1),
        margin=timedelta(milliseconds=500),
    ).passed


def test_default_retention_passes(tmp_path: Path) -> None:
    orders = _upstream(tmp_path, "orders", 3)
    status = check_retention(orders, committed=0)
    assert (status.state, status.passed) == (RetentionState.WITHIN_HORIZON, True)
    assert status.deleted_file_retention == timedelta(weeks=1)
    assert status.log_retention == timedelta(days=30)
    assert status.margin == timedelta(days=7) / 4
    assert status.time_left is not None
    assert status.time_left > timedelta(days=6)


def test_the_log_retention_counts_when_it_is_the_smaller(tmp_path: Path) -> None:
    orders = _upstream(
        tmp_path,
        "orders",
        2,
        **{LOG_RETENTION: "interval 4 hours", DELETED_FILE_RETENTION: "interval 1 week"},
    )
    at = commit_time(orders, 1)
    assert at is not None
    status = check_retention(orders, committed=0, now=at + timedelta(hours=3, minutes=1))
    assert status.horizon == timedelta(hours=4)
    assert status.state is RetentionState.NEAR_HORIZON


def test_malformed_retention_property_is_a_clear_configuration_error(tmp_path: Path) -> None:
    orders = _upstream(tmp_path, "orders", 2, **{LOG_RETENTION: "thirty days"})
    with pytest.raises(
        ConfigurationError, match=r"table property delta\.logRetentionDuration"
    ) as e:
        check_retention(orders, committed=0)
    assert "Upstream 'orders'" in str(e.value)
    assert "'thirty days'" in str(e.value)


def test_needed_version_removed_by_log_cleanup_fails(tmp_path: Path) -> None:
    orders = _upstream(tmp_path, "orders", 4, **{LOG_RETENTION: "interval 1 hours"})
    dt = DeltaTable(orders.path)
    dt.create_checkpoint()
    # Age the early commit files past the log retention, then let delta-rs clean them up.
    log = Path(orders.path) / "_delta_log"
    two_hours_ago = time.time() - 2 * 3600
    for version in range(3):
        os.utime(log / f"{version:020d}.json", (two_hours_ago, two_hours_ago))
    dt.cleanup_metadata()
    assert not (log / f"{1:020d}.json").exists()

    status = check_retention(orders, committed=0)
    assert (status.state, status.passed) == (RetentionState.LOG_CLEANED, False)
    assert status.needed.version == 1
    assert "no longer in the Delta log" in status.message
    assert f"_delta_log/{1:020d}.json is gone" in status.message
    assert "`watermark reset -t orders`" in status.message
    # Caught up past the cleaned versions: nothing old is needed.
    assert check_retention(orders, committed=3).passed


def test_nothing_committed_passes_with_a_note(tmp_path: Path) -> None:
    orders = _upstream(tmp_path, "orders", 2, **{DELETED_FILE_RETENTION: "interval 0 seconds"})
    status = check_retention(orders, committed=None)
    assert (status.state, status.passed) == (RetentionState.NOTHING_NEEDED, True)
    assert "nothing is committed yet" in status.message
    caught_up = check_retention(orders, committed=1)
    assert (caught_up.state, caught_up.passed) == (RetentionState.NOTHING_NEEDED, True)
    assert "caught up" in caught_up.message


# ------------------------------------------------------------------ through Dagster


def test_retention_checks_run_in_dagster_on_the_upstream_source_assets(
    tmp_path: Path, dagster_home: Path
) -> None:
    """Three upstreams, one open batch pinning [1, 2] of each: a table whose retention is
    already over fails, one with the default retention passes, a table that vanished fails
    without hiding the others."""
    ups = {
        "orders": _upstream(
            tmp_path, "orders", 3, **{DELETED_FILE_RETENTION: "interval 0 seconds"}
        ),
        "customers": _upstream(tmp_path, "customers", 3),
        "payments": _upstream(tmp_path, "payments", 3),
    }
    pipelines = {"enriched": tuple(ups)}
    registry = Registry(
        upstreams=list(ups.values()),
        pipelines=[
            Pipeline(
                name="enriched",
                upstreams=tuple(ups),
                target=str(tmp_path / "t"),
                keys=("id",),
                transform=_never_called,
            )
        ],
    )
    store = WatermarkStore(tmp_path / "control")
    first, _ = store.create_batch(
        [UpstreamPosition(n, 0, None) for n in ups], pipelines, actor="test"
    )
    assert first is not None
    for name in ups:
        store.advance(first, name, actor="test")
    store.set_batch_status(first.batch_id, BatchStatus.COMPLETED, actor="test")
    second, _ = store.create_batch(
        [UpstreamPosition(n, 2, 0) for n in ups], pipelines, actor="test"
    )
    assert second is not None
    assert str(second.inputs["orders"].range) == "[1, 2]"
    shutil.rmtree(ups["payments"].path)

    defs = build_definitions(registry, control_root=str(tmp_path / "control"))
    Definitions.validate_loadable(defs)
    keys = [AssetKey([n]) for n in ups]
    everything = [*(defs.assets or []), *(defs.asset_checks or [])]
    with DagsterInstance.get() as instance:
        result = materialize(
            [d for d in everything if isinstance(d, AssetsDefinition)],
            # Only this check (each upstream also has a watermark_continuity check).
            selection=AssetSelection.checks(*[AssetCheckKey(k, RETENTION_CHECK) for k in keys]),
            resources=defs.resources,
            instance=instance,
        )
    assert result.success  # a failed check is a result, not a failed run
    evaluations = {e.asset_key.path[0]: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == set(ups)
    assert all(e.check_name == RETENTION_CHECK for e in evaluations.values())

    orders = evaluations["orders"]
    assert (orders.passed, orders.severity) == (False, AssetCheckSeverity.ERROR)
    assert orders.description is not None
    assert "the start of" in orders.description
    assert "pinned by open batch b000002" in orders.description
    meta = {k: v.value for k, v in orders.metadata.items()}
    assert meta["needed_version"] == 1
    assert meta["batch_id"] == "b000002"
    assert meta["state"] == RetentionState.PAST_HORIZON.value
    assert meta["deleted_file_retention"] == "0s"
    assert meta["log_retention"] == "30d"
    for key in ("commit_time", "age", "time_left", "expires_at"):
        assert key in meta

    assert evaluations["customers"].passed
    payments = evaluations["payments"]
    assert not payments.passed
    assert payments.description is not None
    assert "not a readable Delta table" in payments.description
