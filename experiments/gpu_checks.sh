#!/usr/bin/env bash
# What a session lent a GPU runs first, as one command (a few minutes on an H100 or H200):
# the tests that need CUDA, with the tests of the code they exercise (replica batching, the
# replica bank, convolutions as matrix products, GPU model copies, checkpoints, every scheduler
# and compressor on the GPU), then the numerics-on-a-GPU benchmarks of docs/benchmarks.md's
# *Many replicas on a GPU* (item 5 of the scale issue): two epochs of FL and PiPar with 64 VGG-5 replicas
# (and the second alone), one at a time against batched on the same GPU, one batched step
# alone, and what the bank, the block copies and background checkpoint writes are each worth
# (bench_gpu_ablation.py). Run it alone on the machine; THREADS sets torch's CPU threads
# (default 16).
#
#     bash experiments/gpu_checks.sh            # tests, then benchmarks
#     bash experiments/gpu_checks.sh bench      # benchmarks only
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-16}"
python - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_checks.sh: no CUDA device here (the CUDA tests would only skip)")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
PY
if [ "${1:-all}" != bench ]; then
    # (the emulated-GPU cases run on every machine's CPU, in the ordinary suite)
    python -m pytest -q -m "" -p no:cacheprovider -k "not emulated" tests/test_replica_batching.py tests/test_replica_bank.py \
        tests/test_batched_conv.py tests/test_models.py tests/test_checkpoint_writer.py tests/test_resume.py \
        tests/test_every_scheduler_on_gpu.py
fi
python experiments/bench_replicas.py --threads "$threads" --repeats 3 --epochs 2 \
    --variants "timing-only,gpu,gpu batched,gpu batched grouped"
python experiments/bench_replica_step.py --threads "$threads"
python experiments/bench_gpu_ablation.py --threads "$threads" --repeats 3
