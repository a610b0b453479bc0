"""Links into the MLflow UI that open in its model-training mode.

MLflow 3.17's UI opens an experiment in the mode its sidebar switch (GenAI | Model training) was
last left in, GenAI (traces and evaluations) in a fresh browser, unless the URL's
`workflowType=machine_learning` says otherwise; a run's page opens on the tab its path names
(`/model-metrics`: its charts). A SQLite or file store has no server: the link is the address
`mlflow ui` serves by default, with the command that serves this store.
"""

from __future__ import annotations

MODE = "workflowType=machine_learning"
DEFAULT_UI = "http://127.0.0.1:5000"  # where `mlflow ui` listens unless told otherwise


def ui_base(uri: str) -> tuple[str, str | None]:
    """(the UI's base URL, the command that serves it, or None when `uri` is a server already)."""
    uri = str(uri)
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/"), None
    return DEFAULT_UI, f"mlflow ui --backend-store-uri {uri}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """A run's charts (its Model metrics tab), in model-training mode."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}/model-metrics?{MODE}"


def experiment_url(base: str, experiment_id: str) -> str:
    """An experiment's runs table (a sweep's parent with its jobs nested), in model-training mode."""
    return f"{base}/#/experiments/{experiment_id}?{MODE}"


def describe(uri: str, url: str) -> str:
    """`url`, and how to serve it when the store has no server."""
    _, serve = ui_base(uri)
    return f"{url}  (serve it: {serve})" if serve else url
