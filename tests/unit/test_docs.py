"""Every code block of the README and the docs site is run, so no example goes stale.

How a block is run depends on its language (none starts a JVM: the examples declare and
configure; the Spark suites run the batches they describe):

- ``python``: a page's blocks in order, in one fresh interpreter, in a folder holding the
  README's ``registry.yaml`` and ``my_pkg/transforms.py``, the user's package the examples
  import (provided here, as a reader would have their own).
- ``yaml``: a registry file is loaded by ``load_registry_file``, with every check a code
  location makes when it loads; a component's ``defs.yaml`` by Dagster's
  ``load_from_defs_folder``, as ``dg`` loads it; a Dagster instance block (``storage:``,
  ``concurrency:``) is merged into the shipped ``dagster.yaml`` and validated by Dagster's
  schema; a workspace
  (``load_from:``) by Dagster's workspace schema; a run config (``ops:``) by the config schema
  of the demo location's job its op belongs to. A block after
  ``<!-- docs-test: refused PHRASE -->`` must be refused, with PHRASE in the message.
- ``bash``: every command is checked against the program it names, without running its
  work: ``watermark`` command lines are parsed by the command's own parser; every
  ``--option`` given to a benchmark, ``dagster``, ``dg`` or ``pytest`` must be listed by that
  program's ``--help``; ``pip install`` extras must exist in ``pyproject.toml``; test paths
  and ``-m`` markers must exist; ``WATERMARK_SPARK_CONF`` must parse as the location reads
  it. A program that needs a server (Spark's ``start-connect-server.sh``) names the test that
  starts it with the same arguments.
- ``sql``: parsed with sqlglot's Spark dialect.
- ``text``: command output and diagrams, not run. A block with no language is refused.
"""

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"python", "yaml", "bash", "sql", "text"}
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M
)
DIRECTIVE = re.compile(r"<!-- docs-test: (?P<what>\w+) ?(?P<arg>.*?) -->\s*$")
BIN = Path(sys.executable).parent

# The user's package the registry examples import (`my_pkg.transforms:...`).
MY_PKG = '''
"""The transforms the docs' registry examples name."""


def orders_enriched(batch):
    """Hand-written (transform:): the orders a batch touched, with their customer."""
    return batch["orders"].changes


def orders_enriched_full(orders, customers):
    """Declared (full:): orders with their customer's name, from scratch."""
    return orders.join(customers.select("customer_id", "name"), "customer_id", "left")


def drops_log(batch):
    return batch["drops"].changes


def clicks_log(batch):
    """Append target: the clicks of the window."""
    return batch["clicks"].changes
'''


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    directive: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    text = page.read_text()
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found = DIRECTIVE.search(before)
        yield Block(
            page=page,
            line=text.count("\n", 0, m.start()) + 1,
            lang=m.group("lang").strip(),
            body=textwrap.dedent(m.group("body")),
            directive=(found.group("what"), found.group("arg")) if found else None,
        )


ALL = [b for page in PAGES for b in blocks(page)]


def of(lang: str) -> list[Block]:
    return [b for b in ALL if b.lang == lang]


def test_the_docs_have_code_blocks_of_every_kind_and_each_names_its_language() -> None:
    assert {b.lang for b in ALL} == LANGUAGES, "a language is missing, or one is new"
    untagged = [b.where for b in ALL if b.lang not in LANGUAGES]
    assert not untagged, f"blocks without a known language (python/yaml/bash/sql/text): {untagged}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reader's folder: the README's registry file and their package of transforms."""
    root = tmp_path_factory.mktemp("reader")
    (root / "my_pkg").mkdir()
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "transforms.py").write_text(MY_PKG)
    readme_registry = [
        b for b in blocks(REPO / "README.md") if b.lang == "yaml" and "registry.yaml" in b.body
    ]
    assert len(readme_registry) == 1, "the README's first pipeline lost its registry.yaml"
    (root / "registry.yaml").write_text(readme_registry[0].body)
    return root


def _env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATERMARK_")}
    env["PYTHONPATH"] = f"{workdir}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["WATERMARK_HOME"] = str(workdir / ".watermark")
    return env


# --- python -----------------------------------------------------------------------------

RUN_PAGE = """
import json, sys
namespace = {"__name__": "__docs__"}
for where, source in json.load(sys.stdin):
    try:
        exec(compile(source, where, "exec"), namespace)
    except BaseException as e:
        print(f"{where}: {type(e).__name__}: {e}", file=sys.stderr)
        raise
"""

PYTHON_PAGES = sorted({b.page for b in of("python")})


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, workdir: Path) -> None:
    source = [(b.where, b.body) for b in of("python") if b.page == page]
    done = subprocess.run(
        [sys.executable, "-c", RUN_PAGE],
        input=json.dumps(source),
        cwd=workdir,
        env=_env(workdir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


# --- yaml -------------------------------------------------------------------------------

INSTANCE_KEYS = {
    "storage",
    "concurrency",
    "run_monitoring",
    "run_queue",
    "run_coordinator",
    "run_launcher",
    "telemetry",
}


@pytest.mark.parametrize("block", of("yaml"), ids=lambda b: b.where)
def test_yaml_blocks_load(block: Block, workdir: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    if "type" in data and "attributes" in data:
        _check_component(block, tmp_path)
    elif set(data) & INSTANCE_KEYS:
        _check_instance(block, tmp_path)
    elif "load_from" in data:
        _check_workspace(block, data)
    elif "ops" in data:
        _check_run_config(block, data, tmp_path)
    else:
        _check_registry(block, workdir, tmp_path)


def _check_registry(block: Block, workdir: Path, tmp_path: Path) -> None:
    from watermark_dagster.config.yaml_file import load_registry_file
    from watermark_dagster.errors import ConfigurationError

    path = tmp_path / "registry.yaml"
    path.write_text(block.body)
    sys.path.insert(0, str(workdir))  # my_pkg
    try:
        if block.directive and block.directive[0] == "refused":
            with pytest.raises(ConfigurationError) as refused:
                load_registry_file(path)
            assert block.directive[1] in str(refused.value), str(refused.value)
        else:
            assert block.directive is None, f"{block.where}: unknown directive {block.directive}"
            loaded = load_registry_file(path)
            assert loaded.registry.pipelines or loaded.registry.upstreams
    finally:
        sys.path.remove(str(workdir))


def _check_component(block: Block, tmp_path: Path) -> None:
    """A ``defs.yaml``: loaded by Dagster from a project's defs folder, as ``dg`` does."""
    import warnings

    from dagster import load_from_defs_folder

    from watermark_dagster.dagster_defs.definitions import locations_in

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "docs_project"\nversion = "0"\n\n[tool.dg]\n'
        'directory_type = "project"\n\n[tool.dg.project]\nroot_module = "docs_project"\n'
    )
    package = tmp_path / "docs_project"
    (package / "defs" / "example").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "example" / "defs.yaml").write_text(block.body)
    sys.path.insert(0, str(tmp_path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            defs = load_from_defs_folder(path_within_project=package)
    finally:
        sys.path.remove(str(tmp_path))
        # Every module of the project, so that the next block's project (same name, another
        # folder) is imported afresh in a process that checked one already.
        for name in [
            m for m in sys.modules if m == "docs_project" or m.startswith("docs_project.")
        ]:
            del sys.modules[name]
    locations = locations_in(defs)
    assert locations, f"{block.where}: the component built no watermark location"
    assert all(loc.registry.pipelines for loc in locations.values()), block.where


def _check_run_config(block: Block, data: dict, tmp_path: Path) -> None:
    from dagster import validate_run_config

    from watermark_dagster.definitions import build_demo_definitions

    defs = build_demo_definitions(tmp_path)
    ops = set(data["ops"])
    jobs = [
        job
        for job in defs.resolve_all_job_defs()
        if ops <= {node.name for node in job.graph.node_defs}
    ]
    assert jobs, f"{block.where}: no job of the demo location has the ops {sorted(ops)}"
    validate_run_config(jobs[0], data)  # raises DagsterInvalidConfigError


def _check_instance(block: Block, tmp_path: Path) -> None:
    from dagster._core.instance.config import dagster_instance_config

    shipped = yaml.safe_load((REPO / "dagster.yaml").read_text()) or {}
    merged = {**shipped, **yaml.safe_load(block.body)}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(merged))
    names = re.findall(r"\{env: (\w+)\}", block.body)
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update({n: "5432" for n in names})  # a value of every type the block needs
    try:
        dagster_instance_config(str(tmp_path))  # raises DagsterInvalidConfigError
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n)
            else:
                os.environ[n] = v


def _check_workspace(block: Block, data: dict) -> None:
    from dagster._config import process_config
    from dagster._core.workspace.config_schema import WORKSPACE_CONFIG_SCHEMA

    result = process_config(WORKSPACE_CONFIG_SCHEMA, data)
    assert result.success, f"{block.where}: {[e.message for e in result.errors or []]}"


# --- bash -------------------------------------------------------------------------------

# Programs that need a server the tests start: the sources that start it with the same
# options and settings (tests/scale's Connect server: spark-submit of the same class).
RUN_BY_TESTS = {
    "start-connect-server.sh": [
        REPO / "tests" / "scale" / "spark_servers.py",
        REPO / "watermark_dagster" / "runtime" / "spark.py",
    ]
}


def commands(block: Block) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Each command of a block: its variable assignments and its words."""
    pending = ""
    for line in re.sub(r"\\\n\s*", " ", block.body).splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quoted value goes on to the next line
            continue
        pending = ""
        for part in _split(words):
            if part and part[0] == "export":
                part = part[1:]
            assigned = {}
            while part and re.match(r"^[A-Z_][A-Z0-9_]*=", part[0]):
                name, value = part.pop(0).split("=", 1)
                assigned[name] = value
            part = [w for w in part if w != "&" and not re.match(r"^\d?>", w)]
            if part or assigned:
                yield assigned, part
    assert not pending, f"{block.where}: an unclosed quote"


def _split(words: list[str]) -> Iterator[list[str]]:
    """Commands joined by ``&&`` or ``;``."""
    part: list[str] = []
    for w in words:
        if w in ("&&", ";"):
            yield part
            part = []
        else:
            part.append(w)
    yield part


@functools.cache
def _help(argv: tuple[str, ...]) -> str:
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, f"{' '.join(argv)} --help failed: {done.stderr[-2000:]}"
    return done.stdout


def _options(words: list[str]) -> set[str]:
    return {w.split("=", 1)[0] for w in words if w.startswith("--")}


def _program(words: list[str]) -> list[str]:
    """The program and its subcommands: the words before the first option or path-like
    argument (``dg check defs``, ``dagster code-server start``, ``python -m MODULE``)."""
    head = [words[0]]
    rest = words[1:]
    if Path(words[0]).name.startswith("python"):
        if rest and rest[0] == "-m":
            return [sys.executable, "-m", rest[1]]
        return [sys.executable, str(REPO / rest[0])]
    for w in rest:
        if w.startswith("-") or "/" in w or "." in w:
            break
        head.append(w)
    return head


def _check_command(block: Block, assigned: dict[str, str], words: list[str]) -> None:
    from watermark_dagster.config.env import spark_conf

    if "WATERMARK_SPARK_CONF" in assigned:
        saved = os.environ.get("WATERMARK_SPARK_CONF")
        os.environ["WATERMARK_SPARK_CONF"] = assigned["WATERMARK_SPARK_CONF"]
        try:
            assert spark_conf(), f"{block.where}: WATERMARK_SPARK_CONF sets nothing"
        finally:
            if saved is None:
                os.environ.pop("WATERMARK_SPARK_CONF")
            else:
                os.environ["WATERMARK_SPARK_CONF"] = saved
    if not words:
        return
    name = Path(words[0]).name
    if name == "watermark":
        from watermark_dagster.cli.parser import build_parser

        try:
            build_parser().parse_args(words[1:])
        except SystemExit as e:
            pytest.fail(f"{block.where}: watermark {' '.join(words[1:])} does not parse ({e})")
    elif name in ("pip", "pip3") or words[1:3] == ["-m", "pip"]:
        text = (REPO / "pyproject.toml").read_text()
        for extras in re.findall(r"\[([\w,]+)\]", " ".join(words)):
            for extra in extras.split(","):
                assert re.search(rf"^{extra} = \[", text, re.M), f"{block.where}: no extra {extra}"
    elif name == "python3" and words[1:3] == ["-m", "venv"]:
        pass
    elif name in RUN_BY_TESTS:
        source = "".join(p.read_text() for p in RUN_BY_TESTS[name])
        used = _options(words) | {w.split("=", 1)[0] for w in words if "=" in w}
        unknown = sorted(u for u in used if u not in source)
        assert not unknown, f"{block.where}: {unknown} not in what the tests start"
    else:
        program = _program(words)
        if name == "pytest":
            program = [sys.executable, "-m", "pytest"]
            _check_pytest(block, words[1:])
        local = BIN / Path(program[0]).name
        if len(program[0].split("/")) > 1 or local.exists():
            program[0] = str(local) if local.exists() else program[0]
        listed = _help(tuple(program))
        missing = _options(words) - {o for o in _options(listed.split()) if o}
        missing = {o for o in missing if o not in listed}
        assert not missing, f"{block.where}: {' '.join(program)} has no option {sorted(missing)}"


def _check_pytest(block: Block, args: list[str]) -> None:
    text = (REPO / "pyproject.toml").read_text()
    for i, a in enumerate(args):
        if a == "-m":
            for marker in re.findall(r"\w+", args[i + 1]):
                assert marker in ("not", "and", "or") or f'"{marker}:' in text, (
                    f"{block.where}: no pytest marker {marker}"
                )
        elif not a.startswith("-") and (i == 0 or args[i - 1] not in ("-m", "-n")):
            assert (REPO / a).exists(), f"{block.where}: no test path {a}"


@pytest.mark.parametrize("block", of("bash"), ids=lambda b: b.where)
def test_bash_blocks_name_real_commands_and_options(block: Block) -> None:
    found = list(commands(block))
    assert found, f"{block.where}: no command"
    for assigned, words in found:
        _check_command(block, assigned, words)


# --- sql --------------------------------------------------------------------------------


@pytest.mark.parametrize("block", of("sql"), ids=lambda b: b.where)
def test_sql_blocks_parse(block: Block) -> None:
    import sqlglot

    assert sqlglot.parse(block.body, read="spark"), block.where


# --- the API reference ------------------------------------------------------------------


def test_the_api_reference_documents_every_public_name() -> None:
    import watermark_dagster

    page = (REPO / "docs" / "api.md").read_text()
    documented = {line.rsplit(".", 1)[-1] for line in re.findall(r"^::: (\S+)$", page, re.M)}
    missing = set(watermark_dagster.__all__) - documented
    assert not missing, f"docs/api.md has no `::: module.Name` for {sorted(missing)}"


def test_the_readme_is_a_front_door() -> None:
    """At most 250 lines, and every page of the site is reachable from it."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def _ci_docs_command() -> list[str]:
    """The docs stage's command as ``.ci/run`` runs it (its site folder left out)."""
    script = (REPO / ".ci" / "run").read_text()
    [line] = [ln.strip() for ln in script.splitlines() if "mkdocs build" in ln]
    words = shlex.split(line)
    assert words[0] == "NO_MKDOCS_2_WARNING=1", line
    at = words.index("--site-dir")
    return [str(REPO / words[1]), *words[2:at], *words[at + 2 :]]


def test_the_ci_docs_stage_fails_on_a_broken_link_or_anchor(tmp_path: Path) -> None:
    """The docs stage of ``.ci/run`` fails on a link to a missing page or anchor.

    With ``--quiet`` beside ``--strict``, mkdocs 1.6 hid such warnings and exited 0.
    """
    site = tmp_path / "site"
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "README.md"):  # the site includes parts of the README
        shutil.copy(REPO / name, tmp_path / name)
    command = [*_ci_docs_command(), "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    clean = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr[-3000:]
    with (tmp_path / "docs" / "instance.md").open("a") as page:
        page.write("\nSee [the engines](engines.md#no-such-anchor).\n")
    broken = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert broken.returncode != 0, "a link to a missing anchor passed the docs stage"
    assert "no-such-anchor" in broken.stderr + broken.stdout


def test_no_line_of_the_docs_is_over_400_characters() -> None:
    """A long line is a wall in a diff and in a review: a table row that long becomes a
    shorter row and a paragraph or a list under the table, a paragraph is wrapped (Markdown
    joins the lines). The option tables (between ``<!-- NAME:start -->`` and
    ``<!-- NAME:end -->``) are made from the declarations' docstrings: a long row there is
    shortened in the declaration, and ``python -m watermark_dagster.dagster_defs.option_docs
    --write docs`` makes the page again.
    """
    long = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text()
        long += [
            f"{page.relative_to(REPO)}:{number}: {len(line)} characters"
            for number, line in enumerate(text.splitlines(), start=1)
            if len(line) > 400
        ]
    assert not long, "lines over 400 characters:\n" + "\n".join(long)
