"""Start-up: listing plugins, --help and rejecting a bad override import no torch (declared
plugins, framework.registry.declare); every declared plugin's code is there when it is built."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_cli_and_tracking import REPO

PROBE = """
import sys
sys.argv = ["framework", *sys.argv[1:]]
from framework.cli import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "mlflow", "numpy", "matplotlib", "aiomqtt") if m in sys.modules)
print("HEAVY:" + ",".join(heavy), file=sys.stderr)
"""


BAD = [["scheduler=nope"], ["train.epochs=two"], ["scheduler.microbatchs=4"], ["+train.epoch=3"], ["scheduler.microbatches=128", "train.batch_size=64"], ["+train.epoch=3", "--cfg", "job"]]


@pytest.mark.parametrize("args", [["--plugins"], ["--help"], *BAD], ids=["plugins", "help", "bad-option", "bad-value", "unknown-key", "added-key", "cross-field", "cfg-added-key"])
def test_listing_help_and_bad_input_import_no_torch(args):
    res = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    heavy = [line for line in res.stderr.splitlines() if line.startswith("HEAVY:")]
    assert heavy == ["HEAVY:"], res.stderr[-2000:]
    if args == ["--plugins"]:
        assert "gpipe" in res.stdout and "mqtt" in res.stdout and "synthetic_mnist" in res.stdout
    if args == ["--help"]:
        assert "== Config groups ==" in res.stdout and "scheduler: " in res.stdout and "train:" in res.stdout
    if args in BAD:  # rejected in one line, by the core's checks (framework.config.validate), before torch
        assert "error:" in res.stderr and "Traceback" not in res.stderr


def test_every_declared_plugin_resolves_to_its_code():
    from framework import registry

    for group in registry.GROUPS:
        for name in registry.names(group):
            e = registry.entry(group, name)
            assert callable(e.factory), (group, name)
            assert e.doc, (group, name)


def test_a_declared_plugin_with_a_wrong_target_names_it():
    from framework import registry
    from framework.errors import PipelabError

    registry.declare("predictor", "zz_missing", "plugins.no_such_module:Thing", doc="test")
    try:
        with pytest.raises(PipelabError, match=r"predictor 'zz_missing': cannot import plugins.no_such_module:Thing"):
            registry.entry("predictor", "zz_missing")
    finally:
        registry._REGISTRY["predictor"].pop("zz_missing", None)


def test_codecs_are_found_without_importing_their_modules_first():
    """Codecs live in plugins imported on first lookup (registry.defer_import)."""
    code = "from framework.codec import codec_class, codec_names; print(codec_class('mbq').name, 'onebit' in codec_names())"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["mbq", "True"], res.stderr[-2000:]


@pytest.mark.parametrize("momentum,weight_decay,nesterov", [(0.0, 0.0, False), (0.9, 5e-4, False), (0.9, 1e-3, True)])
def test_lean_sgd_is_torch_sgd_bit_for_bit(momentum, weight_decay, nesterov):
    import torch

    from framework.lean_torch import SGD

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    ours = SGD(a.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    ref = torch.optim.SGD(b.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    for step in range(5):
        x, y = torch.randn(8, 6), torch.randint(3, (8,))
        for m, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    sa, sb = ours.state_dict(), ref.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert all(torch.equal(sa["state"][k].get("momentum_buffer", torch.zeros(0)), sb["state"][k].get("momentum_buffer", torch.zeros(0))) for k in sb["state"])


def test_a_training_run_never_imports_the_compiler(tmp_path):
    """torch.optim would import torch._dynamo (2-7 s) at the first optimizer, and a pipeline
    stage's backward from a given gradient sympy (0.5 s; framework/lean_torch.py)."""
    code = PROBE.replace('("torch", "mlflow", "numpy", "matplotlib", "aiomqtt")', '("torch._dynamo", "sympy")')
    args = ["tracking=none", "train.epochs=1", "train.iterations_per_epoch=2", "runtime.progress=false", "dataset.n_train=64", "dataset.n_val=32",
            "dataset.n_test=32", f"hydra.run.dir={tmp_path / 'run'}"]
    res = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "gpipe:" in res.stdout, res.stderr[-2000:]
    assert [line for line in res.stderr.splitlines() if line.startswith("HEAVY:")] == ["HEAVY:"], res.stderr[-2000:]


def test_numba_is_imported_only_by_runs_that_encode(tmp_path):
    """The compiled codec kernels (plugins/compressors/kernels.py) load at the first encode: a
    timing-only run with a compressor counts bytes without them; a training run uses them."""
    code = PROBE.replace('("torch", "mlflow", "numpy", "matplotlib", "aiomqtt")', '("numba",)')
    base = ["tracking=none", "train.epochs=1", "train.iterations_per_epoch=2", "runtime.progress=false", "dataset.n_train=64", "dataset.n_val=32",
            "dataset.n_test=32", "compressor=mbq"]
    seen, procs = {}, {}
    for numerics in ("false", "true"):  # both at once: each process's start-up is most of its time
        args = [*base, f"runtime.numerics={numerics}", f"hydra.run.dir={tmp_path / numerics}"]
        procs[numerics] = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for numerics, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert "gpipe:" in out, err[-2000:]
        seen[numerics] = [line for line in err.splitlines() if line.startswith("HEAVY:")]
    assert seen == {"false": ["HEAVY:"], "true": ["HEAVY:numba"]}


def test_hydra_composes_once_unless_the_mode_may_be_set(monkeypatch, tmp_path):
    """The compose Hydra does only to read `hydra.mode` is skipped, except where the mode may be
    set: on the command line, in another config folder, or by a YAML file in conf/."""
    from hydra._internal.hydra import Hydra

    from framework import cli

    real = Hydra.get_mode
    monkeypatch.setattr(Hydra, "get_mode", real)  # restored after the test
    for args in (["hydra.mode=MULTIRUN", "scheduler=gpipe"], ["-cd", str(tmp_path)], ["--config-name=other"], ["hydra.searchpath=[file://x]"]):
        cli._skip_hydra_mode_compose(args)
        assert Hydra.get_mode is real, args
    (tmp_path / "sweep.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    monkeypatch.setattr(cli, "CONF_DIR", str(tmp_path))
    cli._skip_hydra_mode_compose(["scheduler=gpipe"])
    assert Hydra.get_mode is real
    monkeypatch.setattr(cli, "CONF_DIR", str(REPO / "conf"))
    cli._skip_hydra_mode_compose(["scheduler=gpipe", "-m"])
    assert Hydra.get_mode is not real and Hydra.get_mode(None, "config", []) is None
