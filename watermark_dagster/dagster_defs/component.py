"""A watermark code location as a Dagster Component: ``defs.yaml`` declares what a registry
file declares (upstreams, pipelines, control root), plus a name, settings and Spark.

``dg scaffold defs watermark_dagster.WatermarkComponent orders`` writes a working
``defs.yaml``; ``dg check yaml`` checks its shape against the models below (an unknown key,
a value of the wrong type, with its line); loading it (``dg check defs``, ``dg dev``) runs
the registry file's own checks (:func:`~watermark_dagster.config.yaml_file.load_registry_mapping`)
with their ``defs.yaml:line`` errors. See docs/component.md.
"""

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from dagster import AssetKey, DefaultSensorStatus, Definitions, template_var
from dagster.components import (
    Component,
    ComponentLoadContext,
    Model,
    Resolvable,
    Scaffolder,
    ScaffoldRequest,
    scaffold_with,
)
from pydantic import BaseModel, Field, PrivateAttr, create_model

from watermark_dagster.config import env
from watermark_dagster.config.file_options import (
    PIPELINE_OPTIONS,
    UPSTREAM_OPTIONS,
    WAREHOUSE_OPTIONS,
)
from watermark_dagster.config.options import Kind, Option, file_only, options_of
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import as_reference
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.config.yaml_file import load_registry_mapping
from watermark_dagster.dagster_defs.definitions import WatermarkLocation, build_location
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.resources import SparkSessionResource, dagster_values
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.translator import WatermarkTranslator
from watermark_dagster.errors import ConfigurationError

Scalar = str | int | float | bool
KeyPath = tuple[str | int, ...]


class EnvReference(Model):
    """A value read from an environment variable when it is used: ``{env: VARIABLE}``."""

    env: str = Field(description="The environment variable holding the value.")


OptionValue = str | int | float | bool | EnvReference
# The type each kind of setting has in defs.yaml (Dagster checks it with `dg check yaml`).
_TYPES: dict[Kind, Any] = {
    Kind.TEXT: str,
    Kind.COLUMN: str,
    Kind.TABLE: str,
    Kind.FUNCTION: str,
    Kind.LOCATION: str,
    Kind.NAMES: str | list[str],
    Kind.UPSTREAMS: str | list[str] | dict[str, str | list[str] | None],
    Kind.WHOLE: int,
    Kind.SECONDS: float,
    Kind.START: str | int,
    Kind.OPTIONS: dict[str, Scalar],
    Kind.STORAGE_OPTIONS: dict[str, OptionValue],
    Kind.SECRET: EnvReference,
}


class _Spec(Resolvable, Model):
    """An entry of ``upstreams:`` or ``pipelines:``, its fields made from the declarations
    (:mod:`watermark_dagster.config.options`)."""


def _spec_model(name: str, doc: str, options: Sequence[Option]) -> type[_Spec]:
    fields: dict[str, Any] = {}
    for option in options:
        # A Literal of the choices, made at run time from the declaration's own.
        choices: Any = Literal[option.choices] if option.choices else None  # pyright: ignore[reportInvalidTypeArguments]
        kind: Any = choices or _TYPES[option.kind]
        about = option.plain + (" Relative: to defs.yaml." if option.kind is Kind.LOCATION else "")
        if option.required and not option.applies:
            fields[option.key] = (kind, Field(description=about))
        else:
            fields[option.key] = (kind | None, Field(None, description=about))
    return create_model(name, __base__=_Spec, __module__=__name__, __doc__=doc, **fields)


SETTINGS_OPTIONS = (
    *options_of(WatermarkSettings),
    file_only(
        "sensors",
        Kind.CHOICE,
        "whether the sensors start running when the location loads.",
        choices=("running", "stopped"),
        default="running",
    ),
    *options_of(HealthSettings),
)
"""The settings of a component's ``settings:``: a :class:`WatermarkSettings`' and a
:class:`HealthSettings`', each left out read from its ``WATERMARK_...`` variable."""

# A pipeline's target: a Delta table's location, or a warehouse table's settings.
_TYPES[Kind.TARGET] = str | _spec_model(
    "WarehouseSpec",
    "A warehouse table a pipeline loads (``target: {kind: postgres, ...}``).",
    WAREHOUSE_OPTIONS,
)

if TYPE_CHECKING:  # what the type checker sees of the models made below

    class UpstreamSpec(_Spec):
        """One upstream, as under ``upstreams:`` in a registry file."""

    class PipelineSpec(_Spec):
        """One pipeline, as under ``pipelines:`` in a registry file."""

    class SettingsSpec(_Spec):
        """Sensor, batching and health settings."""

else:
    UpstreamSpec = _spec_model(
        "UpstreamSpec",
        "One upstream, as under ``upstreams:`` in a registry file.",
        UPSTREAM_OPTIONS,
    )
    PipelineSpec = _spec_model(
        "PipelineSpec",
        "One pipeline, as under ``pipelines:`` in a registry file.",
        PIPELINE_OPTIONS,
    )
    SettingsSpec = _spec_model(
        "SettingsSpec",
        "Sensor, batching and health settings; each one left out is read from its "
        "``WATERMARK_...`` variable, as for ``watermark_dagster.definitions``.",
        SETTINGS_OPTIONS,
    )


class SparkSpec(Resolvable, Model):
    """The Spark resource; each setting left out is read from the environment
    (``WATERMARK_SPARK_MASTER``, ``WATERMARK_SPARK_REMOTE``, ...)."""

    master: str | None = None
    remote: str | None = None
    spark_config: dict[str, OptionValue] | None = Field(
        None, description="Spark settings over WATERMARK_SPARK_CONF's; secrets as {env: VAR}."
    )
    engine: Literal["auto", "connect", "process"] | None = None


@dataclass(frozen=True)
class _Source:
    """Where the component's attributes were written, to point errors at their line."""

    file: Path
    lines: dict[KeyPath, int]
    text: list[str]

    def line_of(self, path: KeyPath) -> int | None:
        return self.lines.get(path)

    def block_start(self, path: KeyPath) -> int | None:
        """The first text line of a literal block (``sql: |``) whose key is at ``path``."""
        line = self.lines.get(path)
        if line is None or line > len(self.text):
            return None
        return line + 1 if re.search(r":\s*\|[-+0-9]*\s*(#.*)?$", self.text[line - 1]) else None


class _KeyPrefixed(WatermarkTranslator):
    def __init__(self, prefix: list[str]) -> None:
        self.prefix = prefix

    def get_asset_key(self, item: Upstream | Pipeline) -> AssetKey:
        return AssetKey([*self.prefix, *super().get_asset_key(item).path])


class WatermarkComponentScaffolder(Scaffolder):
    """Writes a ``defs.yaml`` that loads as it is: one upstream and one declared pipeline,
    each line commented."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        """Write ``defs.yaml`` in the target folder, named after the folder."""
        folder = request.target_path
        folder.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"\W", "_", folder.name).strip("_") or "watermark"
        if not name[0].isalpha():
            name = f"wm_{name}"
        (folder / "defs.yaml").write_text(
            SCAFFOLD_TEMPLATE.format(type=request.type_name, name=name)
        )


SCAFFOLD_TEMPLATE = """\
type: {type}

# A watermark code location: upstream Delta tables, pipelines that read their changes
# exactly once, and the control tables that remember how far each got. The keys under
# upstreams: and pipelines: are those of a registry file (see docs/component.md).
# `dg check yaml` checks this file's shape; `dg check defs` loads it.
attributes:
  # Prefixes this location's job, sensors and resource keys ({name}_watermark_coordinator):
  # each watermark component of a project needs its own.
  name: {name}
  # Where the batches and watermarks are kept; one per component (relative: to this file).
  control_root: _watermark
  upstreams:
    # Example upstream: a Delta table whose new versions are read as changes.
    orders: {{path: data/orders}}
  pipelines:
    # Example pipeline: declared by its full SQL; each upstream names the key path from
    # its rows to the target's keys, and the incremental form is derived.
    customer_totals:
      upstreams: {{orders: customer_id}}
      target: data/customer_totals
      keys: [customer_id]
      sql: SELECT customer_id, SUM(amount) AS total FROM orders GROUP BY customer_id
  # settings: {{min_batch_interval_seconds: 60, sensors: stopped}}
  # spark: {{master: "local[2]"}}
"""


@scaffold_with(WatermarkComponentScaffolder)
class WatermarkComponent(Component, Resolvable, Model):
    """A watermark code location declared in ``defs.yaml``: upstreams, pipelines and their
    control root, as a registry file declares them, plus a name, settings and Spark.

    Several components merge into one project: each needs its own ``name`` (the prefix of
    its job, sensors, batch partitions and resource keys) and ``control_root``; asset keys
    must differ too (distinct names, or a ``key_prefix``).

    Example ``defs.yaml``::

        type: watermark_dagster.WatermarkComponent
        attributes:
          name: sales
          control_root: /lake/_watermark/sales
          upstreams:
            orders: {path: /lake/orders}
          pipelines:
            customer_totals:
              upstreams: {orders: customer_id}
              target: /lake/customer_totals
              keys: [customer_id]
              sql: SELECT customer_id, SUM(amount) AS total FROM orders GROUP BY customer_id
    """

    name: str | None = Field(
        None,
        description="Prefix of this location's job, sensors, batch partitions and resource "
        "keys (letters, digits, underscores); required when the project holds several.",
    )
    control_root: str | None = Field(
        None,
        description="Where the control tables live (relative: to defs.yaml). Without it, "
        "$WATERMARK_HOME/control, and only for a component without a name.",
    )
    control_storage_options: dict[str, OptionValue] | None = Field(
        None, description="delta-rs storage options of the control root."
    )
    key_prefix: str | list[str] | None = Field(
        None, description="Put before every asset key (orders -> [prefix, orders])."
    )
    upstreams: dict[str, str | UpstreamSpec] = Field(
        default_factory=dict, description="name: {path: ..., ...}, or name: path."
    )
    pipelines: dict[str, PipelineSpec] = Field(
        default_factory=dict, description="name: {upstreams: ..., target: ..., ...}."
    )
    settings: SettingsSpec | None = None
    spark: SparkSpec | None = None

    _source: _Source | None = PrivateAttr(default=None)

    @staticmethod
    @template_var
    def watermark_home() -> str:
        """``{{ watermark_home }}`` in defs.yaml: ``WATERMARK_HOME``, made absolute."""
        return str(env.home())

    @classmethod
    def load(cls, attributes: BaseModel | None, context: ComponentLoadContext) -> Self:
        """Dagster's loading, remembering where each attribute was written."""
        component = super().load(attributes, context)
        component._source = _source_of(context)
        return component

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        """The location's ``Definitions`` (see :meth:`build_location`)."""
        return self.build_location(context.path).definitions

    def build_location(self, folder: Path | None = None) -> WatermarkLocation:
        """The code location these attributes declare.

        Args:
            folder: relative paths are taken from it (default: the folder of defs.yaml,
                else the working directory).

        Raises:
            ConfigurationError: an entry is wrong; the message starts with
                ``defs.yaml:line`` when the component was loaded from one.
        """
        source = self._source
        file = source.file if source else Path(folder or Path.cwd()) / "defs.yaml"
        base = file.parent if source else Path(folder or Path.cwd())
        data: dict[str, Any] = {
            "upstreams": {
                k: v if isinstance(v, str) else _plain(v) for k, v in self.upstreams.items()
            },
            "pipelines": {k: _plain(v) for k, v in self.pipelines.items()},
        }
        if self.control_root is not None:
            data["control_root"] = self.control_root
        if self.control_storage_options is not None:
            data["control_storage_options"] = {
                k: v.model_dump() if isinstance(v, EnvReference) else v
                for k, v in self.control_storage_options.items()
            }
        loaded = load_registry_mapping(
            data,
            source=file,
            base=base,
            line_of=source.line_of if source else lambda _p: None,
            block_start=source.block_start if source else lambda _p: None,
            what="attributes",
        )

        def fail(key: str, error: ConfigurationError) -> ConfigurationError:
            line = source.line_of((key,)) if source else None
            where = f"{file}:{line}" if line else str(file)
            return ConfigurationError(f"{where}: {error}")

        control_root = loaded.control_root
        if control_root is None:
            if self.name is not None:
                raise fail(
                    "name",
                    ConfigurationError(
                        f"component {self.name!r} has no control_root.",
                        fix="give each named component its own control_root: (e.g. "
                        f"control_root: /lake/_watermark/{self.name}).",
                    ),
                )
            control_root = str(env.home() / "control")  # as the registry file's default
        try:
            settings = settings_from_environment(self.settings)
        except ConfigurationError as e:
            raise fail("settings", e) from None
        try:
            spark = spark_from_environment(self.spark)
        except (ConfigurationError, ValueError) as e:
            raise fail("spark", ConfigurationError(str(e))) from None
        prefix = [self.key_prefix] if isinstance(self.key_prefix, str) else self.key_prefix
        try:
            return build_location(
                loaded.registry,
                control_root=control_root,
                storage_options=loaded.control_storage_options,
                spark=spark,
                settings=settings,
                translator=_KeyPrefixed(prefix) if prefix else None,
                name=self.name,
            )
        except ConfigurationError as e:
            raise fail("name" if self.name else "pipelines", e) from None


def settings_from_environment(spec: SettingsSpec | None = None) -> WatermarkSettings:
    """The sensor and batching settings from ``WATERMARK_...`` variables, with the fields
    ``spec`` sets instead.

    Raises:
        ConfigurationError: a value is not usable (names it and the fix).
    """
    given = spec.model_dump(exclude_none=True) if spec else {}

    def values(cls: type) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for option in options_of(cls):
            value = given.get(option.key)
            value = env.setting(option) if value is None else value
            if value is not None and option.field is not None:
                found[option.field] = value
        return found

    settings = WatermarkSettings(
        **values(WatermarkSettings), health=HealthSettings(**values(HealthSettings))
    )
    sensors = given.get("sensors")
    if sensors is not None:
        status = (
            DefaultSensorStatus.RUNNING if sensors == "running" else DefaultSensorStatus.STOPPED
        )
        settings = replace(settings, default_status=status)
    return settings


def spark_from_environment(spec: SparkSpec | None = None) -> SparkSessionResource:
    """The Spark resource from ``WATERMARK_SPARK_*`` variables, with what ``spec`` sets
    instead (its ``spark_config`` over ``WATERMARK_SPARK_CONF``)."""
    conf: dict[str, Any] = dict(env.spark_conf())
    if spec is not None and spec.spark_config:
        conf.update(
            {
                k: as_reference(v.model_dump()) if isinstance(v, EnvReference) else v
                for k, v in spec.spark_config.items()
            }
        )
    master = spec.master if spec and spec.master else None
    remote = spec.remote if spec and spec.remote else None
    engine = spec.engine if spec and spec.engine else None
    return SparkSessionResource(
        master=master or os.environ.get("WATERMARK_SPARK_MASTER", "local[*]"),
        remote=remote or os.environ.get("WATERMARK_SPARK_REMOTE") or None,
        conf=dagster_values(conf) or {},
        engine=engine or env.engine(),  # type: ignore[arg-type]
    )


def _plain(spec: BaseModel) -> dict[str, Any]:
    """An entry as a registry file would hold it: keys left out are absent."""
    return spec.model_dump(exclude_none=True)


def _source_of(context: ComponentLoadContext) -> _Source | None:
    """The file and the line of every key under ``attributes:``, from Dagster's parse."""
    tree = context.resolution_context.source_position_tree
    if tree is None:
        return None
    lines: dict[KeyPath, int] = {}

    def walk(node: Any, path: KeyPath) -> None:
        for key, child in node.children.items():
            lines[(*path, key)] = child.position.start.line
            walk(child, (*path, key))

    attributes = tree.children.get("attributes")
    if attributes is None:
        return None
    walk(attributes, ())
    file = Path(tree.position.filename)
    try:
        text = file.read_text(encoding="utf-8").splitlines()
    except OSError:
        text = []
    return _Source(file=file, lines=lines, text=text)
