"""Data-parallel training processes, started by torch.distributed's elastic launcher (the API behind ``torchrun``).

One machine: ``run_training`` calls ``launch``, which writes the job to a file, starts
``distributed.nproc_per_node`` processes with ``elastic_launch`` and waits; rank 0 hands back its outcome
through a file. Several machines: run the same job file on each node with ``torchrun``::

    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        -m criteo_dlrm.engine.training.distributed JOB.json --outcome OUTCOME.pt

Each process uses one GPU (``cuda:LOCAL_RANK``) on CUDA, or its share of the cores on CPU; the backend is
nccl on CUDA and gloo on CPU unless ``distributed.backend`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from loguru import logger
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from criteo_dlrm.common.errors import Fix, UserError
from criteo_dlrm.config.training import Distributed
from criteo_dlrm.data.stored import write_encoded
from criteo_dlrm.engine.parallel.group import destroy_group
from criteo_dlrm.engine.training.job import TrainingJob, TrainingOutcome
from criteo_dlrm.engine.training.process import train_process


class TrainingWorkerError(UserError, RuntimeError):
    """A training process failed (or was killed); the message names its rank."""


# What each training process of ``launch`` runs: the parent-death signal first, then ``main``.
WORKER_START = (
    "import sys; from criteo_dlrm.common.parent import end_with_parent; end_with_parent(int(sys.argv[1])); "
    "from criteo_dlrm.engine.training.distributed import main; main([sys.argv[2], '--outcome', sys.argv[3]])"
)


def launch(job: TrainingJob, settings: Distributed) -> TrainingOutcome:
    """Run ``job`` in ``settings.nproc_per_node`` processes on this machine; returns rank 0's outcome.

    Raises:
        TrainingWorkerError: a process failed, after elastic restarts (``max_restarts``) ran out; the
            message names the rank, its error, and how to resume.
    """
    folder = Path(job.config.in_progress_dir)
    folder.mkdir(parents=True, exist_ok=True)
    job_path, outcome_path = folder / f"job_{job.fingerprint}.json", folder / f"outcome_{job.fingerprint}.pt"
    outcome_path.unlink(missing_ok=True)
    stored = _store_rows_in_memory(job)
    logs = launcher_folder(job)  # removed when the processes end (torch's default left one in /tmp per run)
    try:
        job.save(job_path)
        if settings.nnodes > 1:
            return _wait_for_nodes(job_path, outcome_path, settings, logs)
        config = launch_config(settings.nproc_per_node, logs, settings.master_port, settings.max_restarts)
        # Each process starts Python, imports torch and joins the group before its first step: seconds of
        # silence otherwise (about 11 s for 2 processes on 2 cores).
        logger.info(
            "starting {} training processes on this machine (each imports torch and joins the process group "
            "before its first step: several seconds)",
            settings.nproc_per_node,
        )
        try:
            # A command rather than a function (which the launcher starts through multiprocessing's spawn, whose
            # child imports the parent's main module and torch before any code of ours): its first instruction
            # makes it end with this process (``common.parent``).
            elastic_launch(config, sys.executable)(
                "-c", WORKER_START, str(os.getpid()), str(job_path), str(outcome_path)
            )
        except ChildFailedError as error:
            rank, _ = root_failure(error)
            raise TrainingWorkerError(_describe_failure(error, job), fix=_rank_fixes(job_path, rank)) from error
        return _collect(job_path, outcome_path)
    finally:
        for leftover in [logs, *stored]:
            shutil.rmtree(leftover, ignore_errors=True)
        for fixes in folder.glob(f"{job_path.stem}.rank*.fixes.json"):
            fixes.unlink(missing_ok=True)


SPLITS = ("train", "validation")  # a job's rows, by its attributes' names


def launcher_folder(job: TrainingJob) -> Path:
    """Where torch's launcher writes its files (each process's error file, read into a failure's message), ``launch``'s
    on this machine and ``torchrun``'s on every node of a multi-node run (each node a folder of its own in it): beside
    the job's file, in its in-progress folder. Removed when the run ends; one a killed run left is removed by the job's
    next run, in any number of processes (``recipe._train``)."""
    return Path(job.config.in_progress_dir) / f"launcher_{job.fingerprint}"


def _fixes_path(job_path: Path, rank: int) -> Path:
    """Where rank ``rank`` leaves the fixes of the user error it failed with: its error reaches the launcher as the
    text of a traceback, its ``Fix`` as this file (so the command line shows the user's command merged in)."""
    return job_path.with_name(f"{job_path.stem}.rank{rank}.fixes.json")


def _rank_fixes(job_path: Path, rank: int) -> list[Fix]:
    try:
        return [Fix.from_dict(values) for values in json.loads(_fixes_path(job_path, rank).read_text())]
    except (OSError, ValueError, TypeError):  # none written (not a user error), or unreadable: the text stands alone
        return []


def rows_folder(job: TrainingJob, split: str) -> Path:
    """Where ``launch`` stores ``split``'s rows held in memory (a notebook's, a test's) for the processes to open:
    in the in-progress folder, removed when the processes end. A run killed meanwhile leaves them, and the job's next
    run removes them (``recipe._train``)."""
    return Path(job.config.in_progress_dir) / f"rows_{job.fingerprint}_{split}"


def _store_rows_in_memory(job: TrainingJob) -> list[Path]:
    """Rows held in memory go to folders of the run (``rows_folder``), so the processes can open them."""
    stored = []
    for split in SPLITS:
        rows = getattr(job, split)
        if not isinstance(rows, str):
            target = rows_folder(job, split)
            write_encoded(rows, target)
            setattr(job, split, str(target))
            stored.append(target)
    return stored


def launch_config(processes: int, logs: Path, port: int | None = None, max_restarts: int = 0) -> LaunchConfig:
    """``processes`` spawned processes on this machine, meeting at a c10d rendezvous on ``port`` (None: free); the
    launcher writes its files (each process's error file) under ``logs``, which the caller removes."""
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=f"criteo-dlrm-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"localhost:{port or 0}",  # 0: the c10d store picks a free port
        max_restarts=max_restarts,
        monitor_interval=0.5,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(logs)),
    )


def _collect(job_path: Path, outcome_path: Path) -> TrainingOutcome:
    """Rank 0's outcome (tensors and plain values only: nothing in it can run), then both files are removed."""
    outcome = TrainingOutcome.load(outcome_path)
    outcome_path.unlink(missing_ok=True)
    job_path.unlink(missing_ok=True)
    return outcome


def torchrun_command(
    job_path: Path, outcome_path: Path, settings: Distributed, logs: Path, head: str = "HEAD_NODE"
) -> str:
    """The command to start on every node of a multi-node run (``head``: a host every node can reach; ``logs``:
    the launcher's folder, where each node's torchrun writes a folder of its own instead of one in its /tmp)."""
    return (
        f"torchrun --nnodes={settings.nnodes} --nproc-per-node={settings.nproc_per_node} --rdzv-backend=c10d "
        f"--rdzv-endpoint={head}:{settings.master_port or 29400} --rdzv-id={job_path.stem} --log-dir={logs} "
        f"-m criteo_dlrm.engine.training.distributed {job_path} --outcome {outcome_path}"
    )


def _wait_for_nodes(job_path: Path, outcome_path: Path, settings: Distributed, logs: Path) -> TrainingOutcome:
    """Multi-node: the job is written; torchrun runs it on every node; rank 0 writes the outcome file."""
    logger.info(
        "Multi-node training: start this on each of the {} nodes (paths on a filesystem they all see):\n  {}",
        settings.nnodes, torchrun_command(job_path.resolve(), outcome_path.resolve(), settings, logs.resolve()),
    )  # fmt: skip
    waited = 0.0
    while not outcome_path.exists():
        time.sleep(1.0)
        waited += 1.0
        if waited % 300 == 0:
            logger.info("still waiting for {} ({:.0f} min)", outcome_path, waited / 60)
    return _collect(job_path, outcome_path)


def _worker_message(message: object) -> str:
    """The worker's own error from what the launcher read of its error file, whatever shape that file has
    (``@record``'s nested dicts, a plain string, or something a worker wrote by itself)."""
    while isinstance(message, dict) and "message" in message:
        message = message["message"]
    if isinstance(message, dict):
        message = message.get("extraInfo", {}).get("py_callstack", "") or json.dumps(message)[:2000]
    text = str(message or "no message").strip()
    # A traceback's last line is the exception itself ("ConfigError: ...").
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines and lines[0].startswith("Traceback") else text


def root_failure(error: ChildFailedError) -> tuple[int, ProcessFailure]:
    """The failure that ended the run, of every rank's: a process killed by a signal the launcher does not send
    (SIGKILL: the memory killer, a user), else one that failed with its own error, else (SIGTERM, SIGINT: the
    launcher ending the others, a Ctrl-C) the first. Among equals the earliest; the launcher's own choice goes
    by a timestamp in whole seconds, and named a rank the launcher had ended after another was killed."""

    def rank(item: tuple[int, ProcessFailure]) -> tuple[int, float, int]:
        code = item[1].exitcode
        kind = 0 if code is not None and code < 0 and -code not in ENDED_BY_LAUNCHER else 1 if code and code > 0 else 2
        return kind, item[1].timestamp, item[0]

    return min(error.failures.items(), key=rank)


# The signals the launcher (and a terminal's Ctrl-C) ends the processes with.
ENDED_BY_LAUNCHER = (signal.SIGTERM, signal.SIGINT)


def _describe_failure(error: ChildFailedError, job: TrainingJob) -> str:
    rank, failure = root_failure(error)
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            cause = f"killed by signal {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            cause = f"killed by signal {-failure.exitcode}"
    else:
        cause = f"exit code {failure.exitcode}: {_worker_message(failure.message)}"
    resume = job.resume_path
    how = (
        f"Run the same command again to resume from the last in-progress checkpoint ({resume})."
        if resume is not None
        else "resume is off, so a rerun starts afresh."
    )
    return f"Training process rank {rank} (pid {failure.pid}) failed: {cause}. {how}"


def _worker_logging() -> None:
    """A worker's log lines look like the launching process's (one plain line each); TorchRec's planner notes
    about its own dry runs are left out (a placement that cannot work is an error, reported as one)."""
    import logging
    import sys
    import warnings

    logger.remove()
    logger.add(sys.stderr, format="{time:HH:mm:ss} {level: <7} {message}", level="INFO")
    for name in ("torchrec", "torch.fx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\..*")


@record
def worker(job_path: str, outcome_path: str | None = None) -> None:
    """One training process: join the group the launcher (or torchrun) describes in the environment, train its
    share, and (rank 0) write the outcome."""
    _worker_logging()
    job = TrainingJob.load(job_path)
    config = job.config
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cuda = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    elif config.num_threads is None:  # the processes share the cores instead of each taking all of them
        config.num_threads = max(1, (os.cpu_count() or 1) // local_world)
    backend = config.distributed.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, device_id=device if cuda else None)
    try:
        outcome = train_process(job, device)
        if dist.get_rank() == 0 and outcome_path:
            outcome.save(Path(outcome_path))
    except UserError as error:
        fixes = json.dumps([fix.to_dict() for fix in error.fixes], default=str)
        _fixes_path(Path(job_path), dist.get_rank()).write_text(fixes)
        raise
    finally:
        destroy_group()  # after what holds the group (a failed step's model under DDP) is freed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One data-parallel training process (start it with torchrun).")
    parser.add_argument("job", help="the job file a run wrote (in the run's in_progress_dir: job_<fingerprint>.json)")
    parser.add_argument("--outcome", help="where rank 0 writes its outcome (best weights, history)")
    args = parser.parse_args(argv)
    worker(args.job, args.outcome)


if __name__ == "__main__":
    main()
