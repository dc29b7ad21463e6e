"""A plain PyTorch Lightning training script, no ddpfaults import: a tiny LightningModule (an MLP regression), a
DataLoader over a TensorDataset (Lightning adds the DistributedSampler) and
``Trainer(accelerator="cpu", strategy="ddp", devices=N)``, which detects torchrun's worker environment
(``TorchElasticEnvironment``) and joins the world torchrun started instead of spawning its own processes.

``--strategy naive`` has ``training_step`` return ``None`` for a batch with no samples, Lightning's documented way
to skip a batch, which Lightning refuses under DDP (``RuntimeError: Skipping the `training_step` by returning None
in distributed training is not supported``) while the other ranks are already in their gradient all_reduce;
``detached`` returns a zero loss that is not connected to the model (the usual workaround for that error), so
no gradient reaches DDP and that rank skips its gradient all_reduce; ``fixed`` returns a zero loss over the whole
graph, so that rank's gradient all_reduce still happens.
``--empty-rank R --empty-step S`` makes the script empty that rank's batch at that training step (the batch the
step trains on) itself: how the ground truth is measured under plain ``torchrun``, where no ddpfaults fault exists.
"""

import argparse
import os

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self, strategy, empty_rank, empty_step):
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.skip, self.empty_rank, self.empty_step = strategy, empty_rank, empty_step

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == self.empty_rank and self.global_step == self.empty_step:
            x, y = x[:0], y[:0]
        if len(x) == 0:
            if self.skip == "naive":
                return None  # "skip this batch": Lightning's single-process idiom
            if self.skip == "detached":
                return torch.zeros((), requires_grad=True)  # a loss, but not over the model
            return self.model(x).sum() * 0.0
        return torch.nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("naive", "detached", "fixed"), default="naive")
    parser.add_argument("--devices", type=int, default=None, help="default: WORLD_SIZE (torchrun's)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=4, help="batches per rank per epoch")
    parser.add_argument("--empty-rank", type=int, default=None)
    parser.add_argument("--empty-step", type=int, default=None)
    args = parser.parse_args()

    devices = args.devices or int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    samples = 4 * args.batches * devices
    data = TensorDataset(torch.randn(samples, 8), torch.randn(samples, 1))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=devices,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = Regression(args.strategy, args.empty_rank, args.empty_step)
    trainer.fit(model, loader)
    environment = type(trainer.strategy.cluster_environment).__name__
    print(f"rank {trainer.global_rank} of {trainer.world_size} ({environment}) done after {trainer.global_step} steps")


if __name__ == "__main__":
    main()
