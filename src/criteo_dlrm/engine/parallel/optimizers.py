"""The optimisers a parallel mode steps in its process: built from the config's choices, stepped, scaled by the
learning-rate schedule, their state written and restored together."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from criteo_dlrm.config.training import DENSE_OPTIMIZERS, TrainingConfig
from criteo_dlrm.models.dlrm import DLRM

# torch's fused kernels (one pass over every tensor, instead of a loop of elementwise operations per tensor) for the
# dense optimisers: the Kaggle-like step on one CPU thread 15% more samples/s in fp32 with Adam (the optimiser 0.3
# ms instead of 1.1). Adagrad's is CPU-only in the torch releases we support.
_FUSED_ON = {"Adam": ("cpu", "cuda"), "SGD": ("cpu", "cuda"), "Adagrad": ("cpu",)}


def _fused(name: str, parameters: list[torch.Tensor]) -> dict:
    """``fused=True`` where torch has the kernel for optimiser ``name`` on the parameters' device."""
    return {"fused": True} if parameters and parameters[0].device.type in _FUSED_ON.get(name, ()) else {}


def summed_rows(gradient: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse row gradient (one index per looked-up row, duplicates allowed) -> (rows, values): each row once,
    ascending, its values summed. ``torch.unique`` and ``index_add_``: 2.5 ms for the Kaggle-like step's 53,248
    lookups of 16 values on one CPU thread, where ``coalesce()`` takes 6.7. On a GPU ``coalesce()`` (a sort), as
    ``index_add_`` there adds duplicates in no fixed order: the same run would not give the same weights twice."""
    if gradient.is_coalesced() or gradient.device.type != "cpu":
        gradient = gradient.coalesce()
        return gradient._indices()[0], gradient._values()
    indices, values = gradient._indices()[0], gradient._values()
    rows, inverse = torch.unique(indices, return_inverse=True)
    return rows, values.new_zeros((rows.numel(), *values.shape[1:])).index_add_(0, inverse, values)


class SparseAdam(torch.optim.SparseAdam):
    """``torch.optim.SparseAdam``'s update, state and checkpoints, computed on the rows a step touched: the
    gradient's rows summed (``summed_rows``), their moments and weights gathered, updated by SparseAdam's own
    operations in its order, and written back. torch's coalesces the gradient and masks each moment with sparse
    operations: for the Kaggle-like step's lookups on one CPU thread its step took 7.9-10.1 ms, this one 3.7-4.0, in
    one run (the same weights within float32 rounding: only the order duplicate rows' gradients are summed in
    differs)."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                gradient = parameter.grad
                if gradient is None:
                    continue
                if not gradient.is_sparse or gradient.sparse_dim() != 1:
                    raise RuntimeError(f"SparseAdam needs sparse row gradients, got a {gradient.layout} one")
                state = self.state[parameter]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["step"] += 1
                rows, values = summed_rows(gradient)
                if rows.numel() == 0:
                    continue
                if group.get("maximize", False):
                    values = -values
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                old_exp_avg = exp_avg.index_select(0, rows)
                old_exp_avg_sq = exp_avg_sq.index_select(0, rows)
                new_exp_avg = values.sub(old_exp_avg).mul_(1 - beta1).add_(old_exp_avg)
                new_exp_avg_sq = values.pow(2).sub_(old_exp_avg_sq).mul_(1 - beta2).add_(old_exp_avg_sq)
                exp_avg.index_copy_(0, rows, new_exp_avg)
                exp_avg_sq.index_copy_(0, rows, new_exp_avg_sq)
                denom = new_exp_avg_sq.sqrt_().add_(group["eps"])
                step = state["step"]
                step_size = float(group["lr"]) * math.sqrt(1 - beta2**step) / (1 - beta1**step)
                parameter.index_add_(0, rows, new_exp_avg.div_(denom).mul_(-step_size))
        return loss


def build_optimizers(model: DLRM, config: TrainingConfig) -> dict[str, torch.optim.Optimizer]:
    """The dense layers' optimiser (``config.dense_optimizer``: Adam, Adagrad or SGD, torch's fused kernel where it
    has one); the embeddings' from ``config.embedding_optimizer`` (its ``torch.optim`` class in
    ``EMBEDDING_OPTIMIZERS``; with TorchRec the tables' is fused into backward instead)."""
    if config.optimizer.whole_model:  # the predecessor's way: Adam over every table row, every step
        parameters = list(model.parameters())
        return {"dense": torch.optim.Adam(parameters, lr=config.learning_rate, **_fused("Adam", parameters))}
    name = DENSE_OPTIMIZERS[config.dense_optimizer]
    parameters = list(model.dense_parameters())
    dense = getattr(torch.optim, name)(parameters, **config.dense_optimizer_args(), **_fused(name, parameters))
    optimizers = {"dense": dense}
    if not config.embedding_backend.sharded:
        embeddings = (
            SparseAdam if config.optimizer.torch == "SparseAdam" else getattr(torch.optim, config.optimizer.torch)
        )
        optimizers["embeddings"] = embeddings(model.embedding_parameters(), **config.embedding_optimizer_args())
    return optimizers


class Optimizers:
    """The optimisers a mode steps in this process, by name (``dense``, and ``embeddings`` unless dense Adam
    covers everything or TorchRec fuses the tables' into backward), with the base learning rates that warm-up and
    decay scale.

    Args:
        fused: TorchRec's fused optimiser of the sharded tables (it updates them inside backward): scaled and
            reported with the others (``embedding_learning_rate``), never stepped, zeroed or written here.
    """

    def __init__(self, model: DLRM, config: TrainingConfig, fused: torch.optim.Optimizer | None = None):
        self.by_name = build_optimizers(model, config)
        self.base_rates = {name: [g["lr"] for g in opt.param_groups] for name, opt in self.by_name.items()}
        self.fused, self.fused_base_rate = fused, config.embedding_learning_rate

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __getitem__(self, name: str) -> torch.optim.Optimizer:
        return self.by_name[name]

    def scale(self, factor: float) -> None:
        """Every optimiser at its base rate times ``factor`` (the fused one from the next backward on)."""
        for name, optimizer in self.by_name.items():
            for group, base in zip(optimizer.param_groups, self.base_rates[name], strict=True):
                group["lr"] = base * factor
        if self.fused is not None:
            for group in self.fused.param_groups:
                group["lr"] = self.fused_base_rate * factor
            self.fused.step()  # a fused optimiser's step only hands the rate to its kernels: the update ran in backward

    def rates(self) -> dict[str, float]:
        """The current rates, for the logs: ``learning_rate`` and ``embedding_learning_rate``."""
        rates = {"learning_rate": self.by_name["dense"].param_groups[0]["lr"]}
        embeddings = self.by_name.get("embeddings", self.fused)
        if embeddings is not None:
            rates["embedding_learning_rate"] = embeddings.param_groups[0]["lr"]
        return rates

    def zero_grad(self) -> None:
        for optimizer in self.by_name.values():
            optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        for optimizer in self.by_name.values():
            optimizer.step()

    def state_dict(self) -> dict:
        """Each optimiser's state, the live tensors (written at once, before the next step changes them)."""
        return {name: optimizer.state_dict() for name, optimizer in self.by_name.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, optimizer in self.by_name.items():
            optimizer.load_state_dict(state[name])
