"""CPU threads for training, on an idle machine and beside one busy process, in one run.

Each measurement is a fresh process (OpenMP's wait policy is read when torch loads) training the default
DLRM (the bundled sample's sizes, batch 256) with the project's own step for a fixed number of steps;
samples/s, best of ``--repeats``, interleaved. The busy neighbour is one single-threaded process spinning on
a core, as another job on a shared machine would.

    python -m benchmarks.threads [--steps 400] [--repeats 3] [--loads idle 'beside one busy process']
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.harness import ROOT, Arguments, Table, child_command

LOADS = ("idle", "beside one busy process")
SETTINGS = {
    "every core (torch's default)": {"threads": "all", "env": {}},
    "every core, OpenMP threads sleep when idle (OMP_WAIT_POLICY=PASSIVE)": {
        "threads": "all",
        "env": {"OMP_WAIT_POLICY": "PASSIVE"},
    },
    "one thread": {"threads": "1", "env": {}},
    "the project's default (training.num_threads: null)": {"threads": "default", "env": {}},
}


def measure(threads: str, steps: int) -> float:
    """Samples/s of ``steps`` training steps in this process (after a warm-up)."""
    import torch

    from benchmarks.training import CONFIGURATIONS, spec_config, synthetic_arrays
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.engine.device import configure_backends
    from criteo_dlrm.engine.parallel.modes import build_mode
    from criteo_dlrm.engine.training.step import TrainStep

    config = TrainingConfig()
    count = {"all": os.cpu_count(), "1": 1, "default": None}[threads]
    configure_backends(torch.device("cpu"), True, count)
    spec = {**CONFIGURATIONS["default"], "tables": [min(size, 3000) for size in CONFIGURATIONS["default"]["tables"]]}
    torch.manual_seed(0)
    step = TrainStep(build_mode(spec_config(spec), config, torch.device("cpu")), config)
    arrays = synthetic_arrays(40_000, spec["tables"])
    loader = BatchLoader(arrays, config.batch_size.train, shuffle=True)

    def batches():
        epoch = 0
        while True:
            yield from loader.batches(epoch=epoch)
            epoch += 1

    stream = batches()
    for _ in range(20):
        step(next(stream), 0, 1)
    start, rows = time.perf_counter(), 0
    for _ in range(steps):
        batch = next(stream)
        step(batch, 0, 1)
        rows += len(batch)
    return rows / (time.perf_counter() - start)


def _run(setting: dict, steps: int) -> float:
    env = {**os.environ, **setting["env"]}
    command = [*child_command(__spec__.name), "--measure", setting["threads"], "--steps", str(steps)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(result.stdout.strip().splitlines()[-1])["samples_per_second"]


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--steps", "5", "--repeats", "1", "--loads", "idle"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS), help="the machine's states measured")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps({"samples_per_second": measure(args.measure, args.steps)}))
        return

    from benchmarks.harness import describe_machine

    print(f"{os.cpu_count()} cores; the matmul rates at torch's default threads:")
    describe_machine()
    results: dict[tuple[str, str], float] = {}
    for load in args.loads:
        neighbour = None
        if load != "idle":
            neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(1)
        try:
            for _ in range(args.repeats):
                for name, setting in SETTINGS.items():
                    rate = _run(setting, args.steps)
                    results[(load, name)] = max(results.get((load, name), 0.0), rate)
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
    baseline = {load: results[(load, "every core (torch's default)")] for load in args.loads}
    table = Table("threads", *(f"{load}: {what}" for load in args.loads for what in ("samples/s", "x every core")))
    for name in SETTINGS:
        cells = [
            (f"{results[(load, name)]:,.0f}", f"{results[(load, name)] / baseline[load]:.2f}") for load in args.loads
        ]
        table.row(name, *(cell for pair in cells for cell in pair))


if __name__ == "__main__":
    main()
