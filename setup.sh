#!/usr/bin/env bash
# Install everything pipelab needs on a fresh machine (Debian/Ubuntu or anything with pip).
#   bash setup.sh            # system packages where possible, then the Python package
# System packages: mosquitto (MQTT broker for transport tests) and Debian's Fashion-MNIST.
# Torch is pinned through constraints.txt so pip never pulls a multi-gigabyte CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
  echo "== system packages (apt): mosquitto dataset-fashion-mnist"
  $SUDO apt-get update -qq || echo "warning: apt-get update failed; trying the install anyway" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto dataset-fashion-mnist \
    || echo "warning: apt-get could not install mosquitto/dataset-fashion-mnist; MQTT and Fashion-MNIST tests will be skipped" >&2
elif command -v brew >/dev/null 2>&1; then
  brew install mosquitto || echo "warning: brew could not install mosquitto" >&2
else
  echo "note: no apt-get/brew with root rights here: install mosquitto yourself for the MQTT transport" >&2
fi

echo "== python packages (pip, torch pinned by constraints.txt)"
python3 -m pip install -q -c constraints.txt -e ".[test]"
python3 -c "import torch, hydra, mlflow; print(f'torch {torch.__version__}, hydra {hydra.__version__}, mlflow {mlflow.__version__}: ready')"
