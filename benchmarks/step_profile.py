"""Where a training step's time goes: the Kaggle-like model's step (``training.py``) per phase, fp32 and bf16, on
one thread, from torch's profiler.

Phases: the batch cut from the rows (data); the forward pass of the lookups, the dense MLP, the interaction and
the prediction MLP (each module's own time); the loss; the backward pass of each, by the autograd node it runs
(``AddmmBackward0`` and ``ReluBackward0`` count to the MLPs, ``EmbeddingBackward0`` to the lookups,
``PairwiseDotsBackward`` and the reshapes around it to the interaction); the embedding and dense optimisers' steps and ``zero_grad``.

    python -m benchmarks.step_profile [--steps 20] [--threads 1]
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.harness import Arguments, Table, describe_machine
from benchmarks.training import CONFIGURATIONS, flops_per_sample, spec_config, spec_training, synthetic_arrays
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.parallel.modes import mode_around
from criteo_dlrm.engine.training.step import TrainStep
from criteo_dlrm.models import DLRM

SPEC = CONFIGURATIONS["kaggle-like"]
MODULES = {"embeddings": "lookups", "dense_mlp": "dense MLP", "interaction": "interaction",
           "prediction_mlp": "prediction MLP"}  # fmt: skip
# Autograd nodes by the phase whose forward made them (the MLPs' two share their node names).
BACKWARD = {
    "lookups": ("Embedding", "EmbeddingBag", "IndexBackward", "AddBackward0"),
    "MLPs": ("Addmm", "Relu", "TBackward", "Mm"),
    "interaction": (
        "PairwiseDots",
        "Bmm",
        "IndexSelect",
        "Cat",
        "Unsqueeze",
        "Transpose",
        "View",
        "Reshape",
        "Flatten",
        "Squeeze",
    ),
    "loss": ("BinaryCrossEntropy", "Mean", "Mul", "Div"),
    "bf16 casts": ("ToCopy",),
}
ORDER = ["data", "lookups", "dense MLP", "interaction", "prediction MLP", "loss", "lookups backward",
         "MLPs backward", "interaction backward", "loss backward", "bf16 casts backward", "other backward",
         "embedding optimiser", "dense optimiser", "zero_grad"]  # fmt: skip


def _scoped(model: DLRM) -> None:
    """Each of the model's parts runs inside a profiler scope of its name."""
    for name, label in MODULES.items():
        module, scopes = getattr(model, name), []

        def enter(_module, _inputs, label=label, scopes=scopes):
            scopes.append(record_function(f"forward: {label}"))
            scopes[-1].__enter__()

        def leave(_module, _inputs, _output, scopes=scopes):
            scopes.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)


def _phase(event_name: str) -> str | None:
    if event_name == "data":
        return "data"
    if event_name.startswith("forward: "):
        return event_name.removeprefix("forward: ")
    if event_name == "aten::binary_cross_entropy_with_logits":
        return "loss"
    if event_name.startswith("autograd::engine::evaluate_function: "):
        node = event_name.split(": ", 1)[1]
        for phase, prefixes in BACKWARD.items():
            if node.startswith(prefixes):
                return f"{phase} backward"
        return "other backward"
    if event_name.startswith("Optimizer.step#"):
        return "embedding optimiser" if "Sparse" in event_name or "Adagrad" in event_name else "dense optimiser"
    if event_name.startswith("Optimizer.zero_grad#"):
        return "zero_grad"
    return None


def profile_step(precision: str, steps: int) -> tuple[dict, float]:
    """Milliseconds per step of each phase, and the samples/s of the profiled steps."""
    torch.manual_seed(0)
    settings = spec_training(SPEC, precision=precision)
    model = DLRM(spec_config(SPEC), sparse_gradients=settings.sparse_gradients)
    _scoped(model)
    step = TrainStep(mode_around(model, settings, torch.device("cpu")), settings)
    arrays = synthetic_arrays(200_000, SPEC["tables"])
    loader = BatchLoader(arrays, settings.batch_size.train, shuffle=True)

    def batches():
        for epoch in range(1000):
            yield from loader.batches(epoch=epoch)

    stream = batches()
    for _ in range(3):
        step(next(stream), 0, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            with record_function("data"):
                batch = next(stream)
            step(batch, 0, 1)
        seconds = time.perf_counter() - started
    phases: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if (phase := _phase(event.name)) is not None:
            phases[phase] += event.cpu_time_total / 1000 / steps  # us -> ms a step
    phases["step (wall)"] = 1000 * seconds / steps
    return phases, steps * settings.batch_size.train / seconds


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--steps", "2"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fp32_rate, bf16_rate = describe_machine()
    flops = flops_per_sample(spec_config(SPEC))
    results = {precision: profile_step(precision, args.steps) for precision in ("fp32", "bf16")}
    print(f"Kaggle-like model, batch {spec_training(SPEC).batch_size.train:,}, {args.steps} profiled steps, "
          f"{args.threads} thread(s); ms a step (share of the step):\n")  # fmt: skip
    table = Table("phase", "fp32", "bf16")
    for phase in [*ORDER, "step (wall)"]:
        cells = []
        for phases, _ in results.values():
            wall = phases["step (wall)"]
            value = phases.get(phase, 0.0)
            cells.append(f"{value:.2f}" if phase == "step (wall)" else f"{value:.2f} ({value / wall:.0%})")
        table.row(phase, *cells)
    print()
    for precision, (_, rate) in results.items():
        limit = (fp32_rate if precision == "fp32" else bf16_rate) * 1e9 / flops
        print(f"{precision}: {rate:,.0f} samples/s, {rate / limit:.0%} of its matmul limit ({limit:,.0f} samples/s)")


if __name__ == "__main__":
    main()
