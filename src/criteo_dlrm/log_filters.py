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
import importlib.abc
import importlib.util
import logging
import re
import sys
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


class _QuietLoader(importlib.abc.Loader):
    """Runs a module's loader with the warnings it issues recorded, the ``UNACTIONABLE`` ones dropped."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.loader.exec_module(module)
        for warning in caught:
            if not unactionable(str(warning.message)):
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


class _QuietOnImport(importlib.abc.MetaPathFinder):
    """``import_quietly`` for ``modules``, done when something first imports them (not before: MLflow takes seconds
    to import, and a kedro command that tracks nothing never needs it)."""

    def __init__(self, modules: set[str]):
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        if name not in self.modules:
            return None
        self.modules = self.modules - {name}  # found once, by the finders after this one
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_on_import(*modules: str) -> None:
    """``import_quietly`` each of ``modules`` when it is first imported (by anyone), from now on in this process."""
    if not any(isinstance(finder, _QuietOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietOnImport(set(modules)))


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
