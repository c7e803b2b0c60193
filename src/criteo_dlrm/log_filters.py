"""The third-party warnings no user of this project can act on: a ``logging`` filter for the ``py.warnings``
logger (where Kedro's logging captures warnings) in the processes this project prepares (``logs``), and the
same as ``PYTHONWARNINGS`` filters for the processes a command starts, kedro viz's server included, which none
of this project's code prepares. MLflow issues its warning under a warnings filter of its own (``once``), so
only the logger's filter drops it, or an import of its module that records the warnings (``import_quietly``):
kedro viz's server (a plain ``KedroSession``, whose plugin hooks import kedro-mlflow) imports it that way first,
from ``settings.py``, which it reads before it loads the hooks."""

from __future__ import annotations

import builtins
import importlib
import logging
import re
import warnings

# (the start of the message, its category): what Python's warnings filters match.
WARNINGS = (
    # Kedro 1.7 calls OmegaConf's deprecated register_new_resolver (three per command).
    ("register_new_resolver() is deprecated", "UserWarning"),
    # kedro-viz's use of a FastAPI response class FastAPI deprecates.
    ("ORJSONResponse is deprecated", "Warning"),
    # PySpark checks pandas also where no pandas is used (the Spark engine exchanges Arrow batches only).
    ("PySpark does not yet fully support pandas", "FutureWarning"),
    # tqdm.auto, imported by a library in a notebook's kernel without ipywidgets (this project draws no widget).
    ("IProgress not found", "Warning"),
    # torch's sparse Adagrad builds its update without checking it (embedding_optimizer: adagrad on the torch
    # backend): torch's own tensors, nothing a user can act on.
    ("Sparse invariant checks are implicitly disabled", "UserWarning"),
    # TorchRec's DistributedModelParallel passes DDP an argument torch deprecates (embedding_backend: torchrec).
    ("`broadcast_buffers` is deprecated", "FutureWarning"),
)
# The same, and kedro-mlflow's own pyfunc class (for pipeline_ml_factory, unused here), which has no type hints:
# MLflow says so at every import, with raw terminal colour codes, under a warnings filter of its own.
UNACTIONABLE = (*(message for message, _ in WARNINGS), "Add type hints to the `predict` method")


def unactionable(message: str) -> bool:
    """Whether ``message`` is one of the ``UNACTIONABLE`` warnings."""
    return any(text in message for text in UNACTIONABLE)


class UnactionableWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not unactionable(record.getMessage())


def import_quietly(module: str) -> None:
    """Import ``module`` with the ``UNACTIONABLE`` warnings it issues while it loads dropped (the others issued
    again): for a library that warns under a warnings filter of its own (MLflow's ``once``), which overrides any of
    ours, though not a recording of the warnings around it. The filters are as they were afterwards."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module(module)
    for warning in caught:
        if not unactionable(str(warning.message)):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def ignore_warnings() -> None:
    """``WARNINGS`` ignored in this process."""
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=getattr(builtins, category))


# The same, for the processes a command starts (kedro viz's server, worker pools): ``-W`` filters, which Python
# reads from ``PYTHONWARNINGS`` when it starts (a message there matches from its start; no commas or colons).
CHILD_FILTERS = tuple(f"ignore:{message}:{category}" for message, category in WARNINGS)


def quiet_child_processes(environ) -> None:
    """Add ``CHILD_FILTERS`` to ``environ["PYTHONWARNINGS"]`` (once), for the processes started from here on."""
    present = [part for part in environ.get("PYTHONWARNINGS", "").split(",") if part]
    environ["PYTHONWARNINGS"] = ",".join([*present, *(f for f in CHILD_FILTERS if f not in present)])
