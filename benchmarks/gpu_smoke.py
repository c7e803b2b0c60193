"""The GPU smoke test: every CUDA path of ../shared/gpu-risks.md, PASS / FAIL / SKIP with a figure, in one run.

Imports the core only (no Kedro, MLflow or TorchRec needed), so it runs on a bare GPU machine with
``PYTHONPATH=src`` and loguru. Under 10 minutes on one H200 (the compile checks take most of it; --quick leaves
out max-autotune). Without CUDA each check runs its code on the CPU and reports SKIP with what it measured there
(a dry run); a FAIL is an error or a figure outside
its bound. Exit status 1 when any check failed.

    PYTHONPATH=src python -m benchmarks.gpu_smoke [--quick]
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.harness import Arguments, Table
from benchmarks.training import synthetic_arrays
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import Batch, BatchLoader, Prefetcher
from criteo_dlrm.engine.device import configure_backends
from criteo_dlrm.engine.parallel.group import gather_rows_to_main
from criteo_dlrm.engine.parallel.modes import build_mode
from criteo_dlrm.engine.parallel.optimizers import build_optimizers
from criteo_dlrm.engine.trained.metrics import binary_metrics, binary_metrics_torch
from criteo_dlrm.engine.training.loop import Trainer
from criteo_dlrm.engine.training.step import TrainStep

TABLES = [1000 + 37 * f for f in range(26)]
MODEL = {
    "sparse_embedding_sizes": 16,
    "dense_mlp": {"hidden_layer_sizes": [64], "output_size": 16},
    "prediction_hidden_sizes": [64, 32],
    "interaction": "dot",
}
KAGGLE_LIKE = {
    "sparse_embedding_sizes": 16,
    "dense_mlp": {"hidden_layer_sizes": [512, 256, 64], "output_size": 16},
    "prediction_hidden_sizes": [512, 256],
    "interaction": "dot",
}


def config(**training) -> TrainingConfig:
    return TrainingConfig.from_dict({**MODEL, "batch_size": {"train": 256, "validation": 1024}, **training})


def batches(arrays, size: int, count: int) -> list[Batch]:
    loader = BatchLoader(arrays, size, shuffle=True)
    return [batch for _, batch in zip(range(count), loader.batches(epoch=0), strict=False)]


def trained(settings: TrainingConfig, device: torch.device, inputs: list[Batch]) -> tuple[dict, list[float]]:
    """The weights and losses after a step on each of ``inputs`` from seed 0."""
    torch.manual_seed(0)
    mode = build_mode(settings.model_config(TABLES, 0.25), settings, device)
    step = TrainStep(mode, settings)
    losses = [float(step(batch, i, len(inputs))) for i, batch in enumerate(inputs)]
    return {name: t.detach().float().cpu() for name, t in mode.model.state_dict().items()}, losses


# -- the checks: each returns (passed, figure) -------------------------------------------------------------------
def _optimiser_steps(settings: TrainingConfig, device: torch.device, gradients: list[torch.Tensor]) -> torch.Tensor:
    """A table after the embedding optimiser of ``settings`` (this package's, as training builds it) stepped it on
    ``device`` with each of ``gradients``."""
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(gradients[0].shape, device=device))
    optimizer = build_optimizers(_TableOnly(table), settings)["embeddings"]
    for gradient in gradients:
        table.grad = gradient.to(device)
        optimizer.step()
    return table.detach().cpu()


class _TableOnly(torch.nn.Module):
    """A model of one table (and one dense weight, never stepped), for ``build_optimizers``."""

    def __init__(self, table: torch.nn.Parameter):
        super().__init__()
        self.table, self.dense = table, torch.nn.Parameter(torch.zeros(1, device=table.device))

    def embedding_parameters(self) -> list[torch.nn.Parameter]:
        return [self.table]

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        return [self.dense]


def optimisers_against_cpu(device, arrays) -> tuple[bool, str]:
    """SparseAdam, Adagrad (sparse: documented on CPU only) and SGD on ``device``: each steps a table with the same
    sparse gradients (duplicate rows, not coalesced, as a lookup's backward makes them) to the CPU's weights within
    float32 rounding; and SparseAdam and SGD train the model to the CPU's weights. Adagrad's training is not
    compared: its first steps move an element by about its learning rate whatever the gradient's size, so elements
    whose gradient is rounding noise land 2 x lr apart between any two summation orders (fp32 against fp64 on one
    CPU alike; 0.1 at lr 0.05 on the first H200 run)."""
    generator = torch.Generator().manual_seed(1)
    gradients = []
    for _ in range(5):
        rows = torch.randint(0, 1000, (4096,), generator=generator)  # about 4 lookups of each row
        values = torch.randn(4096, 16, generator=generator)
        gradients.append(torch.sparse_coo_tensor(rows[None], values, (1000, 16)))
    worst = {}
    for optimizer in ("sparse_adam", "adagrad", "sgd"):
        settings = config(embedding_optimizer=optimizer, embedding_learning_rate=0.05)
        on_device = _optimiser_steps(settings, device, gradients)
        on_cpu = _optimiser_steps(settings, torch.device("cpu"), gradients)
        worst[f"{optimizer} step"] = float((on_device - on_cpu).abs().max())
    inputs = batches(arrays, 256, 5)
    for optimizer in ("sparse_adam", "sgd"):
        settings = config(embedding_optimizer=optimizer, embedding_learning_rate=0.05)
        on_device, _ = trained(settings, device, inputs)
        on_cpu, _ = trained(settings, torch.device("cpu"), inputs)
        worst[f"{optimizer} training"] = max(float((on_device[k] - on_cpu[k]).abs().max()) for k in on_cpu)
    figure = ", ".join(f"{name} {value:.1e}" for name, value in worst.items())
    passed = all(value < (1e-5 if name.endswith("step") else 1e-3) for name, value in worst.items())
    return passed, f"max |weight difference| after 5 steps: {figure}"


def bf16_against_fp32(device, arrays) -> tuple[bool, str]:
    """bf16 autocast's losses stay within 2% of fp32's over 20 steps."""
    inputs = batches(arrays, 256, 20)
    _, fp32 = trained(config(), device, inputs)
    _, bf16 = trained(config(precision="bf16"), device, inputs)
    gap = max(abs(a - b) / abs(b) for a, b in zip(bf16, fp32, strict=True))
    return gap < 0.02, f"largest relative loss difference over 20 steps: {gap:.2%}"


def auto_precision_probe(device, arrays) -> tuple[bool, str]:
    """``precision: auto``'s step probe on the device: both precisions timed, the device's random state left as it
    was; the figure says what auto would take for this model."""
    from criteo_dlrm.engine.training.precision import STEP_SPEEDUP, measure_step_rates

    settings = config(precision="auto")
    cuda = device.type == "cuda"
    before = torch.cuda.get_rng_state(device) if cuda else torch.get_rng_state()
    rates = measure_step_rates(settings.model_config(TABLES, 0.25), settings, device)
    after = torch.cuda.get_rng_state(device) if cuda else torch.get_rng_state()
    speedup = rates["bf16"] / rates["fp32"]
    chosen = "bf16" if speedup >= STEP_SPEEDUP else "fp32"
    return torch.equal(before, after) and min(rates.values()) > 0, (
        f"bf16 step {speedup:.2f}x fp32 ({rates['bf16'] / 1e6:.2f}M against {rates['fp32'] / 1e6:.2f}M rows/s): "
        f"auto takes {chosen}"
    )


def side_stream_batches(device, arrays) -> tuple[bool, str]:
    """Batches prefetched on a side stream (pinned, copied ahead) are byte-identical to plain copies."""
    loader = BatchLoader(arrays, 512, shuffle=True, pin_memory=device.type == "cuda")
    plain = [batch.to(device) for batch in loader.batches(epoch=1)]
    with Prefetcher(loader.batches(epoch=1), 3, device) as prefetched:
        ahead = list(prefetched)
    same = len(plain) == len(ahead) and all(
        torch.equal(getattr(a, name), getattr(b, name))
        for a, b in zip(plain, ahead, strict=True)
        for name in ("labels", "dense", "sparse")
    )
    return same, f"{len(ahead)} batches compared"


def compile_modes(device, arrays, quick: bool) -> tuple[bool, str]:
    """Each compile mode trains with an odd last batch and predicts at another batch size, as eager does."""
    modes = ["default", "reduce-overhead"] + ([] if quick else ["max-autotune"])
    inputs = batches(arrays, 256, 4) + batches(arrays, 100, 1)  # the last one smaller, as an epoch's last
    _, eager = trained(config(), device, inputs)
    figures, passed = [], True
    from torch._dynamo.utils import counters

    for mode in modes:
        torch._dynamo.reset()
        counters.clear()
        settings = config(compile=True, compile_mode=mode)
        torch.manual_seed(0)
        built = build_mode(settings.model_config(TABLES, 0.25), settings, device)
        step = TrainStep(built, settings)
        started = time.perf_counter()
        losses = [float(step(batch, i, len(inputs))) for i, batch in enumerate(inputs)]
        with torch.no_grad():
            built.model.eval()
            big = batches(arrays, 1024, 1)[0].to(device)
            built.model(big.dense, big.sparse)  # validation's batch size
        gap = max(abs(a - b) for a, b in zip(losses, eager, strict=True))
        graphs = counters["stats"]["unique_graphs"]  # 0: nothing was compiled, the check would pass vacuously
        passed &= gap < 1e-2 and graphs > 0
        figures.append(f"{mode}: loss gap {gap:.1e}, {graphs} graphs, {time.perf_counter() - started:.0f} s")
    return passed, "; ".join(figures)


def checkpoint_memory(device, arrays) -> tuple[bool, str]:
    """Training with in-progress checkpoints at each validation holds the model's state once: peak GPU memory
    over (tables + optimiser state) stays below 1.5x."""
    settings = config(num_epochs=1, validate_every_steps=5, max_steps=15, embedding_optimizer="sparse_adam")
    torch.manual_seed(0)
    # On a GPU 5.2M rows of 16 floats: 333 MB, 1 GB with SparseAdam (the dry run: a tenth).
    tables = [200_000 if device.type == "cuda" else 20_000] * 26
    mode = build_mode(settings.model_config(tables, 0.25), settings, device)
    state = 3 * sum(p.numel() * p.element_size() for p in mode.model.embedding_parameters())
    rows = synthetic_arrays(20_000, tables, seed=3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(mode, settings, BatchLoader(rows, 256, shuffle=True), BatchLoader(rows, 1024),
                          Path(folder) / "run", resume_path=Path(folder) / "progress.pt", fingerprint="smoke")  # fmt: skip
        trainer.fit()
    if device.type != "cuda":
        return True, f"trained and checkpointed 15 steps ({state / 1e9:.2f} GB of tables and state)"
    peak = torch.cuda.max_memory_allocated(device) - base
    return peak < 1.5 * state, f"peak GPU memory {peak / 1e9:.2f} GB for {state / 1e9:.2f} GB of tables and state"


_KEPT: list = []


def nccl_world_of_one(device, arrays) -> tuple[bool, str]:
    """NCCL in a group of one: an all-reduce, the validation gather to rank 0 and a DDP step."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        value = torch.ones(3, device=device)
        dist.all_reduce(value)
        [gathered] = gather_rows_to_main(1, 0, torch.arange(5.0, device=device))
        settings = config()
        torch.manual_seed(0)
        model = build_mode(settings.model_config(TABLES, 0.25), settings, device).model
        ddp = torch.nn.parallel.DistributedDataParallel(
            model.dense_mlp, device_ids=[device.index] if device.type == "cuda" else None
        )
        ddp(torch.randn(8, 13, device=device)).sum().backward()
        # Kept until the process ends (os._exit, no destructors): freeing the DDP's reducer destroys its gloo group
        # while this thread holds the GIL, and the group's worker thread, finishing the backward's all-reduce,
        # waits for the GIL to free a Python object: a deadlock seen in the stack of a hung dry run.
        _KEPT.append(ddp)
        ok = bool(value.eq(1).all()) and gathered.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        dist.destroy_process_group()
    return ok, f"{backend}: all-reduce, gather to rank 0, a DDP backward"


def _two_process_worker(rank: int, folder: str, device_type: str) -> None:
    # A file in the run's own folder, not a TCP port probed free and then bound: nothing else can take it between
    # the two, and a rank that never comes fails after the timeout instead of waiting half an hour.
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    device = torch.device("cuda:0" if device_type == "cuda" else "cpu")
    settings = config(embedding_optimizer="sgd", embedding_learning_rate=0.05)
    arrays = synthetic_arrays(4096, TABLES)
    weights, _ = trained(settings, device, batches(arrays, 256, 4))
    torch.save(weights, Path(folder) / f"rank{rank}.pt")
    dist.destroy_process_group()


def two_processes_over_gloo(device, arrays) -> tuple[bool, str]:
    """Two processes over gloo with CUDA tensors (NCCL refuses two ranks on one GPU): DDP's all-reduce and the
    sparse gradients' all-gather leave both replicas with the same weights."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_two_process_worker, args=(folder, device.type), nprocs=2, join=True)
        first, second = (torch.load(Path(folder) / f"rank{r}.pt") for r in (0, 1))
    gap = max(float((first[k] - second[k]).abs().max()) for k in first)
    return gap == 0.0, f"max |difference| between the replicas after 4 steps: {gap:.1e}"


def exact_metrics_on_device(device, arrays) -> tuple[bool, str]:
    """Exact AUC on the device's tensors equals numpy's, and the log loss within float32 rounding; rows/s on 20M
    rows."""
    rng = np.random.default_rng(0)
    rows = 20_000_000 if device.type == "cuda" else 2_000_000
    labels = rng.random(rows) < 0.03
    scores = (rng.random(rows, dtype=np.float32) * 0.2 + labels * 0.05).astype(np.float32)
    expected = binary_metrics(labels, scores)
    on_device_labels, on_device_scores = torch.from_numpy(labels).to(device), torch.from_numpy(scores).to(device)
    binary_metrics_torch(on_device_labels, on_device_scores)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    found = binary_metrics_torch(on_device_labels, on_device_scores)
    seconds = time.perf_counter() - started
    # The AUC counts pairs: exact. Each row's logarithm is taken in float32 by either library: within its rounding.
    auc_gap, loss_gap = abs(found.auc - expected.auc), abs(found.log_loss / expected.log_loss - 1)
    return auc_gap < 1e-12 and loss_gap < 1e-6, (
        f"AUC |difference| from numpy {auc_gap:.1e}, log loss relative {loss_gap:.1e}; {rows / seconds / 1e6:,.0f}M rows/s"
    )


def loader_against_step(device, arrays) -> tuple[bool, str]:
    """The loader's rows/s (pinned, one thread) against the Kaggle-like model's step on the device (batch 8192)."""
    settings = TrainingConfig.from_dict({**KAGGLE_LIKE, "batch_size": {"train": 8192}})
    loader = BatchLoader(arrays, 8192, shuffle=True, pin_memory=device.type == "cuda")
    started = time.perf_counter()
    rows = sum(len(batch) for batch in loader.batches(epoch=2))
    loader_rate = rows / (time.perf_counter() - started)
    torch.manual_seed(0)
    mode = build_mode(settings.model_config(TABLES, 0.25), settings, device)
    step = TrainStep(mode, settings)
    inputs = [batch.to(device) for batch in batches(arrays, 8192, 8)]
    step(inputs[0], 0, 8)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for i, batch in enumerate(inputs[1:]):
        step(batch, i, 8)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_rate = 7 * 8192 / (time.perf_counter() - started)
    return True, f"loader {loader_rate / 1e6:.2f}M rows/s, step {step_rate / 1e6:.2f}M rows/s"


def tf32_switches(device, arrays) -> tuple[bool, str]:
    """The TF32 switches (torch's legacy flags) set without an error, and the warnings they raise."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_backends(device, allow_tf32=True, num_threads=None)
        a = torch.randn(256, 256, device=device)
        (a @ a).sum().item()
    return True, f"{len(caught)} warning(s){': ' + str(caught[0].message)[:120] if caught else ''}"


def torchrec_on_device(device, arrays) -> tuple[bool, str] | str:
    """TorchRec's sharded tables in a Trainer with resume on (its weights checked over the group as it is built, the
    path NCCL refused a CPU tensor on), 10 steps with an in-progress checkpoint and validation (needs a TorchRec and
    FBGEMM built for the device)."""
    if importlib.util.find_spec("torchrec") is None or importlib.util.find_spec("fbgemm_gpu") is None:
        return "TorchRec or FBGEMM is not installed here"
    from criteo_dlrm.engine.parallel.modes import ShardedTables

    settings = config(embedding_backend="torchrec", embedding_optimizer="rowwise_adagrad", num_epochs=1,
                      max_steps=10, validate_every_steps=5)  # fmt: skip
    rows = synthetic_arrays(4096, TABLES, seed=4)
    with ShardedTables.process_group(device), tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        mode = build_mode(settings.model_config(TABLES, 0.25), settings, device)
        trainer = Trainer(mode, settings, BatchLoader(rows, 256, shuffle=True), BatchLoader(rows, 1024),
                          Path(folder) / "run", resume_path=Path(folder) / "progress.pt", fingerprint="smoke")  # fmt: skip
        result = trainer.fit()
    losses = [entry.log_loss for entry in result.history]
    return all(np.isfinite(losses)), f"10 steps, validation log loss {losses[0]:.4f} -> {losses[-1]:.4f}"


CHECKS: dict[str, Callable] = {
    "SparseAdam / Adagrad / SGD on the device against the CPU": optimisers_against_cpu,
    "bf16 autocast against fp32": bf16_against_fp32,
    "precision: auto's step probe on the device": auto_precision_probe,
    "pinned side-stream batches byte-identical": side_stream_batches,
    "compile modes with an odd last batch": compile_modes,
    "in-progress checkpoints: GPU memory": checkpoint_memory,
    "NCCL at world size 1": nccl_world_of_one,
    "two processes over gloo with CUDA tensors": two_processes_over_gloo,
    "exact metrics on the device": exact_metrics_on_device,
    "loader rows/s against the step's": loader_against_step,
    "TF32 switches": tf32_switches,
    "TorchRec on the device": torchrec_on_device,
}


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--quick"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--quick", action="store_true", help="leave out max-autotune (minutes to compile)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "no CUDA: a dry run on the CPU"
    print(f"{name}; torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M %Z')}\n")
    table = Table("check", "result", "figure", align="lll")
    arrays = synthetic_arrays(200_000, TABLES)
    failed = 0
    for title, check in CHECKS.items():
        started = time.perf_counter()
        try:
            outcome = check(device, arrays, args.quick) if check is compile_modes else check(device, arrays)
        except Exception as error:  # a check that breaks is a finding, not the end of the run
            outcome = (False, f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
            traceback.print_exc(file=sys.stderr)
        if isinstance(outcome, str):
            result, figure = "SKIP", outcome
        else:
            passed, figure = outcome
            result = "PASS" if passed else "FAIL"
            if not cuda:  # what the dry run measured on the CPU claims nothing about CUDA
                result, figure = ("SKIP" if passed else "FAIL"), f"no CUDA (ran on the CPU: {figure})"
        failed += result == "FAIL"
        table.row(title, result, f"{figure} ({time.perf_counter() - started:.0f} s)")
    sys.stdout.flush()
    sys.stderr.flush()
    # At once: with its output a pipe, this process hung at exit after the checks, in the teardown of what they
    # started (process groups, TorchRec's kernels), for as long as a caller waited.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
