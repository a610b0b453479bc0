#!/usr/bin/env bash
# Install everything pipelab needs on a fresh machine (Debian/Ubuntu or anything with pip).
#   bash setup.sh            # system packages where possible, then the Python package
#   bash setup.sh --ui       # also Chromium, for the MLflow UI test (or PIPELAB_UI=1 bash setup.sh)
# System packages: mosquitto (MQTT broker for transport tests), Debian's Fashion-MNIST and PostgreSQL
# (a team's MLflow server and Optuna studies; the tests start their own); with --ui also Chromium
# (headless, for tests/test_mlflow_ui.py, a slow test skipped without it).
# Torch is pinned through constraints.txt so pip never pulls a multi-gigabyte CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

UI="${PIPELAB_UI:-0}"
for arg in "$@"; do
  case "$arg" in
    --ui) UI=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (options: --ui)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
  echo "== system packages (apt): mosquitto dataset-fashion-mnist"
  $SUDO apt-get update -qq || echo "warning: apt-get update failed; trying the install anyway" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto dataset-fashion-mnist \
    || echo "warning: apt-get could not install mosquitto/dataset-fashion-mnist; MQTT and Fashion-MNIST tests will be skipped" >&2
  echo "== system packages (apt): postgresql"  # on its own: a database that cannot install must not cost the broker
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql \
    || echo "warning: apt-get could not install postgresql; the PostgreSQL tests will be skipped" >&2
  if [ "$UI" = 1 ]; then  # on its own: a browser that cannot install must not cost the broker
    echo "== system packages (apt, --ui): chromium"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
      || echo "warning: apt-get could not install chromium; the MLflow UI test will be skipped" >&2
  fi
elif command -v brew >/dev/null 2>&1; then
  brew install mosquitto || echo "warning: brew could not install mosquitto" >&2
  echo "note: for the PostgreSQL tests put initdb and pg_ctl on PATH (brew install postgresql@16, then its bin folder)" >&2
  if [ "$UI" = 1 ]; then
    echo "note: for the MLflow UI test put Chromium or Chrome on PATH as chromium or google-chrome" >&2
  fi
else
  echo "note: no apt-get/brew with root rights here: install mosquitto yourself for the MQTT transport" >&2
fi

echo "== python packages (pip, torch pinned by constraints.txt)"
python3 -m pip install -q -c constraints.txt -e ".[test,docs,team]"  # docs: mkdocs for the site (.ci/run builds it); team: the PostgreSQL driver
echo "== compiling the codec kernels (numba; once per machine, cached beside the source)"
python3 -m plugins.compressors.kernels
python3 -c "import torch, hydra, mlflow, optuna, psycopg, hydra_plugins.hydra_joblib_launcher, hydra_plugins.hydra_submitit_launcher, hydra_plugins.hydra_optuna_sweeper; print(f'torch {torch.__version__}, hydra {hydra.__version__} (joblib and submitit launchers, optuna sweeper), mlflow {mlflow.__version__}, optuna {optuna.__version__}, psycopg {psycopg.__version__}: ready')"
