"""The MLflow UI shows pipelab's runs table: a real run, `mlflow ui` on a loopback port, headless
Chromium (the plain `chromium` CLI: `--dump-dom` for the page text, `--screenshot` for a picture).

MLflow 3.17's UI opens an experiment on the tab its sidebar switch *GenAI | Model training*
says (GenAI, the traces overview, until a user flips it; the browser keeps the choice), or
`?workflowType=machine_learning` in the URL says; the README gives that URL. This test opens it
in a fresh browser profile and checks, from the rendered page, that the runs table with the run's
name (and its dataset input) is what is shown, not the GenAI overview.

A second experiment holds single runs with overrides and a 4-job sweep: each run is named by
what it changes, the parent by what it sweeps; no metric is constant over a run; a run's link
opens its Model metrics charts, not MLflow's GenAI pages.

Slow (CLI runs, the server's start-up and a browser), and skipped without Chromium:
`bash setup.sh --ui` installs it. `PIPELAB_UI_SCREENSHOT=docs/mlflow_runs_table.png python -m
pytest -m slow tests/test_mlflow_ui.py` refreshes the README's screenshot.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from framework.tracking import ui_links
from framework.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tests.test_cli_and_tracking import TINY, cli

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((p for p in map(shutil.which, BROWSERS) if p), None)
WINDOW = (1400, 900)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (none of " + ", ".join(BROWSERS) + " on PATH): `bash setup.sh --ui` or `apt-get install chromium`"),
]


def runs_table_url(base: str, experiment_id: str) -> str:
    """The README's link: the experiment's page in the UI's model-training mode."""
    return ui_links.experiment_url(base, experiment_id)


SINGLE_OVERRIDES = [["cluster.device.slowdown=4"], ["train.iterations_per_epoch=2"], ["scheduler.microbatches=2", "cluster.device.slowdown=2"]]
SWEEP = ["scheduler=gpipe,1f1b", "compressor=none,fp16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_text(dom: str) -> str:
    """The visible text of a dumped DOM, whitespace collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def title_of(dom: str) -> str:
    m = re.search(r"<title>(.*?)</title>", dom, flags=re.S | re.I)
    return html.unescape(m.group(1)).strip() if m else ""


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_template):
    """A store with a real pipelab run (the CLI, tiny settings) in experiment `pipelab`."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("ui_store")
    db = root / "mlflow.db"
    shutil.copy(mlflow_template, db)
    uri = f"sqlite:///{db}"
    tracking = ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.artifact_root={root / 'art'}", "tracking.experiment=pipelab"]
    res = cli(tracking + TINY, root)
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("pipelab")
    (run,) = client.search_runs([exp.experiment_id])
    return root, uri, exp, run


@pytest.fixture(scope="module")
def views(store):
    """Experiment `views` of the same store: single runs with overrides, then a 4-job sweep.
    Returns (experiment, single runs by their overrides, the sweep's parent, its children, the sweep's stdout)."""
    from mlflow.tracking import MlflowClient

    root, uri, _, _ = store
    tracking = ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.artifact_root={root / 'art'}", "tracking.experiment=views"]
    client = MlflowClient(tracking_uri=uri)
    singles = {}
    for i, overrides in enumerate(SINGLE_OVERRIDES):
        res = cli(tracking + TINY + overrides + [f"hydra.run.dir=single{i}"], root)
        assert res.returncode == 0, res.stderr[-3000:]
        run_id = json.loads((root / f"single{i}" / "summary.json").read_text())["mlflow_run_id"]
        singles[" ".join(overrides)] = client.get_run(run_id)
    sweep = cli(["-m"] + tracking + TINY + [*SWEEP, f"hydra.sweep.dir={root / 'sweep'}"], root)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    exp = client.get_experiment_by_name("views")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and r.info.run_id not in {s.info.run_id for s in singles.values()}]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return exp, singles, parent, children, sweep.stdout


def constant_metrics(client, run) -> list[str]:
    """The run's metrics logged more than once with one value throughout (a flat line, or a
    "dramatic diagonal" of float noise)."""
    out = []
    for key in run.data.metrics:
        values = [m.value for m in client.get_metric_history(run.info.run_id, key)]
        if len(values) > 1 and all(abs(v - values[0]) <= 1e-9 * max(1.0, abs(values[0])) for v in values):
            out.append(key)
    return out


@pytest.fixture(scope="module")
def ui(store):
    """`mlflow ui` on a free loopback port; its base URL. Stopped (its whole process group) after."""
    root, uri, _, _ = store
    port = free_port()
    # no background job workers: the UI needs none, and they would crowd a 2-core machine
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_SERVER_JOB_ENABLE_PERIODIC_TASKS="false", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    log = open(root / "mlflow_ui.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow ui exited with {proc.returncode}:\n{(root / 'mlflow_ui.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"mlflow ui did not answer on {base} within 180 s:\n{(root / 'mlflow_ui.log').read_text()[-3000:]}")
            time.sleep(1)
        yield base
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)  # the server and the workers it started, nothing else
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def chromium(url: str, out: Path, *, budget_ms: int) -> tuple[str, Path]:
    """Render `url` in a fresh headless profile: (the DOM once scripts settled, a screenshot)."""
    shot = out / "page.png"
    shot.unlink(missing_ok=True)
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", "--disable-component-update",
            f"--user-data-dir={out / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--virtual-time-budget={budget_ms}",
            f"--screenshot={shot}", "--dump-dom", url]
    res = subprocess.run(args, capture_output=True, text=True, timeout=240, cwd=out)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout, shot


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_experiment_opens_on_the_runs_table_with_the_run(store, ui, tmp_path):
    _, _, exp, run = store
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND  # a model-training experiment
    name = run.info.run_name
    assert name == "gpipe lenet pi4_wifi " + " ".join(o for o in TINY if o != "runtime.progress=false")  # what it changes; not how it is watched

    # a loaded machine may still be fetching when the first budget runs out: retry, longer
    for budget in (20_000, 40_000, 80_000):
        dom, shot = chromium(runs_table_url(ui, exp.experiment_id), tmp_path, budget_ms=budget)
        text = page_text(dom)
        if name in text:
            break
    title = title_of(dom)
    assert title.startswith("Runs - "), (title, text[:2000])
    assert name in text and "Run Name" in text, text[:2000]
    assert re.search(r"\b1 matching run\b", text), text[:2000]
    assert "synthetic_mnist" in text, text[:2000]  # the Dataset column: the run's dataset input
    for genai in ("Token Usage", "Tokens per Trace", "Detect Issues"):  # the GenAI overview's panels
        assert genai not in text, (genai, text[:2000])

    assert png_size(shot) == WINDOW
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.std() > 0.05  # a rendered page, not a blank one
    target = os.environ.get("PIPELAB_UI_SCREENSHOT")
    if target:
        shutil.copy(shot, target)


def test_a_run_logs_no_constant_metric_and_its_link_opens_its_charts(store, ui, tmp_path):
    from mlflow.tracking import MlflowClient

    root, uri, exp, run = store
    client = MlflowClient(tracking_uri=uri)
    assert constant_metrics(client, run) == []
    assert not any(k.startswith("compression/") or k.startswith("net/raw_bytes/") for k in run.data.metrics), sorted(run.data.metrics)  # compressor=none
    assert {"val/acc", "train/loss", "test/acc", "time/epoch_virtual_s"} <= set(run.data.metrics)
    url = ui_links.run_url(ui, exp.experiment_id, run.info.run_id)
    for budget in (20_000, 40_000, 80_000):
        dom, _ = chromium(url, tmp_path, budget_ms=budget)
        text = page_text(dom)
        if "Model metrics" in text and "Auto-refresh" in text:
            break
    assert title_of(dom).startswith("Run "), (title_of(dom), text[:2000])
    assert "Auto-refresh" in text and run.info.run_name in text, text[:2000]  # the charts tab (its toolbar), of this run
    for genai in ("Token Usage", "Detect Issues", "No traces"):
        assert genai not in text, (genai, text[:2000])
    assert "compression" not in text, text[:3000]


def test_runs_are_named_by_their_overrides_and_a_sweep_by_what_it_sweeps(store, views, ui, tmp_path):
    from mlflow.tracking import MlflowClient

    _, uri, _, _ = store
    exp, singles, parent, children, stdout = views
    client = MlflowClient(tracking_uri=uri)
    names = [r.info.run_name for r in singles.values()]
    assert len(set(names)) == len(names), names
    for overrides, r in singles.items():
        for o in overrides.split():
            assert o in r.info.run_name, (o, r.info.run_name)
    assert parent.info.run_name == "sweep scheduler=gpipe,1f1b · compressor=none,fp16"
    assert len(children) == 4 and len({c.info.run_name for c in children}) == 4, [c.info.run_name for c in children]
    for c in children:
        name = c.info.run_name
        assert name.split()[0] == c.data.params["scheduler.name"] and f"compressor={c.data.params['compressor.name']}" in name, name
        assert constant_metrics(client, c) == [], name
    best = parent.data.tags["pipelab.best_child_name"]
    assert f"best: {best}: val/acc " in stdout and ui_links.experiment_url(ui_links.DEFAULT_UI, exp.experiment_id) in stdout, stdout[-2000:]

    for budget in (20_000, 40_000, 80_000):
        dom, _ = chromium(runs_table_url(ui, exp.experiment_id), tmp_path, budget_ms=budget)
        text = page_text(dom)
        if parent.info.run_name in text:
            break
    assert parent.info.run_name in text, text[:3000]
    for name in names:
        assert name in text, (name, text[:3000])
