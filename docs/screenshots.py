"""Screenshots of the Dagster UI for the README, taken against a live ``watermark dev``.

Runs the demo in a fresh temporary home (``watermark demo --fresh --rounds 2``), starts
``watermark dev`` on a free loopback port, commits to ``orders`` only (with delta-rs) so the
daemon plans a batch that ``customer_payments`` does not need, launches one backfill of old
batch partitions of both pipelines (as the UI's "Materialize" of selected partitions does)
and waits for it to end, lets the sensors tick, then opens the UI in headless Chromium and
saves one PNG per page under ``docs/img/``. Stops ``watermark dev`` (SIGTERM) at the end.

Needs Chromium (Debian: ``apt-get install chromium``) and the ``docs`` extra (Playwright's
Python client, used with that Chromium; no browser download)::

    .venv/bin/pip install -e '.[docs]'
    .venv/bin/python docs/screenshots.py            # writes docs/img/*.png

Not part of the test suite: it starts Spark and takes a few minutes.
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OUT = REPO / "docs" / "img"

# (file name, UI path, what it shows). Paths are Dagster 1.13's UI routes.
PAGES = [
    (
        "asset-graph.png",
        "/assets/orders_enriched?view=lineage&lineageScope=upstream",
        "a pipeline and the upstreams it reads",
    ),
    (
        "batch-materialization.png",
        "/assets/orders_enriched?view=partitions&partition={batch}",
        "one batch partition of a pipeline: its ranges and what the write committed",
    ),
    (
        "nothing-to-do.png",
        "/assets/customer_payments?view=partitions&partition={noop_batch}",
        "a batch the pipeline did not need: done with nothing to do",
    ),
    (
        "backfill.png",
        "/runs/b/{backfill}?tab=overview",
        "one backfill of old partitions of both pipelines, every partition replayed",
    ),
    (
        "replay-materialization.png",
        "/assets/orders_enriched?view=partitions&partition={replayed}",
        "a backfilled partition: its materialization says it was a replay, of what and why",
    ),
    ("upstream.png", "/assets/orders", "an upstream: its latest observation and lag"),
    ("upstream-events.png", "/assets/orders?view=events", "an upstream's observations over time"),
    ("upstream-checks.png", "/assets/orders?view=checks", "an upstream's checks"),
    ("pipeline-checks.png", "/assets/orders_enriched?view=checks", "a pipeline's checks"),
    ("sensors.png", "/automation", "the coordinator and finalizer sensors"),
]


# Per page: text to wait for before shooting (the backfill's table of assets renders after
# the page settled), and text to scroll to the middle of the view (the replay's metadata
# comes after the ranges and the write figures).
WAIT_FOR = {"backfill.png": "customer_payments"}
FOCUS = {"replay-materialization.png": "replay_batch_id"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], env: dict[str, str]) -> None:
    print("$", " ".join(args), flush=True)
    # Not inside WATERMARK_HOME: `--fresh` deletes it.
    subprocess.run(args, env=env, check=True, cwd=Path(env["WATERMARK_HOME"]).parent)


def _graphql(url: str, query: str) -> dict:
    answer = requests.post(f"{url}/graphql", json={"query": query}, timeout=30)
    answer.raise_for_status()
    return answer.json()["data"]


def _wait_loaded(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    query = "{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name } } } }"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"watermark dev exited ({proc.returncode})")
        with contextlib.suppress(requests.RequestException, KeyError, TypeError):
            if _graphql(url, query)["repositoriesOrError"]["nodes"]:
                return
        time.sleep(2)
    raise SystemExit("watermark dev did not load the code location in time")


def _batches(home: Path) -> list:
    from watermark_dagster.store import ReadOnlyWatermarkStore

    store = ReadOnlyWatermarkStore(str(home / "control"))
    return sorted(store.batches(), key=lambda b: b.seq)


def _commit_orders_only(home: Path) -> None:
    """One new order, written with delta-rs (no Spark): a batch only orders_enriched needs."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path = str(home / "demo" / "upstreams" / "orders")
    schema = DeltaTable(path).schema().to_arrow()
    row = {"order_id": [900_001], "customer_id": [1], "amount_cents": [1234], "status": ["new"]}
    write_deltalake(path, pa.Table.from_pydict(row, schema=pa.schema(schema)), mode="append")


def _wait_for_orders_only_batch(home: Path, dev: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.poll() is not None:
            raise SystemExit(f"watermark dev exited ({dev.returncode})")
        done = [b for b in _batches(home) if b.status.value == "COMPLETED"]
        if done and done[-1].pipelines == ("orders_enriched",):
            return
        time.sleep(5)
    raise SystemExit("the daemon did not complete the orders-only batch in time")


BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""

BACKFILL_STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } }
}
"""


def _backfill(url: str, home: Path, dev: subprocess.Popen, timeout: float = 600) -> str:
    """One backfill of the first three batch partitions orders_enriched ran and the first
    two customer_payments ran (each replays its batch's ranges); its id, once it ended."""
    batches = _batches(home)
    wanted = {
        "orders_enriched": [b.batch_id for b in batches if "orders_enriched" in b.pipelines][:3],
        "customer_payments": [b.batch_id for b in batches if "customer_payments" in b.pipelines][
            :2
        ],
    }
    params = {
        "partitionsByAssets": [
            {
                "assetKey": {"path": [asset]},
                "partitions": {"ranges": [{"start": p, "end": p} for p in keys]},
            }
            for asset, keys in wanted.items()
        ]
    }
    answer = requests.post(
        f"{url}/graphql", json={"query": BACKFILL, "variables": {"params": params}}, timeout=60
    ).json()["data"]["launchPartitionBackfill"]
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise SystemExit(f"the backfill was not launched: {answer}")
    backfill = answer["backfillId"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.poll() is not None:
            raise SystemExit(f"watermark dev exited ({dev.returncode})")
        found = requests.post(
            f"{url}/graphql",
            json={"query": BACKFILL_STATUS, "variables": {"id": backfill}},
            timeout=60,
        ).json()["data"]["partitionBackfillOrError"]
        if found.get("status") not in (None, "REQUESTED", "CANCELING", "FAILING"):
            print(f"backfill {backfill}: {found['status']} ({wanted})", flush=True)
            return backfill
        time.sleep(5)
    raise SystemExit(f"backfill {backfill} did not end in time")


def _wait_until_loaded(page, name: str, timeout: float = 120) -> None:
    """Wait until no element of the page reads "Loading" (the asset graph's nodes show
    "Loading…" until their live data arrives, after the network went idle)."""
    deadline = time.monotonic() + timeout
    while page.get_by_text("Loading", exact=False).count():
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: the UI still shows 'Loading' after {timeout:.0f} s")
        time.sleep(0.5)


def _shoot(url: str, pages: list[tuple[str, str, str]], out: Path, settle: float) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Chromium not found: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        # The UI's first-visit dialog shows a moment after the first page loads; once
        # skipped, the browser remembers it for the other pages.
        page.goto(url + "/assets", wait_until="networkidle", timeout=120_000)
        with contextlib.suppress(PlaywrightTimeout):
            page.get_by_role("button", name="Skip").click(timeout=20_000)
        for name, path, what in pages:
            page.goto(url + path, wait_until="networkidle", timeout=120_000)
            _wait_until_loaded(page, name)
            if name in WAIT_FOR:
                page.get_by_text(WAIT_FOR[name]).first.wait_for(timeout=120_000)
            time.sleep(settle)  # the UI renders after its GraphQL answers
            if name in FOCUS:
                page.get_by_text(FOCUS[name], exact=True).first.evaluate(
                    "e => e.scrollIntoView({block: 'center'})"
                )
                time.sleep(1)
            page.screenshot(path=str(out / name))
            print(f"{out / name}: {what}", flush=True)
        browser.close()


def main() -> None:
    """Run the demo, start ``watermark dev``, shoot the pages, stop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the PNGs")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds to let a page render")
    parser.add_argument(
        "--ticks", type=float, default=70.0, help="seconds to let the sensors run before shooting"
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="watermark-screens-"))
    home = scratch / "home"
    env = {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "WATERMARK_SENSOR_INTERVAL_SECONDS": "10",
    }
    watermark = str(BIN / "watermark")
    _run([watermark, "demo", "--fresh", "--rounds", "2"], env)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    dev = subprocess.Popen(
        [watermark, "dev", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=scratch,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_loaded(url, dev)
        _commit_orders_only(home)
        _wait_for_orders_only_batch(home, dev)
        backfill = _backfill(url, home, dev)
        time.sleep(args.ticks)
        batches = [b for b in _batches(home) if b.kind.value != "REPLAY"]
        batch = batches[-1].batch_id
        noop = next((b.batch_id for b in batches if "customer_payments" not in b.pipelines), batch)
        values = {"batch": batch, "noop_batch": noop, "backfill": backfill}
        # The second partition of orders_enriched the backfill replayed (a range of changes).
        ran = [b.batch_id for b in batches if "orders_enriched" in b.pipelines]
        values["replayed"] = ran[1] if len(ran) > 1 else ran[0]
        pages = [(n, p.format(**values), w) for n, p, w in PAGES]
        _shoot(url, pages, args.out, args.settle)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(dev.pid, signal.SIGTERM)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
