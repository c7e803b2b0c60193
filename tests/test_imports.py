"""Imports run one way: common knows no other part of the package; config knows no engine; the core no Kedro."""

import ast
import os
import re

import pytest
import yaml

from tests.conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "src" / "criteo_dlrm"
# A part may import (or name, as a module string) only the parts below it.
BELOW = {
    "common": set(),
    "config": {"common", "models"},
    "models": {"common"},
}


def _named(path) -> set[str]:
    """criteo_dlrm.<part> modules ``path`` imports or names as strings (a preload list, say)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("criteo_dlrm."):
            found.add(node.value)
    return {name.split(".")[1] for name in found if name.startswith("criteo_dlrm.") and name.count(".") >= 1}


@pytest.mark.parametrize("part", sorted(BELOW))
def test_a_lower_part_never_imports_or_names_a_higher_one(part):
    for path in (PACKAGE / part).rglob("*.py"):
        upward = _named(path) - BELOW[part] - {part}
        assert not upward, f"{path.relative_to(PROJECT_ROOT)} reaches up to {sorted(upward)}"


# engine's rooms, lowest first: a room imports (or names) only the rooms below it and engine's own modules (device,
# memory); engine's own modules import no room.
ENGINE_ROOMS = ("trained", "parallel", "training")


@pytest.mark.parametrize("room", [None, *ENGINE_ROOMS])
def test_engine_s_rooms_import_only_the_rooms_below_them(room):
    below = set(ENGINE_ROOMS[: ENGINE_ROOMS.index(room)]) if room else set()
    paths = (PACKAGE / "engine" / room).rglob("*.py") if room else (PACKAGE / "engine").glob("*.py")
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
        rooms = {name.split(".")[2] for name in found if name.startswith("criteo_dlrm.engine.")} & set(ENGINE_ROOMS)
        upward = rooms - below - {room}
        assert not upward, f"{path.relative_to(PROJECT_ROOT)} reaches up to engine's {sorted(upward)}"


def test_no_folder_of_the_package_holds_more_than_15_modules():
    crowded = {
        str(folder.relative_to(PROJECT_ROOT)): count
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]
        if (count := sum(1 for f in folder.glob("*.py") if f.name != "__init__.py")) > 15
    }
    assert not crowded, f"folders of more than 15 modules (split them into rooms): {crowded}"


def _pass_throughs(path) -> list[str]:
    """The one-call pass-throughs of ``path``: functions and methods (undecorated) whose whole body, past the
    docstring, is one call (returned or not) given nothing but their own parameters, unchanged."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr) or not isinstance(body[0].value, ast.Call):
            continue
        call = body[0].value
        arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
        parameters = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
        names = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
        if names <= parameters and not any(isinstance(n, ast.Call) for a in arguments for n in ast.walk(a)):
            found.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name}")
    return found


def test_modes_are_built_from_parts_and_the_package_holds_at_most_45_one_call_pass_throughs():
    """Issue 60 item 3: the three mode classes delegated 30 methods to their parts (70 such pass-throughs in src);
    a mode is now its parts (placement, group, optimisers), which the loop and the step call."""
    modes = PACKAGE / "engine" / "parallel" / "modes.py"
    assert _pass_throughs(modes) == [], "a mode hands no call on: its callers call the part"
    found = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in _pass_throughs(path)]
    assert len(found) <= 45, "\n".join(found)


def _module_imports(path) -> set[str]:
    """criteo_dlrm modules ``path`` imports, at its top or inside functions, under ``TYPE_CHECKING`` too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("criteo_dlrm.")}


def test_no_module_of_the_package_imports_itself_back_through_others():
    modules = {
        ".".join(("criteo_dlrm", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
    }
    graph = {name: {m for m in _module_imports(path) if m in modules and m != name} for name, path in modules.items()}
    # Importing a module runs the __init__ of the packages above it, except those the importer is inside (running).
    for name in graph:
        above = {p for m in graph[name] for p in _parents(m) if p in modules and not name.startswith(p + ".")}
        graph[name] |= above - {name}
    circles, state = [], {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in circles)


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def test_only_the_command_line_and_the_console_read_how_kedro_run_was_started():
    """The core (and every other module) carries a message's fix as data (``common.errors.Fix``); only ``cli``
    (an error's last lines) and ``logs`` (a log line) show it merged into the user's command (``common.commands``)."""
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "criteo_dlrm.common.commands" in _module_imports(path) and path.name != "commands.py"
    }
    assert readers == {"cli.py", "logs.py"}


def test_a_kedro_command_s_start_imports_neither_matplotlib_nor_torch_s_distributed_checkpoint():
    """Every ``kedro`` command imports the settings and the pipelines: the figures' library and torch's sharded
    checkpoints (0.3 s and 0.5 s) are imported where a figure is drawn or a sharded state is written or read."""
    import subprocess
    import sys

    code = (
        "import sys; from kedro.framework.project import configure_project, pipelines; "
        "configure_project('criteo_dlrm'); assert pipelines['__default__'].nodes; "
        "print([m for m in ('matplotlib', 'torch.distributed.checkpoint') if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT)
    assert loaded.stdout.strip() == "[]"


def test_the_project_s_settings_import_neither_torch_nor_mlflow():
    """Every ``kedro`` command imports the settings first: torch and MLflow (seconds each) are imported by the run
    that needs them (the hooks and the datasets import them when they first run), not by ``kedro --help``,
    ``kedro viz --help`` or ``kedro catalog list``."""
    import subprocess
    import sys

    code = (
        "import sys; import criteo_dlrm.settings; "
        "print([m for m in ('torch', 'mlflow', 'kedro_mlflow.mlflow') if m in sys.modules])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRITEO_DLRM_")}  # tracking on: the default
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT, env=env
    )
    assert loaded.stdout.strip() == "[]"


def _modules_after(code: str, tracking: str = "on") -> str:
    """What ``code`` run in a fresh interpreter at the project's root prints, with only the tracking setting given."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("CRITEO_DLRM_")}
    env |= {"CRITEO_DLRM_TRACKING": tracking, "KEDRO_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("command", [["--help"], ["viz", "--help"], ["catalog", "--help"], ["run", "--help"]])
def test_kedro_s_commands_start_without_mlflow_or_torch(command):
    """``kedro --help`` and the like list every plugin's commands: kedro-mlflow's command module imported MLflow
    (1.6 s of 3.2 s) for its help line; now it is imported when ``kedro mlflow ...`` runs (tracking.commands)."""
    code = (
        "import sys\n"
        f"sys.argv = ['kedro', *{command!r}]\n"
        "from kedro.framework.cli import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n    assert not end.code, end.code\n"
        "print('LOADED', [m for m in ('torch', 'mlflow') if m in sys.modules])\n"
    )
    out = _modules_after(code)
    assert out.strip().endswith("LOADED []"), out[-2000:]
    if command == ["--help"]:
        assert "mlflow  Use mlflow-specific commands inside kedro project." in out  # still listed, kedro-mlflow's line


def test_kedro_mlflow_s_commands_are_still_kedro_mlflow_s():
    code = (
        "import sys\n"
        "sys.argv = ['kedro', 'mlflow', '--help']\n"
        "from kedro.framework.cli import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n    assert not end.code, end.code\n"
    )
    out = _modules_after(code)
    import re

    listed = out.partition("Commands:")[2]
    assert re.findall(r"^  (\w+) ", listed, flags=re.MULTILINE) == ["init", "modelify", "ui"], out


@pytest.mark.parametrize("tracking", ["on", "off"])
def test_a_session_s_context_and_catalog_need_neither_torch_nor_mlflow(tracking):
    """``kedro catalog describe-datasets``, ``kedro viz`` and every run create the context, whose hook checks the
    model's settings (``DLRMConfig``) and builds the pipelines, and kedro-mlflow builds every dataset of the catalog
    at a run's start: none of it needs torch (models.shapes; the nodes and the checkpoint dataset import the engine
    when they run), so a run that ingests or encodes never imports it (450 MB of an encoding run's memory). Nor
    MLflow (1.8 s, and seconds more to open its store): kedro-mlflow's hook is imported and set up when a pipeline
    starts (tracking.deferred_hook), and with tracking off never."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from kedro.framework.startup import bootstrap_project\n"
        "from kedro.framework.session import KedroSession\n"
        "bootstrap_project(Path.cwd())\n"
        "with KedroSession.create(project_path=Path.cwd()) as session:\n"
        "    context = session.load_context()\n"
        "    assert context.params['training']\n"
        "    assert 'TorchCheckpointDataset' in {type(ds).__name__ for _, ds in context.catalog.items()}\n"
        "print('LOADED', [m for m in ('torch', 'mlflow', 'kedro_mlflow.framework.hooks') if m in sys.modules])\n"
    )
    out = _modules_after(code, tracking=tracking)
    assert out.strip().endswith("LOADED []"), out[-2000:]


def _string_key_reads(path) -> list[str]:
    """Reads of a value by a string constant in ``path``: ``x["key"]`` (not an assignment target) and
    ``x.get("key")`` / ``x.pop("key")``: a record's field read as a dict's key."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
            key = node.args[0] if node.args else None
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {key.value}")
    return found


def test_records_are_read_by_their_fields_at_most_200_string_key_reads_in_the_package():
    """Issue 60 item 4: records were typed on top and dicts inside (444 string-key reads in src); the metrics, the
    source days, the reports, the checkpoint's parts and the in-progress file's are records now."""
    found = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in _string_key_reads(path)]
    assert len(found) <= 200, f"{len(found)} string-key reads:\n" + "\n".join(found)


# Parameter blocks reach a node as Kedro's dicts (``params:<block>``) and are read into their Config there; the
# training settings are written as plain values into the run's records. Every other record is the dataset's.
CONFIG_CALLS = re.compile(r"^(\w+Config\.from_dict|config\.to_dict)$")


def test_nodes_and_the_recipe_get_and_give_records_the_datasets_read_and_write():
    """Issue 60 item 4: nodes and the recipe called ``from_dict``/``to_dict`` on what the catalog held (the
    metadata, the checkpoint, the reports); the catalog's datasets now load and save the records themselves."""
    files = [*sorted((PACKAGE / "pipelines").rglob("nodes.py")), PACKAGE / "engine" / "training" / "recipe.py"]
    calls = [
        f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {ast.unparse(node.func)}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("from_dict", "to_dict") and not CONFIG_CALLS.match(ast.unparse(node.func))
    ]  # fmt: skip
    assert calls == [], "\n".join(calls)
    catalog = {}
    for path in sorted((PROJECT_ROOT / "conf" / "base").glob("catalog*.yml")):
        catalog |= yaml.safe_load(path.read_text())
    reports = ("ingestion_report", "feature_metadata", "training_summary", "evaluation_metrics", "scoring_report",
               "export_report")  # fmt: skip
    assert {name: catalog[name].get("record") for name in reports} == {
        "ingestion_report": "criteo_dlrm.data.source_days.IngestionReport",
        "feature_metadata": "criteo_dlrm.data.feature_metadata.FeatureMetadata",
        "training_summary": "criteo_dlrm.engine.trained.reports.TrainingSummary",
        "evaluation_metrics": "criteo_dlrm.engine.trained.reports.EvaluationReport",
        "scoring_report": "criteo_dlrm.engine.trained.reports.ScoringReport",
        "export_report": "criteo_dlrm.engine.trained.reports.ExportReport",
    }
    for name in ("previous_feature_metadata", "previous_training_summary"):
        assert catalog[name]["dataset"]["record"] == catalog[name.removeprefix("previous_")]["record"], name
