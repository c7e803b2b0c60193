"""Data-parallel training on 2 CPU processes over gloo, launched by torch.distributed's elastic launcher."""

import contextlib
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from criteo_dlrm.config.training import Distributed, TrainingConfig
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.engine.trained.scoring import probabilities
from criteo_dlrm.engine.training.recipe import run_training
from tests.conftest import TINY_MODEL, unused_port

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).with_name("distributed_runner.py")


def _config(tmp_path: Path, processes: int, **overrides) -> TrainingConfig:
    values = {
        "num_epochs": 1,
        "batch_size": {"train": 256, "validation": 300},
        **TINY_MODEL,
        "log_every_steps": 4,
        "validations_per_epoch": 1,
        "early_stopping": {"patience": 10},
        "tensorboard_dir": str(tmp_path / "tb"),
        "in_progress_dir": str(tmp_path / "progress"),
        "distributed": {"nproc_per_node": processes},
        **overrides,
    }
    return TrainingConfig.from_dict(values)


def _run(features, config: TrainingConfig, name: str):
    vocabularies = features["vocabularies"]
    return run_training(
        config,
        features["train"],
        features["validation"],
        features["metadata"],
        vocabularies.arrays,
        name,
        "v",
    )


def test_two_processes_take_the_same_steps_as_one_with_the_same_global_batch(tiny_features, tmp_path, monkeypatch):
    # 3,000 rows, global batch 256: 12 steps; the last batch (184 rows) splits 92 + 92. Every process draws
    # the same global batches as one process would, so the gradients are the same sums in another order:
    # Adam's and SparseAdam's updates agree to float rounding.
    temporary = tmp_path / "tmp"  # this process's temporary folder, where the launcher's own files went by default
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    one, one_summary = _run(tiny_features, _config(tmp_path / "one", 1), "one")
    two, two_summary = _run(tiny_features, _config(tmp_path / "two", 2), "two")
    # The launcher's files (a torchelastic_* folder per run, left in /tmp) are written in the run's folder and
    # removed when its processes end.
    assert not list(temporary.glob("torchelastic_*"))
    assert not list((tmp_path / "two" / "progress").glob("launcher_*"))
    assert one_summary.processes == 1 and two_summary.processes == 2
    assert one.step == two.step == 12
    for name, weights in one.model_state.items():
        torch.testing.assert_close(two.model_state[name], weights, rtol=1e-4, atol=2e-5, msg=name)
    assert abs(one.best_validation.log_loss - two.best_validation.log_loss) < 1e-5
    assert abs(one.best_validation.auc - two.best_validation.auc) < 1e-4
    # A different data order would not pass: the same run with another seed moves the weights far more.
    other, _ = _run(tiny_features, _config(tmp_path / "other", 1, seed=1), "other")
    moved = max((other.model_state[n] - w).abs().max().item() for n, w in one.model_state.items())
    assert moved > 1e-2
    # Calibrated once, after training, by the launching process: the same as one process's.
    assert two.calibration_state["method"] == "platt" and two.calibration_state["rows"] == 1000
    for name in ("slope", "intercept"):
        assert two.calibration_state[name] == pytest.approx(one.calibration_state[name], abs=1e-3), name


def test_a_two_process_checkpoint_reproduces_its_metrics_in_one_process(
    tiny_features, tmp_path, logged, nccl_like_processes
):
    checkpoint, summary = _run(
        tiny_features,
        _config(tmp_path, 2, validate_every_steps=5, num_epochs=2),
        "run",
    )
    assert [h.step for h in summary.history] == [5, 10, 12, 15, 20, 24]
    assert any(line.startswith("starting 2 training processes") for line in logged), "no silent start-up"
    assert list((tmp_path / "tb" / "run").glob("events.out.tfevents.*")), "rank 0 writes TensorBoard"
    # No job, outcome or stored rows left behind; the in-progress checkpoint and the best model beside it wait for
    # the checkpoint to be stored.
    name = Path(summary.in_progress_checkpoint).name
    assert sorted(p.name for p in (tmp_path / "progress").iterdir() if not p.name.startswith(".")) == ["best", name]
    assert [p.name for p in (tmp_path / "progress" / "best").iterdir() if not p.name.startswith(".")] == [name]
    model = checkpoint.model()
    validation = tiny_features["validation"]
    predicted = probabilities(
        model,
        torch.from_numpy(validation.dense),
        torch.from_numpy(validation.sparse.astype(np.int64)),
    )
    metrics = binary_metrics(validation.labels, predicted.double().numpy())
    for name in ("log_loss", "auc", "calibration"):
        assert getattr(metrics, name) == pytest.approx(getattr(checkpoint.best_validation, name), abs=1e-6), name
    # The calibration is the maximum-likelihood Platt fit on the kept model's validation logits: both
    # gradients of the log loss (intercept and slope) vanish there.
    logits = np.log(predicted.double().numpy() / (1 - predicted.double().numpy()))
    state = checkpoint.calibration_state
    residual = 1 / (1 + np.exp(-(state["slope"] * logits + state["intercept"]))) - validation.labels
    assert abs(residual.mean()) < 1e-4 and abs((residual * logits).mean()) < 1e-4
    assert summary.calibration["validation_log_loss"]["calibrated"] <= summary.calibration["validation_log_loss"]["raw"]


def _workers(launcher: psutil.Process) -> list[psutil.Process]:
    """The training processes the elastic agent started (``engine.training.distributed.WORKER_START``)."""
    children = []
    for child in launcher.children(recursive=True):
        try:
            if "criteo_dlrm.engine.training.distributed" in " ".join(child.cmdline()):
                children.append(child)
        except psutil.Error:
            continue
    return children


def _saved_step(folder: Path) -> int:
    """The step of the in-progress checkpoint in ``folder`` (-1: none yet)."""
    from criteo_dlrm.engine.trained.checkpoint import load_checkpoint

    for path in folder.glob("dlrm_*.pt"):
        return load_checkpoint(path)["step"]
    return -1


def test_a_killed_worker_ends_the_run_naming_its_rank_and_a_rerun_resumes(tiny_features, tmp_path):
    config = _config(tmp_path, 2, num_epochs=3, batch_size={"train": 16, "validation": 1000}, checkpoint_every_steps=10)
    job = tmp_path / "job.pkl"
    job.write_bytes(pickle.dumps((config.to_dict(), tiny_features)))
    launcher = subprocess.Popen(
        [sys.executable, str(RUNNER), str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    process = psutil.Process(launcher.pid)
    deadline = time.monotonic() + 120
    while _saved_step(tmp_path / "progress") < 10:  # the first in-progress checkpoint after step 0
        assert launcher.poll() is None and time.monotonic() < deadline, "the run ended before a checkpoint"
        time.sleep(0.05)
    workers = _workers(process)
    assert len(workers) == 2
    victim = workers[-1]
    victim.kill()
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 1, output
    assert re.search(rf"Training process rank [01] \(pid {victim.pid}\) failed: killed by signal SIGKILL", output), (
        output
    )
    assert "Run the same command again to resume" in output

    checkpoint, summary = _run(tiny_features, config, "rerun")
    steps_per_epoch = -(-3000 // 16)
    assert checkpoint.step > 0 and summary.steps == 3 * steps_per_epoch
    assert summary.history[0].step >= steps_per_epoch, "the validations before the kill came from the file"
    assert checkpoint.calibration_state["method"] == "platt" and checkpoint.calibration_state["rows"] == 1000, (
        "resumed too"
    )
    assert [str(p) for p in (tmp_path / "progress").glob("*.pt")] == [summary.in_progress_checkpoint]


def _wait_or_show_stacks(processes: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    """Wait for ``processes`` to end; past ``timeout`` seconds, fail with where each was: every process of each
    still-running tree (started with ``PYTHONFAULTHANDLER``) is sent SIGABRT at once, and prints each thread's
    Python stack to its log (``logs``, one per process) as it ends."""
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            break
    else:
        return
    hung = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(process.pid)
            hung += [root, *root.children(recursive=True)]
    for process in hung:  # all at once: no process sees another end first and moves on
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGABRT)
    _, alive = psutil.wait_procs(hung, timeout=30)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    stacks = "\n".join(f"== {log.name}\n{log.read_text()[-20000:]}" for log in logs)
    pytest.fail(f"still running after {timeout:.0f} s; each process's threads when it was ended:\n{stacks}")


def test_a_hung_process_tree_is_ended_showing_where_each_of_its_processes_was(tmp_path):
    # A parent and its child, each waiting in a function of its own name: both names are in the failure.
    log = tmp_path / "tree.log"
    script = (
        "import subprocess, sys, time\n"
        "def parent_waits():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time\\ndef child_waits(): time.sleep(600)\\n"
        "print(1, flush=True); child_waits()'], stdout=subprocess.PIPE)\n"
        "    child.stdout.readline(); print('ready', flush=True); time.sleep(600)\n"
        "parent_waits()\n"
    )
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    with log.open("w") as stderr:
        tree = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr, env=env)
    assert tree.stdout.readline().strip() == b"ready"
    with pytest.raises(pytest.fail.Exception) as failure:
        _wait_or_show_stacks([tree], [log], timeout=1)
    tree.stdout.close()
    assert "still running after 1 s" in str(failure.value)
    assert "parent_waits" in str(failure.value) and "child_waits" in str(failure.value)
    assert tree.poll() is not None


def test_two_nodes_started_with_torchrun_train_the_job_a_run_wrote(tiny_features, tmp_path, logged):
    # Two "nodes" on this machine: two torchrun agents with one process each, meeting at a c10d rendezvous.
    import threading

    port = unused_port()  # never one the kernel hands to another test's port-0 bind (a c10d store) meanwhile
    config = _config(tmp_path, 1, distributed={"nproc_per_node": 1, "nnodes": 2, "master_port": port})
    outcome: dict = {}
    waiting = threading.Thread(target=lambda: outcome.update(result=_run(tiny_features, config, "nodes")), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 60
    while not (started := [m for m in logged if "Multi-node training" in m]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The command the run logged, for a node named localhost.
    command = started[0].splitlines()[-1].strip().replace("HEAD_NODE", "localhost").split()
    assert command[0] == "torchrun"
    jobs = list((tmp_path / "progress").glob("job_*.json"))
    outcome_path = jobs[0].with_name(jobs[0].name.replace("job_", "outcome_").replace(".json", ".pt"))
    # Each node's torchrun writes its files in the run's folder (by default a torchelastic_* folder in its /tmp,
    # left there), and the run removes them when it has the outcome.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    logs = [tmp_path / f"node_{i}.log" for i in range(2)]
    with contextlib.ExitStack() as files:
        nodes = [  # each node's log a file (a pipe read one node at a time can fill and stall the other node)
            subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", *command[1:]],
                stderr=files.enter_context(log.open("w")),
                # A stack of every thread if one is ended as hung; the agents' own steps (rendezvous, exit barrier).
                env={**os.environ, "PYTHONFAULTHANDLER": "1", "LOGLEVEL": "INFO", "TMPDIR": str(temporary)},
            )
            for log in logs
        ]
        _wait_or_show_stacks(nodes, logs, timeout=240)
    for node, log in zip(nodes, logs, strict=True):
        assert node.returncode == 0, log.read_text()[-3000:]
    waiting.join(timeout=60)
    checkpoint, summary = outcome["result"]
    assert summary.processes == 2 and checkpoint.step == 12
    assert not jobs[0].exists() and not outcome_path.exists()
    assert not list(temporary.glob("torchelastic_*"))
    assert not list((tmp_path / "progress").glob("launcher_*"))


@pytest.mark.parametrize(
    ("error_file", "shown"),
    [
        (  # what @record writes for an exception: the message nested in a dict
            {"message": {"message": "ConfigError: training.embedding_optimizer 'sparse_adam' has no fused kernel",
                         "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1"}}},
            "ConfigError: training.embedding_optimizer 'sparse_adam' has no fused kernel",
        ),
        ({"message": "RuntimeError: out of memory", "timestamp": 1}, "RuntimeError: out of memory"),  # a plain one
        (  # a traceback as the message: its last line is the error
            {"message": {"message": "Traceback (most recent call last):\n  File x\nValueError: bad rows",
                         "extraInfo": {"timestamp": "1"}}},
            "ValueError: bad rows",
        ),
        (None, "exit code 1"),  # no error file at all
    ],
)  # fmt: skip
def test_the_failure_report_survives_any_error_file_a_worker_writes(tmp_path, error_file, shown):
    import json

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from criteo_dlrm.engine.training.distributed import _describe_failure
    from criteo_dlrm.engine.training.job import TrainingJob

    path = tmp_path / "error.json"
    if error_file is not None:
        path.write_text(json.dumps(error_file))
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=1, error_file=str(path))
    job = TrainingJob(TrainingConfig(), "t", "v", [2] * 26, "abc", "run")
    message = _describe_failure(ChildFailedError("worker", {1: failure}), job)
    assert message.startswith("Training process rank 1 (pid 4242) failed: exit code 1") and shown in message
    assert "Run the same command again to resume" in message


def test_a_user_error_in_a_training_process_reaches_the_launcher_with_its_fix(tiny_features, tmp_path):
    """A process's error arrives as the text of its traceback; its ``Fix`` comes with it, so the command line can
    show the user's own command merged in (as for an error of the launching process)."""
    from criteo_dlrm.common.errors import Fix
    from criteo_dlrm.data.stored import open_encoded, write_encoded
    from criteo_dlrm.engine.training.distributed import TrainingWorkerError

    rows = tmp_path / "train_rows"
    write_encoded(tiny_features["train"], rows)
    labels = rows / "labels.npy"
    data = bytearray(labels.read_bytes())
    data[-1] ^= 0xFF  # the last chunk's rows: found when the process first reads them
    labels.write_bytes(bytes(data))
    train = open_encoded(rows)
    with pytest.raises(TrainingWorkerError) as raised:
        _run({**tiny_features, "train": train}, _config(tmp_path, 2), "damaged")
    assert re.search(r"rank [01] \(pid \d+\) failed", str(raised.value)) and "labels.npy" in str(raised.value)
    assert raised.value.fixes == (Fix(pipelines="training"),)
    assert f"`{Fix(pipelines='training')}`" in str(raised.value)
    assert not list((tmp_path / "progress").glob("*.fixes.json")), "the fixes' file is removed with the run"


def test_a_training_process_that_fails_frees_its_model_before_it_destroys_its_group(tmp_path, monkeypatch):
    """A failed step's frames hold the model, whose DDP reducer holds the group: the worker clears them before it
    destroys the group (a DDP freed after ``destroy_process_group`` can deadlock the group's threads on the
    interpreter's lock), and the error it raises still shows where it was."""
    import traceback
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from criteo_dlrm.engine.training import distributed
    from tests.engine.training.test_process import _ddps_alive_at_each_destroy

    def train_process(job, device):
        model = DistributedDataParallel(torch.nn.Linear(2, 2))  # held by this frame while its error leaves
        model(torch.ones(1, 2)).sum().backward()
        raise RuntimeError("a step failed")

    job = SimpleNamespace(config=SimpleNamespace(device="cpu", num_threads=1, distributed=Distributed(backend="gloo")))
    monkeypatch.setattr(distributed.TrainingJob, "load", staticmethod(lambda path: job))
    monkeypatch.setattr(distributed, "train_process", train_process)
    monkeypatch.setattr(distributed, "_worker_logging", lambda: None)
    alive = _ddps_alive_at_each_destroy(monkeypatch)
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(unused_port()),
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="a step failed") as failure:
        distributed.worker(str(tmp_path / "job.json"))
    assert alive == [0] and not dist.is_initialized()
    assert 'raise RuntimeError("a step failed")' in "".join(traceback.format_exception(failure.value))


def test_the_failure_named_is_the_rank_that_was_killed_not_the_ones_the_launcher_ended_after_it(tmp_path):
    """A rank killed by SIGKILL, and the other ending with a peer's "Connection reset" error as the launcher sent
    it SIGTERM: the launcher's own first failure (by whole-second timestamps) named the SIGTERM'd rank."""
    import json
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from criteo_dlrm.engine.training.distributed import root_failure

    def failure(rank: int, code: int, message: str | None = None) -> ProcessFailure:
        error_file = tmp_path / f"error_{rank}.json"
        if message:
            error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": "5"}}}))
        return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file=str(error_file))

    ended = failure(0, -signal.SIGTERM, "RuntimeError: Connection reset by peer")
    killed = failure(1, -signal.SIGKILL)
    assert root_failure(ChildFailedError("worker", {0: ended, 1: killed}))[0] == 1
    own = failure(1, 1, "ConfigError: training.batch_size.train must be at least 1")
    assert root_failure(ChildFailedError("worker", {0: ended, 1: own}))[0] == 1, "its own error, not the SIGTERM"
    assert root_failure(ChildFailedError("worker", {0: ended, 1: failure(1, -signal.SIGTERM)}))[0] == 0


def test_a_child_that_asked_to_end_with_its_parent_ends_when_it_is_killed(tmp_path):
    """``common.parent.end_with_parent``: the kernel ends the child when its parent is SIGKILLed; a child whose
    parent had gone before it asked exits at once."""
    import os
    import signal

    ready = tmp_path / "asked"
    script = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import pathlib, sys, time; "
        "from criteo_dlrm.common.parent import end_with_parent; end_with_parent(int(sys.argv[1])); "
        "pathlib.Path(sys.argv[2]).touch(); time.sleep(60)', str(os.getpid()), sys.argv[1]])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(ready)], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    deadline = time.monotonic() + 60
    while not ready.exists():  # it has asked
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.01)
    assert child.is_running()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    gone, _ = psutil.wait_procs([child], timeout=5)
    assert gone, "the child ended with its parent"
    late = subprocess.run([sys.executable, "-c", "from criteo_dlrm.common.parent import end_with_parent; "
                           "end_with_parent(1); print('ran on')"], capture_output=True, text=True)  # fmt: skip
    assert late.returncode == 1 and "ran on" not in late.stdout, "its parent (pid 1) is not the one named"
