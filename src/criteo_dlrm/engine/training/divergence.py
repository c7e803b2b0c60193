"""A run that diverged stops with a message that says where, and whether its rows are to blame.

Every process sees the same losses (averaged over the processes) and the same answer on the weights, so all
stop together; before a run is called diverged, the rows it read are verified again, whole.
"""

from __future__ import annotations

import torch
from loguru import logger

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.data.batches import BatchLoader


class TrainingDivergedError(UserError, RuntimeError):
    """The loss became NaN or infinite."""


class DivergenceCheck:
    """Checks of a run's losses and weights; ``kept`` says where its last good state is (a callable: the
    in-progress checkpoint may be written after this is made)."""

    def __init__(self, mode, loaders: list[BatchLoader], kept):
        self.mode, self.loaders, self.kept = mode, loaders, kept

    def losses(self, losses: list[torch.Tensor], step: int) -> torch.Tensor:
        """The losses of the steps up to ``step`` as one CPU tensor (averaged over the processes); raises
        ``TrainingDivergedError`` naming the first non-finite step."""
        values = torch.stack(losses).float() if losses else torch.zeros(0, device=self.mode.device)
        values = self.mode.group.mean(values).cpu()
        if not torch.isfinite(values).all():
            bad_step = step - len(values) + int(torch.nonzero(~torch.isfinite(values))[0]) + 1
            raise TrainingDivergedError(
                f"Training diverged: the loss is {values[~torch.isfinite(values)][0].item()} at step {bad_step:,}."
                f"{self._rows_verified()}{self.kept()} Lower learning_rate / embedding_learning_rate, or add "
                "warm-up (warmup_steps)."
            )
        return values

    def weights(self, step: int) -> None:
        """Raises ``TrainingDivergedError`` when a weight is NaN or infinite (the same answer in every process)."""
        if not self.mode.weights_finite():
            raise TrainingDivergedError(
                f"Training diverged: the weights are NaN or infinite at step {step:,} although every loss "
                f"was finite.{self._rows_verified()}{self.kept()} Lower the learning rates or add warm-up."
            )

    def _rows_verified(self) -> str:
        """Before a run is called diverged: its rows verified again, whole (each chunk is verified on its first
        read only, so damage done since, read again in a later epoch, would look like a learning rate too high).

        Raises:
            DamagedFileError: the rows are damaged (naming the file, its rows and the fix), instead of divergence.
        """
        digests = [loader.arrays.digests for loader in self.loaders]
        digests = [found for found in digests if found is not None]  # stored rows (rows in memory have none)
        if not digests:
            return ""
        logger.info("not finite: verifying the rows read again, whole, before calling it divergence")
        for found in digests:
            found.check_again()
        return " The rows it read were verified again, whole, and are intact."
