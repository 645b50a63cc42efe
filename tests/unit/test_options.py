"""One declaration per setting: the registry file, the Component and the docs' tables are
made from the dataclass fields, their types and their docstring sentences."""

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pytest

from watermark_dagster.config.file_options import PIPELINE_OPTIONS, UPSTREAM_OPTIONS
from watermark_dagster.config.options import Kind, options_of, written_as
from watermark_dagster.config.pipeline import ChangeFeed, Strategy, WriteMode
from watermark_dagster.config.upstream import (
    OnDataChange,
    SchemaChanges,
    UpstreamMode,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_option_tables_are_the_declarations() -> None:
    from watermark_dagster.dagster_defs.option_docs import docs_tables, with_tables

    for page, tables in docs_tables().items():
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        assert with_tables(text, tables) == text, (
            f"docs/{page}'s option tables differ from the declarations: run "
            "`python -m watermark_dagster.dagster_defs.option_docs --write docs`."
        )


@pytest.mark.parametrize(
    ("key", "enum", "options"),
    [
        ("mode", UpstreamMode, UPSTREAM_OPTIONS),
        ("on_data_change", OnDataChange, UPSTREAM_OPTIONS),
        ("schema_changes", SchemaChanges, UPSTREAM_OPTIONS),
        ("write", WriteMode, PIPELINE_OPTIONS),
        ("strategy", Strategy, PIPELINE_OPTIONS),
        ("change_feed", ChangeFeed, PIPELINE_OPTIONS),
    ],
)
def test_a_choice_takes_exactly_the_values_its_enum_stores(key, enum: type[StrEnum], options):
    (option,) = [o for o in options if o.key == key]
    assert option.choices == tuple(m.value for m in enum)


def test_every_setting_has_its_sentence_and_a_new_one_needs_nothing_else() -> None:
    for option in (*UPSTREAM_OPTIONS, *PIPELINE_OPTIONS):
        assert len(option.doc) > 10, option.key

    @dataclass(frozen=True, kw_only=True)
    class Probe:
        """A probe.

        Args:
            color: the color it is drawn in,
                on two lines.
            size: how big.
        """

        color: Literal["red", "blue"] = field(default="red", metadata=written_as(Kind.CHOICE))
        size: int = field(metadata=written_as(Kind.WHOLE))
        internal: int = 0

    color, size = options_of(Probe)
    assert (color.key, color.choices, color.default, color.shape) == (
        "color",
        ("red", "blue"),
        "red",
        "text (red or blue)",
    )
    assert color.doc == "the color it is drawn in, on two lines."
    assert size.required
    assert size.shape == "a whole number"


def test_a_setting_without_its_sentence_is_refused_at_import() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Undocumented:
        """Args:
        other: something else.
        """

        color: str = field(default="red", metadata=written_as(Kind.TEXT))

    with pytest.raises(TypeError, match=r"Undocumented.color .* Args:"):
        options_of(Undocumented)


def test_each_location_setting_is_read_from_its_variable_unless_the_component_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from watermark_dagster.dagster_defs.component import (
        SETTINGS_OPTIONS,
        SettingsSpec,
        settings_from_environment,
    )

    # A value of each kind other than its default, from the variable and from the spec.
    other = {Kind.WHOLE: "7", Kind.SECONDS: "120", Kind.TEXT: "5 4 * * *", Kind.CHOICE: "sensor"}
    spec_value = {Kind.WHOLE: 300, Kind.SECONDS: 300, Kind.TEXT: "0 0 * * *"}
    with_variable = [o for o in SETTINGS_OPTIONS if o.env]
    assert len(with_variable) == 12
    for option in with_variable:
        monkeypatch.setenv(option.env, other[option.kind])
    from_env = settings_from_environment()
    given = SettingsSpec(**{o.key: spec_value.get(o.kind, "sensor") for o in with_variable})
    monkeypatch.setenv("WATERMARK_FINALIZE", "run")  # the spec's value wins over it
    from_spec = settings_from_environment(given)
    for option in with_variable:
        assert option.field is not None
        holder = from_env if hasattr(from_env, option.field) else from_env.health
        spec_holder = from_spec if hasattr(from_spec, option.field) else from_spec.health
        raw = other[option.kind]
        want = raw if option.kind in (Kind.TEXT, Kind.CHOICE) else float(raw)
        assert getattr(holder, option.field) == want, option.env
        assert getattr(spec_holder, option.field) == spec_value.get(option.kind, "sensor")


@pytest.mark.parametrize(
    ("builder", "not_taken"),
    [
        ("pipeline", {"transform"}),
        ("declared_pipeline", {"transform", "full_transform", "write"}),
        ("sql_pipeline", {"transform", "full_transform", "write"}),
    ],
)
def test_each_python_builder_takes_the_pipeline_settings_with_their_defaults(
    builder: str, not_taken: set[str]
) -> None:
    """@pipeline, @declared_pipeline and sql_pipeline spell out their keywords for editors;
    a setting added to Pipeline fails here until each builder takes it."""
    import inspect

    from watermark_dagster.config import pipeline as module

    parameters = inspect.signature(getattr(module, builder)).parameters
    for option in options_of(module.Pipeline):
        assert option.field is not None
        if option.field in not_taken:
            assert option.field not in parameters, (builder, option.field)
            continue
        assert option.field in parameters, f"{builder} does not take {option.field}"
        default = parameters[option.field].default
        if default is not inspect.Parameter.empty:  # a builder may require what Pipeline need not
            assert default == option.default, (builder, option.field, default)


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e400"])
def test_a_seconds_variable_that_is_no_finite_number_is_refused_at_load(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """timedelta(seconds=nan) raised on every coordinator tick: no batch was ever planned."""
    from watermark_dagster.dagster_defs.component import settings_from_environment
    from watermark_dagster.errors import ConfigurationError

    monkeypatch.setenv("WATERMARK_MIN_BATCH_INTERVAL_SECONDS", raw)
    with pytest.raises(ConfigurationError, match="WATERMARK_MIN_BATCH_INTERVAL_SECONDS"):
        settings_from_environment()


from watermark_dagster.dagster_defs.component import SETTINGS_OPTIONS  # noqa: E402

SECONDS_SETTINGS = [o.key for o in SETTINGS_OPTIONS if o.kind is Kind.SECONDS]


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
@pytest.mark.parametrize("key", SECONDS_SETTINGS)
def test_a_seconds_setting_given_by_a_component_that_is_no_finite_number_is_refused(
    key: str, value: float
) -> None:
    """A component's `settings:` may say `.nan` or `.inf` (YAML floats): each seconds
    setting refuses it when the location loads, naming the setting (NaN passed the
    `< 0` checks before)."""
    from watermark_dagster.dagster_defs.component import SettingsSpec, settings_from_environment
    from watermark_dagster.errors import ConfigurationError

    assert len(SECONDS_SETTINGS) >= 5
    with pytest.raises(ConfigurationError, match=key):
        settings_from_environment(SettingsSpec(**{key: value}))


@pytest.mark.parametrize("raw", ["0", "-3"])
def test_a_sensor_interval_below_one_second_is_refused_at_load(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.dagster_defs.component import settings_from_environment
    from watermark_dagster.errors import ConfigurationError

    monkeypatch.setenv("WATERMARK_SENSOR_INTERVAL_SECONDS", raw)
    with pytest.raises(ConfigurationError, match="WATERMARK_SENSOR_INTERVAL_SECONDS"):
        settings_from_environment()


def test_a_retry_policy_with_a_backoff_that_is_no_finite_number_is_refused() -> None:
    from watermark_dagster.core.resuming import RetryPolicy

    for backoff in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="backoff"):
            RetryPolicy(death_backoff_seconds=backoff)
    assert RetryPolicy(death_backoff_seconds=0.0).backoff(3) == 0.0


@pytest.mark.parametrize("text", [".nan", ".inf", "-1"])
def test_a_cursor_lag_in_a_registry_file_that_is_no_finite_number_is_refused(
    text: str, tmp_path: Path
) -> None:
    from watermark_dagster.config.yaml_file import load_registry_file
    from watermark_dagster.errors import ConfigurationError

    path = tmp_path / "registry.yaml"
    path.write_text(
        "upstreams:\n"
        "  - name: clicks\n"
        "    path: /landing/clicks\n"
        "    mode: timestamp\n"
        "    cursor: event_time\n"
        f"    lag_seconds: {text}\n"
        "pipelines: {}\n"
    )
    with pytest.raises(ConfigurationError, match="lag_seconds"):
        load_registry_file(path)
