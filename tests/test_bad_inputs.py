"""Every bad input is one line, `error: <key>...: <what it takes>`, and exit status 2, before anything runs.

BAD_INPUTS holds each case: the arguments and the words its line must hold (the key, what it
accepts, a "did you mean"). Every row runs with BASE first (small, untracked, one short epoch), so
a case that were wrongly accepted would train quickly instead of failing the test by a timeout.

- Default suite: every row in this process, through `framework.config.input_errors.check_args` (what
  `python -m framework` checks before a run starts: the override syntax, the group options,
  Hydra's composition, `validate` and the build of every component); and a few rows through the
  real CLI, whose one line on stderr must be exactly the line `check_args` gives.
- `-m slow`: every row through the CLI.
- docs/bad_inputs.md is the table of every row and its line, as printed (written with Hydra's
  compose API, as the CLI composes); the default suite checks that it is current, which also
  checks the faster composition the default suite uses (`tests.conftest.cached_compose`) against it. Regenerate it
  with `python -m tests.test_bad_inputs --table`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from framework.errors import LINE_MAX

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "docs" / "bad_inputs.md"
BASE = ["tracking=none", "runtime.progress=false", "train.epochs=1", "train.iterations_per_epoch=2", "dataset.n_train=256", "dataset.n_val=64", "dataset.n_test=64"]
PIPAR = ["scheduler=pipar", "cluster=pipar_4g"]
MQTT = ["runtime=local", "transport=mqtt"]

BAD_INPUTS = [
    # ---- override syntax (Hydra's parser) ----
    (["=3"], ["=3", "needs a key", "train.lr=0.1"]),
    (["scheduler=["], ["scheduler=[", "cannot read", "key=[a,b]", "choices: 1f1b, adalearner,", "... and"]),
    (["train.lr", "0.1"], ["'train.lr' is not an override", "key=value", "no spaces"]),
    (["model=lenet,mlp"], ["model=lenet,mlp", "sweep", "-m"]),
    (["train.lr=0.1,0.01"], ["train.lr=0.1,0.01", "-m", "train.lr=[0.1,0.01]"]),
    (["cluster.links.dev0->dev1.bandwidth_bps=1e6"], ["cluster.links.dev0->dev1", "command line", "conf/cluster", "cluster.link.<key>"]),
    (["foo=1"], ["foo: no such key", "keys of the config", "train, seed"]),
    (["trian.lr=0.1"], ["trian: no such key", "did you mean train?"]),
    (["+train.lr=0.1"], ["train.lr", "'+' cannot add it", "train.lr=0.1"]),
    (["~train.lr"], ["train.lr", "cannot be deleted", "train.lr=<value>"]),
    (["train=3"], ["train", "not a group of keys", "train.epochs=..."]),
    (["+experiment=vgg5_pi4_wifi"], ["+experiment=vgg5_pi4_wifi", "without the '+'", "experiment=vgg5_pi4_wifi"]),
    (["experiment.name=x"], ["experiment.name", "config group of presets", "experiment=<name>", "vgg5_pi4_wifi"]),
    (["experiment=nope"], ["experiment=nope: no such experiment", "bubble_textbook", "vgg5_pi4_wifi"]),
    (["experiment=vgg5_pi4_wifi.yaml"], ["experiment=vgg5_pi4_wifi.yaml", "did you mean experiment=vgg5_pi4_wifi?"]),
    # ---- train ----
    (["train.lr=nan"], ["train.lr", "a number > 0", "nan"]),
    (["train.lr=inf"], ["train.lr", "a number > 0", "inf"]),
    (["train.lr=0"], ["train.lr", "a number > 0", "got 0"]),
    (["train.lr="], ["train.lr", "no value given", "a number > 0", "default 0.05"]),
    (["train.lr=[1,2]"], ["train.lr", "'[1,2]' is not a number", "a number > 0"]),
    (["train.lr=${oops}"], ["train.lr", "cannot resolve", "oops"]),
    (["train.lrr=0.1"], ["train.lrr: no such key", "did you mean train.lr?"]),
    (["+train.epoch=3"], ["train.epoch: no such key", "did you mean train.epochs"]),
    (["+train.epoch=3", "--cfg", "job"], ["train.epoch: no such key", "did you mean train.epochs"]),  # --cfg checks what a run checks
    (["train.momentum=-1"], ["train.momentum", "[0, 1)", "-1"]),
    (["train.on_nonfinite=sometimes"], ["train.on_nonfinite", "'sometimes' is not a choice", "fail, warn, ignore"]),
    (["train.momentum=1"], ["train.momentum", "[0, 1)", "got 1"]),
    (["train.weight_decay=-0.5"], ["train.weight_decay", ">= 0", "-0.5"]),
    (["train.weight_decay=inf"], ["train.weight_decay", ">= 0", "inf"]),
    (["train.epochs=two"], ["train.epochs", "'two' is not an integer", "an integer >= 0"]),
    (["train.epochs=-1"], ["train.epochs", "an integer >= 0", "-1"]),
    (["train.batch_size=0"], ["train.batch_size", "an integer >= 1", "got 0"]),
    (["train.optimizer=adamw"], ["train.optimizer", "'adamw'", "sgd, adam"]),
    (["train.checkpoint=maybe"], ["train.checkpoint", "'maybe'", "true or false"]),
    (["train.resume=/nonexistent/run"], ["train.resume", "/nonexistent/run", "not a run directory"]),
    # ---- seed ----
    (["seed=abc"], ["seed", "'abc' is not an integer", "0..2**63-1"]),
    (["seed=-1"], ["seed", "0..2**63-1", "-1"]),
    # ---- model ----
    (["model.depth=3"], ["model.depth", "model=lenet has no key depth", "model=mlp has it"]),
    (["model=LeNet"], ["model=LeNet: no such model", "did you mean model=lenet?"]),
    (["model.name=lenett"], ["model.name", "'lenett'", "did you mean lenet?"]),
    (["model=mlp", "model.depth=1"], ["model.depth", "at least 2 units"]),
    (["model=mlp", "model.hidden=-5"], ["model.hidden", "-5", "positive"]),
    (["model=har_cnn", "dataset=synthetic_har", "model.dropout=1.5"], ["model.dropout", "1.5", "[0, 1)"]),
    (["model=lenet", "dataset=synthetic_har"], ["model.name", "lenet needs image input", "(9, 128)"]),
    (["model=vgg5", "model.batchnorm=maybe"], ["model.batchnorm", "'maybe'", "true or false"]),
    # ---- dataset ----
    (["dataset=synthetic_minst"], ["dataset=synthetic_minst", "did you mean dataset=synthetic_mnist?"]),
    (["dataset.n_train=0"], ["dataset.n_train", ">= 1"]),
    (["dataset.n_val=-1"], ["dataset.n_val", ">= 0", "-1"]),
    (["dataset.noise=nan"], ["dataset.noise", "finite", "nan"]),
    (["dataset.prototypes=0"], ["dataset.prototypes", ">= 1", "got 0"]),
    (["dataset.seed=-5"], ["dataset.seed", "0..2**63-1", "-5"]),
    (["dataset=fashion_mnist", "dataset.root=/nonexistent/fmnist"], ["dataset.root", "/nonexistent/fmnist", "dataset-fashion-mnist"]),
    (["dataset.num_classes=1"], ["dataset.num_classes", "an integer >= 2", "got 1"]),
    (["dataset.grid=0"], ["dataset.grid", "an integer >= 1", "got 0"]),
    (["dataset.max_shift=-1"], ["dataset.max_shift", "an integer >= 0", "-1"]),
    (["dataset.amplitude_jitter=-1"], ["dataset.amplitude_jitter", "[0, 1)", "-1"]),
    # ---- cluster: devices, links, traces ----
    (["cluster=pi4_wlan"], ["cluster=pi4_wlan: no such cluster", "did you mean cluster=pi4_wifi?"]),
    (["cluster.num_devices=0"], ["cluster.num_devices", ">= 1", "got 0"]),
    (["cluster.num_devices=1"], ["cluster.num_devices", "scheduler=gpipe", "at least 2 stages", "scheduler=local"]),
    (["cluster.device.flops_per_s=0"], ["cluster.device.flops_per_s", "a number > 0", "got 0"]),
    (["cluster.device.slowdown=-2"], ["cluster.device.slowdown", "a number > 0", "-2"]),
    (["cluster.device.slowdown=inf"], ["cluster.device.slowdown", "a number > 0", "inf"]),
    (["cluster.device.time_model=fast"], ["cluster.device.time_model", "'fast'", "analytic, profile, measured"]),
    (["cluster.device.table=nonexistent_table"], ["cluster.device.table", "'nonexistent_table'", "accept_mobilenetv2_b128", "conf/profile_tables"]),
    (["cluster.device.forward_fraction=1.5"], ["cluster.device.forward_fraction", "(0, 1)", "1.5"]),
    (["cluster.device.slots=0"], ["cluster.device.slots", "an integer >= 1", "got 0"]),
    ([*PIPAR, "cluster.devices.server.cores=0"], ["cluster.devices.server.cores", "an integer >= 1", "got 0"]),
    ([*PIPAR, "+cluster.devices.server.slots=2"], ["cluster.devices.server.cores", "processor sharing", "FIFO slots", "set one of them"]),
    (["cluster.device.memory_bytes=0"], ["cluster.device.memory_bytes", "> 0 or null", "got 0"]),
    (["cluster.device.call_overhead_s=-0.1"], ["cluster.device.call_overhead_s", ">= 0", "-0.1"]),
    (["cluster.device.weight_bytes_per_s=0"], ["cluster.device.weight_bytes_per_s", "> 0", ".inf = free", "got 0"]),
    (["cluster.device.kind_factors.norm=-1"], ["cluster.device.kind_factors.norm", ">= 0", "-1"]),
    (["cluster.device.trace=[[0,0]]"], ["cluster.device.trace[0]", "[t_s, factor]", "factor > 0"]),
    (["cluster.devices.dev9.slowdown=2"], ["cluster.devices.dev9: no such device", "dev0, dev1, server", "cluster.num_devices=10", "+cluster.devices.dev9.slowdown=2"]),
    (["cluster.devices.dev1.slowdown=2"], ["cluster.devices.dev1", "'+' adds its entry", "+cluster.devices.dev1.slowdown=2"]),
    (["+cluster.devices.dev5.slowdown=2"], ["cluster.devices.dev5", "no such device", "dev0..dev1"]),
    ([*PIPAR, "cluster.devices.server.slowdown=0"], ["cluster.devices.server.slowdown", "a number > 0", "got 0"]),
    (["cluster.link.bandwidth_bps=0"], ["cluster.link.bandwidth_bps", "> 0 or .inf", "got 0"]),
    (["cluster.link.latency_s=nan"], ["cluster.link.latency_s", ">= 0", "nan"]),
    (["cluster.link.loss=1"], ["cluster.link.loss", "[0, 1)", "got 1"]),
    (["cluster.link.retransmit_timeout_s=0"], ["cluster.link.retransmit_timeout_s", "> 0", "got 0"]),
    (["cluster.link.trace=[[0,-1]]"], ["cluster.link.trace[0]", "[t_s, bandwidth_bps]", "> 0 bit/s or .inf"]),
    # ---- scheduler: pipelines ----
    (["scheduler=nope"], ["scheduler=nope", "gpipe", "1f1b", "pipedream", "local"]),
    (["scheduler.microbatches=abc"], ["scheduler.microbatches", "'abc' is not an integer", "an integer >= 1"]),
    (["scheduler.microbatchs=4"], ["scheduler.microbatchs", "did you mean scheduler.microbatches?"]),
    (["scheduler.microbatches=128", "train.batch_size=64"], ["scheduler.microbatches", "128", "at most 64"]),
    (["scheduler.stages=1"], ["scheduler.stages", "at least 2 stages", "scheduler=local"]),
    (["model=lenet", "cluster=uniform", "cluster.num_devices=8"], ["scheduler.stages", "8 stages", "5 units"]),
    (["cluster=uniform", "cluster.num_devices=3", "scheduler.partition=[2,1]"], ["scheduler.partition", "strictly increasing"]),
    (["scheduler.partition=[1,2]"], ["scheduler.partition", "2 cut indices", "give 1"]),
    (["scheduler.partition=uneven"], ["scheduler.partition", "'uneven'", "even, or a list of cut indices"]),
    (["scheduler.repartition=[[0,[2]]]"], ["scheduler.repartition[0]", "[epoch >= 1, cuts]"]),
    (["scheduler.replan_epsilon=-0.1"], ["scheduler.replan_epsilon", "must be > 0"]),
    (["scheduler.replan_epsilon=0.15", "scheduler.partition=[2]"], ["scheduler.replan_epsilon", "fixes the cuts", "dp, even, search"]),
    (["scheduler=pipedream", "scheduler.in_flight=0"], ["scheduler.in_flight", "at least 1", "got 0"]),
    (["scheduler.P=2"], ["scheduler.P", "scheduler=gpipe has no key P", "scheduler=fl, pipar, sfl, sl have it"]),
    # ---- scheduler: AdaLearner ----
    (["scheduler=adalearner", "cluster=uniform"], ["scheduler.group_owner", "no device 'go'", "cluster=adalearner_wlan"]),
    (["experiment=adalearner", "scheduler.workers=0"], ["scheduler.workers", "1..8", "got 0"]),
    (["experiment=adalearner", "scheduler.architecture=2bit"], ["scheduler.architecture", "auto, fp32, onebit"]),
    (["experiment=adalearner", "scheduler.partition=table"], ["scheduler.partition", "linear, lookup_table"]),
    (["experiment=adalearner", "compressor=none", "scheduler.architecture=onebit"], ["scheduler.architecture", "compressor=onebit_ef"]),
    (["experiment=adalearner", "model=vgg5"], ["model", "running statistics", "model.batchnorm=false"]),
    # ---- scheduler: PiPar, FL, SFL, SL ----
    ([*PIPAR, "scheduler.shard=dirichlet", "scheduler.dirichlet_alpha=-1"], ["scheduler.dirichlet_alpha", "> 0", "-1"]),
    ([*PIPAR, "scheduler.N=0"], ["scheduler.N", "1..train.batch_size=64", "got 0"]),
    ([*PIPAR, "scheduler.P=99"], ["scheduler.P", "1..5", "got 99"]),
    (["experiment=feature_replay_pi", "scheduler.staleness_policy=lazy"], ["scheduler.staleness_policy", "block, fixed, group, discard"]),
    (["experiment=feature_replay_pi", "scheduler.cut=40"], ["scheduler.cut", "1..19", "got 40"]),
    (["experiment=feature_replay_pi", "cluster.device.table_device=jetson"], ["cluster.devices.dev0.table_device", "pi4b, tx2, rtx2080ti"]),
    (["experiment=feature_replay_pi", "model=vgg5"], ["cluster.devices.dev0.table", "19-unit resnet50", "5 units"]),
    (["scheduler=feature_replay", "scheduler.cloud_device=gpu"], ["scheduler.cloud_device", "no device 'gpu'", "server"]),
    ([*PIPAR, "scheduler.select=fast"], ["scheduler.select", "'fast'", "auto, paper, exhaustive, refine"]),
    ([*PIPAR, "scheduler.microbatches=4"], ["scheduler.microbatches", "scheduler.N", "leave microbatches at 1"]),
    ([*PIPAR, "scheduler.dp_sigma=nan"], ["scheduler.dp_sigma", "finite", "nan"]),
    ([*PIPAR, "scheduler.failures=[[9,0]]"], ["scheduler.failures[0]", "[9, 0]", "device in 0..3"]),
    (["scheduler=pipar", "cluster=uniform"], ["cluster", "scheduler=pipar needs a device named 'server'", "cluster=pipar_4g"]),
    (["cluster=uniform", "cluster.num_devices=100000", "scheduler=fl"], ["cluster", "needs a device named 'server'", "dev0..dev99999", "cluster.devices.server"]),
    (["scheduler=fl", "cluster=pipar_4g", "scheduler.aggregate_every=0"], ["scheduler.aggregate_every", ">= 1", "got 0"]),
    (["scheduler=sfl", "cluster=pipar_4g", "scheduler.server_model=both"], ["scheduler.server_model", "'both'", "per_device, shared"]),
    (["scheduler=sl", "cluster=pipar_4g", "scheduler.N=4"], ["scheduler.N", "sl trains one batch at a time"]),
    # ---- compressor ----
    (["compressor=zip"], ["compressor=zip: no such compressor", "mbq", "uniform"]),
    (["compressor=uniform", "compressor.init_scale=0"], ["compressor.init_scale", "> 0", "got 0"]),
    (["compressor=uniform", "compressor.scale_lr=-0.1"], ["compressor.scale_lr", ">= 0", "-0.1"]),
    (["compressor=mbq", "compressor.forward.bits=7"], ["compressor.forward.bits", "1, 2, 3, 4", "7"]),
    (["compressor=mbq", "compressor.backward.codec=zip"], ["compressor.backward.codec", "zip", "stochastic_uniform"]),
    (["compressor.forward.bitz=2"], ["compressor.forward.bitz", "did you mean compressor.forward.bits?"]),
    (["compressor=mbq", "compressor.forward.schedule=[[0]]"], ["compressor.forward.schedule", "[epoch, bits] pairs"]),
    (["compressor.time.scale=-1"], ["compressor.time.scale", "a number > 0", "-1"]),
    # ---- predictor ----
    (["predictor=oracel"], ["predictor=oracel", "did you mean predictor=oracle?"]),
    (["predictor=flops", "predictor.flops_per_s=0"], ["predictor.flops_per_s", "> 0", "got 0"]),
    # ---- transport ----
    (["transport=mqtt"], ["transport", "transport=mqtt is ignored by runtime=sim", "runtime=local"]),
    ([*MQTT, "transport.broker.port=99999"], ["transport.broker.port", "65535", "99999"]),
    ([*MQTT, "transport.broker.port=abc"], ["transport.broker.port", "'abc' is not an integer", "0..65535"]),
    ([*MQTT, "transport.chunk_bytes=10"], ["transport.chunk_bytes", "between 1024 and 2**30", "got 10"]),
    ([*MQTT, "transport.connect_timeout_s=inf"], ["transport.connect_timeout_s", "finite", "inf"]),
    ([*MQTT, "transport.connect_timeout_s=0"], ["transport.connect_timeout_s", "> 0", "got 0"]),
    ([*MQTT, "transport.reconnect_initial_s=0"], ["transport.reconnect_initial_s", "> 0", "got 0"]),
    ([*MQTT, "transport.reconnect_max_s=-1"], ["transport.reconnect_max_s", "> 0", "-1"]),
    ([*MQTT, "transport.reconnect_max_s=0.05"], ["transport.reconnect_max_s", ">= transport.reconnect_initial_s=0.1", "0.05"]),
    ([*MQTT, "transport.reconnect_timeout_s=0"], ["transport.reconnect_timeout_s", "> 0", "got 0"]),
    ([*MQTT, "transport.credentials_file=/nonexistent"], ["transport.credentials_file", "runtime=local hands every role its credentials", "framework.worker", "leave it null"]),
    # ---- runtime ----
    (["runtime=lcoal"], ["runtime=lcoal: no such runtime", "did you mean runtime=local?"]),
    (["runtime=local"], ["transport.name", "runtime=local needs a network transport", "transport=mqtt"]),
    (["runtime.dtype=float16"], ["runtime.dtype", "'float16'", "float32, float64"]),
    (["runtime.threads=0"], ["runtime.threads", ">= 1", "got 0"]),
    (["runtime.torch_device=gpu"], ["runtime.torch_device", "'gpu'", "cpu, cuda, cuda:<n>"]),
    (["runtime.torch_device=cuda", "runtime.numerics=false"], ["runtime.torch_device", "timing-only"]),
    (["runtime.tf32=true"], ["runtime.tf32", "runtime.torch_device=cpu runs none", "runtime.torch_device=cuda"]),
    (["runtime.torch_device=cuda", "runtime.tf32=true", "runtime.dtype=float64"], ["runtime.tf32", "runtime.dtype=float64", "float32"]),
    (["runtime.replica_conv=im2col"], ["runtime.replica_conv", "'im2col'", "matmul, grouped"]),
    (["runtime.replica_conv=matmul"], ["runtime.replica_conv", "none are batched", "runtime.batch_replicas=null is off on cpu"]),
    (["runtime.replica_conv=grouped", "runtime.batch_replicas=true", "runtime.numerics=false"], ["runtime.replica_conv", "timing-only", "runtime.numerics=false"]),
    (["runtime.emulate_links=true"], ["runtime.emulate_links", "runtime=sim has no key emulate_links", "runtime=local, remote have it"]),
    ([*MQTT, "runtime.join_timeout_s=0"], ["runtime.join_timeout_s", "> 0", "got 0"]),
    ([*MQTT, "runtime.python=/nonexistent/python"], ["runtime.python", "/nonexistent/python", "not an executable"]),
    # ---- tracking ----
    (["tracking=mlflow", "tracking.uri=notascheme://x"], ["tracking.uri", "notascheme", "sqlite:///"]),
    (["tracking=mlflow", "tracking.experiment="], ["tracking.experiment", "non-empty"]),
    (["tracking.flush_every=0"], ["tracking.flush_every", ">= 1", "got 0"]),
    (["tracking.optimized_direction=up"], ["tracking.optimized_direction", "'up'", "max, min"]),
    (["tracking.metric_floor.min=nan"], ["tracking.metric_floor.min", "finite", "nan"]),
    (["tracking.optimized_metric=val/accuracy"], ["tracking.optimized_metric", "'val/accuracy' is not a metric", "did you mean val/acc?", "time/epoch_virtual_s", "more"]),
    (["tracking.metric_floor.metric=accuracy", "tracking.metric_floor.min=0.5"], ["tracking.metric_floor.metric", "'accuracy' is not a metric", "val/acc"]),
]

# rows also run through the real CLI in the default suite, side by side: one per place a line
# comes from (the override check before Hydra, Hydra's composition, the job's build: validate and
# the plugins' own checks)
CLI_ROWS = [["=3"], ["train.epochs=two"], [*PIPAR, "scheduler.shard=dirichlet", "scheduler.dirichlet_alpha=-1"], ["+train.epoch=3", "--cfg", "job"]]


def row_id(args) -> str:
    return " ".join(args)


def start_cli(args, cwd, env_extra=None, flags=()) -> subprocess.Popen:
    """`python -m framework <flags> BASE <args>` (Hydra's flags first: its parser takes the
    overrides as one run of arguments)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, "-m", "framework", *flags, *BASE, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def cli(args, cwd, env_extra=None, flags=()) -> subprocess.CompletedProcess:
    proc = start_cli(args, cwd, env_extra, flags)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cell(text: str) -> str:
    """`text` in a Markdown table cell's code span (`` ... ``: a backtick inside is fine)."""
    return text.replace("|", "\\|")


def documented() -> dict[str, str]:
    """docs/bad_inputs.md as {input: line}."""
    out = {}
    for line in TABLE.read_text().splitlines() if TABLE.exists() else []:
        cells = line.strip().strip("|").split(" | ")
        if line.startswith("| `") and len(cells) == 2:
            given, said = (c.strip().removeprefix("`` ").removesuffix(" ``").replace("\\|", "|") for c in cells)
            out[given] = said
    return out


@pytest.fixture(scope="module")
def table():
    return documented()


def test_enough_rows_and_every_group():
    assert len(BAD_INPUTS) >= 60 and len({row_id(a) for a, _ in BAD_INPUTS}) == len(BAD_INPUTS)
    keys = " ".join(n for _, needles in BAD_INPUTS for n in needles)
    for group in ("model", "dataset", "cluster.device", "cluster.devices", "cluster.link", "scheduler", "compressor", "predictor", "transport", "runtime", "tracking", "train", "seed", "experiment"):
        assert group in keys, group


@pytest.mark.parametrize("args,needles", BAD_INPUTS, ids=[row_id(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_naming_the_key(table, args, needles):
    from framework.config.input_errors import check_args
    from tests.conftest import cached_compose

    line = check_args(BASE + args, cached_compose)
    assert line is not None, f"{args} was accepted"
    assert "\n" not in line and "Traceback" not in line, line
    for n in needles:
        assert n in line, (n, line)
    assert len(f"error: {line}") <= LINE_MAX and "more characters]" not in line, f"a line of {len(line)} characters (or cut by the guard): say less at its source ({line[:80]}...)"
    assert table.get(row_id(args)) == f"error: {line}", f"docs/bad_inputs.md is stale for {row_id(args)!r}: python -m tests.test_bad_inputs --table"


def test_every_documented_line_fits_one_line(table):
    """Each line of docs/bad_inputs.md is at most LINE_MAX characters, said in full at its source
    (not cut by the guard in framework.errors.one_line)."""
    assert len(table) == len(BAD_INPUTS)
    long = {given: len(said) for given, said in table.items() if len(said) > LINE_MAX or "more characters]" in said}
    assert not long, long


def test_long_lists_are_summarised():
    """A list in a message names runs of numbered names as a range and stops after a few; the
    guard cuts whatever line is still too long, at a word, and says how much it cut."""
    from framework.errors import listing, one_line

    assert listing([f"dev{i}" for i in range(100_000)] + ["server"]) == "dev0..dev99999, server"
    assert listing(["dev0", "dev1", "server"]) == "dev0, dev1, server"  # two are no run
    assert listing(["dev0", "dev2", "dev3", "dev4", "x1"]) == "dev0, dev2..dev4, x1"
    assert listing("abcdefghij", most=4) == "a, b, c, ... and 7 more"
    text = "cluster: the devices are " + ", ".join(f"host{i * 7}" for i in range(100_000))
    cut = one_line(text)
    assert len("error: " + cut) <= LINE_MAX and cut.startswith("cluster: the devices are host0, host7") and cut.endswith(f"[{len(text) - cut.index(' ... [')} more characters]"), cut
    assert one_line("short") == "short" and one_line("a traceback\n" + "x" * 1000).endswith("x" * 1000)  # a report of several lines is kept


def _user_cluster(root: Path, text: str) -> Path:
    (root / "cluster").mkdir(parents=True)
    (root / "cluster" / "mine.yaml").write_text(text)
    return root


MINE = """\
# a cluster of the user's own, outside the repo
defaults:
  - /schema/cluster/base@_here_
  - _self_
name: mine
num_devices: 2
device:
  flops_per_s: 2.0e9
link:
  bandwidth_bps: 1.0e8
  latency_s: 0.001
"""


def test_a_users_config_folder_adds_options(tmp_path):
    """A cluster of the user's own, in a folder given with --config-dir or hydra.searchpath, is
    an option like the shipped ones: chosen, listed among the choices, and run."""
    from framework.config.input_errors import check_args

    conf = _user_cluster(tmp_path / "my conf", MINE)  # a space in the path, quoted for Hydra
    by_dir, by_path = ["--config-dir", str(conf)], [f"hydra.searchpath=['file://{conf}']"]
    for extra in (by_dir, by_path):
        assert check_args([*extra, *BASE, "cluster=mine"]) is None, extra
        assert check_args([*extra, *BASE, "cluster=mine", "cluster.num_devices=0"]) == "cluster.num_devices: must be an integer >= 1, got 0"
        line = check_args([*extra, *BASE, "cluster=mien"])
        assert line.startswith("cluster=mien: no such cluster (did you mean cluster=mine?); choices: ") and "mine, pi4_wifi" in line, line
    assert check_args(["--config-dir", str(tmp_path / "nowhere"), *BASE, "cluster=mine"]).startswith(f"--config-dir: {tmp_path / 'nowhere'} is not a folder")
    procs = [subprocess.Popen([sys.executable, "-m", "framework", *extra, *BASE, "cluster=mine", f"hydra.run.dir={tmp_path / str(i)}"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
             for i, extra in enumerate((by_dir, by_path))]
    for i, proc in enumerate(procs):  # side by side: each is mostly start-up
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "val/acc" in out, (out, err)
        ran = yaml.safe_load((tmp_path / str(i) / ".hydra" / "config.yaml").read_text())["cluster"]
        assert ran["name"] == "mine" and ran["device"]["flops_per_s"] == 2.0e9
        assert json.loads((tmp_path / str(i) / "summary.json").read_text())["iterations"] == 2


def test_a_users_config_file_that_is_not_yaml_is_named_with_its_line(tmp_path):
    from framework.config.input_errors import check_args

    conf = _user_cluster(tmp_path / "conf", MINE.replace("num_devices: 2", "num_devices: [2"))
    for extra in (["--config-dir", str(conf)], [f"hydra.searchpath=[file://{conf}]"]):
        line = check_args([*extra, *BASE, "cluster=mine"])
        assert line.startswith(f"cluster=mine: {conf / 'cluster' / 'mine.yaml'}, line 7, column 7: not valid YAML: expected ',' or ']'"), line
        assert "line 6" in line and "no such cluster" not in line, line  # where the open list starts
    res = cli(["cluster=mine"], tmp_path, flags=["--config-dir", str(conf)])
    assert res.returncode == 2 and res.stderr.strip() == "error: " + check_args(["--config-dir", str(conf), *BASE, "cluster=mine"]), res.stderr


def _assert_cli_line(res, args):
    from framework.config.input_errors import check_args

    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert res.stdout == "", res.stdout
    assert err == "error: " + check_args(BASE + args)


def test_cli_prints_the_same_one_line(tmp_path):
    procs = [start_cli(args, tmp_path) for args in CLI_ROWS]  # side by side: each is mostly start-up
    for args, proc in zip(CLI_ROWS, procs):
        out, err = proc.communicate(timeout=300)
        _assert_cli_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), args)
    assert not any(tmp_path.rglob("summary.json")), "a bad input started a run"


def test_cfg_checks_what_a_run_checks(tmp_path):
    """`--cfg job|hydra|all` prints only a config a run would start with: bad input is the run's
    one line and exit 2, whether validate refuses it (a bad value) or a plugin's build does
    (`model.hidden=-5`: framework.config.preflight), with nothing on stdout. A good config is
    printed, exit 0. `--info` stays Hydra's view of how a config came to be, even a refused one."""
    refused = [(["train.lr=0"], ["--cfg", "hydra"]), (["model=mlp", "model.hidden=-5"], ["--cfg=all"]), (["model=mlp", "model.hidden=-5"], ["-c", "job"])]
    good, info = ["scheduler=1f1b"], ["model=mlp", "model.hidden=-5"]
    procs = [start_cli(args, tmp_path, flags=flags) for args, flags in refused]  # side by side: each is mostly start-up
    procs += [start_cli(good, tmp_path, flags=["--cfg", "job"]), start_cli(info, tmp_path, flags=["--info", "config"])]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    for (args, _), res in zip(refused, done):
        _assert_cli_line(res, args)
    shown, inspected = done[len(refused):]
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    printed = yaml.safe_load(shown.stdout)
    assert printed["scheduler"]["name"] == "1f1b" and printed["train"]["epochs"] == 1 and "hydra" not in printed
    assert inspected.returncode == 0 and "hidden: -5" in inspected.stdout, inspected.stderr[-2000:]
    assert not any(tmp_path.rglob("summary.json")), "--cfg started a run"


@pytest.mark.parametrize("args,needles", [(["=3"], ["=3: an override needs a key"]), (["transport.brokr.port=1"], ["transport.brokr", "did you mean transport.broker?"])])
def test_worker_bad_input_is_one_line(capsys, args, needles):
    """`python -m framework.worker` (a role joining from another machine) says bad input the same way."""
    from framework import worker

    assert worker.main(["role=stage0", "runtime.run_id=r1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and all(n in err for n in needles), err


@pytest.mark.slow
@pytest.mark.parametrize("args,needles", BAD_INPUTS, ids=[row_id(a) for a, _ in BAD_INPUTS])
def test_cli_every_bad_input(tmp_path, args, needles):
    res = cli(args, tmp_path)
    _assert_cli_line(res, args)
    for n in needles:
        assert n in res.stderr, (n, res.stderr)


@pytest.mark.slow
def test_hydra_full_error_keeps_the_trace(tmp_path):
    res = cli(["model.depth=3"], tmp_path, {"HYDRA_FULL_ERROR": "1"})
    assert res.returncode == 1 and "Traceback" in res.stderr and "ConfigCompositionException" in res.stderr, res.stderr


@pytest.mark.slow
def test_an_exception_in_the_run_keeps_its_trace(tmp_path):
    """A bug is not bad input: an exception the run raises is shown with its stack trace, even one
    of the kinds Hydra's composition raises (here OmegaConf's, for a key the code misspells)."""
    code = "import sys; import framework.job as j; j.Job.__init__ = lambda self, cfg, *a, **k: cfg.train.no_such_key; sys.argv[0] = 'framework'; from framework.cli import main; main()"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HYDRA_FULL_ERROR", None)
    res = subprocess.run([sys.executable, "-c", code, *BASE], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1 and "Traceback" in res.stderr and "ConfigAttributeError" in res.stderr and "error:" not in res.stderr, res.stderr


def write_table(path: Path = TABLE) -> None:
    """docs/bad_inputs.md: every row of BAD_INPUTS and the line `python -m framework` prints for it."""
    from framework.config.input_errors import check_args

    rows = []
    for args, _ in BAD_INPUTS:  # composed as the CLI composes (Hydra's compose API, no cache)
        line = check_args(BASE + args)
        rows.append(f"| `` {cell(row_id(args))} `` | `` error: {cell(str(line))} `` |")
    head = [
        "# Bad input: one line each",
        "",
        "Generated by `python -m tests.test_bad_inputs --table` from `BAD_INPUTS` in tests/test_bad_inputs.py;",
        "the test suite checks every row (and that this file is current). Each input ran as",
        f"`python -m framework {' '.join(BASE)} <input>`; the message is the one line on stderr, exit status 2.",
        "",
        f"{len(rows)} inputs.",
        "",
        "| input | message |",
        "|---|---|",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(head + rows) + "\n")


if __name__ == "__main__":
    if "--table" in sys.argv[1:]:
        write_table()
        print(f"wrote {TABLE.relative_to(REPO)} ({len(BAD_INPUTS)} rows)")
    else:
        print("usage: python -m tests.test_bad_inputs --table", file=sys.stderr)
        sys.exit(2)
