"""Registry validation (clear errors when definitions load) and JVM-free observation."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from watermark_dagster.errors import ConfigurationError, UpstreamUnavailableError
from watermark_dagster.observe.delta_log import Observer, latest_local_version
from watermark_dagster.registry import Pipeline, Registry, Upstream, pipeline


def _t(batch):  # noqa: ANN001, ANN202
    return None


@pytest.mark.parametrize(
    "bad",
    ["orders; DROP TABLE x", "my table", "o'brien", "", "1orders", "a" * 129],
    ids=["semicolon", "space", "quote", "empty", "leading-digit", "too-long"],
)
def test_upstream_names_are_plain_identifiers(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="Invalid upstream name"):
        Upstream(bad, path="/tmp/x")


def test_bad_window_cap_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_versions_per_batch must be a positive"):
        Upstream("orders", path="/tmp/x", max_versions_per_batch=0)


def test_pipeline_must_name_known_upstreams() -> None:
    with pytest.raises(ConfigurationError, match=r"reads unknown upstream\(s\) \['ordrs'\]"):
        Registry(
            upstreams=[Upstream("orders", path="/tmp/o")],
            pipelines=[Pipeline("p", ("ordrs",), "/tmp/t", ("id",), _t)],
        )


def test_duplicate_names_and_targets_are_refused() -> None:
    ups = [Upstream("orders", path="/tmp/o")]
    with pytest.raises(ConfigurationError, match="declared twice"):
        Registry(upstreams=ups * 2, pipelines=[])
    with pytest.raises(ConfigurationError, match="write the same target"):
        Registry(
            upstreams=ups,
            pipelines=[
                Pipeline("p1", ("orders",), "/tmp/t", ("id",), _t),
                Pipeline("p2", ("orders",), "/tmp/t", ("id",), _t),
            ],
        )
    with pytest.raises(ConfigurationError, match="used twice"):
        Registry(upstreams=ups, pipelines=[Pipeline("orders", ("orders",), "/tmp/t", ("id",), _t)])


def test_keys_are_required_and_validated() -> None:
    with pytest.raises(ConfigurationError, match="no key columns"):
        Pipeline("p", ("orders",), "/tmp/t", (), _t)
    with pytest.raises(ConfigurationError, match="Invalid key column"):
        Pipeline("p", ("orders",), "/tmp/t", ("id`; --",), _t)
    with pytest.raises(ConfigurationError, match="reserved prefix"):
        Pipeline("p", ("orders",), "/tmp/t", ("_wm_seq",), _t)


def test_decorator_takes_name_and_docstring() -> None:
    @pipeline(upstreams=["orders"], target="/tmp/t", keys=["id"])
    def clean_orders(batch):  # noqa: ANN001, ANN202
        """Orders without test rows."""

    assert clean_orders.name == "clean_orders"
    assert clean_orders.description == "Orders without test rows."


def test_observation_reads_version_cdf_and_identity(tmp_path: Path) -> None:
    path = tmp_path / "orders"
    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(str(path), data, mode="append")
    observer = Observer()
    obs = observer.observe(Upstream("orders", path=str(path)))
    assert (obs.latest_version, obs.cdf_enabled) == (1, True)
    assert latest_local_version(str(path)) == 1
    # Cached per version: a second look with no new commit returns the same record.
    assert observer.observe(Upstream("orders", path=str(path))) is obs
    write_deltalake(str(path), data, mode="append")
    again = observer.observe(Upstream("orders", path=str(path)))
    assert again.latest_version == 2 and again.table_id == obs.table_id


@pytest.mark.parametrize("kind", ["missing", "not-delta"])
def test_unavailable_upstream_is_reported_by_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nope"
    if kind == "not-delta":
        path.mkdir()
        (path / "part-0.parquet").write_bytes(b"not really")
    with pytest.raises(
        UpstreamUnavailableError, match=r"Upstream 'ghost' at .*nope.* not a readable Delta"
    ):
        Observer().observe(Upstream("ghost", path=str(path)))
