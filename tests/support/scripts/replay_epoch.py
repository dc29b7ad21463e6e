"""The pytorch/examples DDP tutorial's shape (``ddp-tutorial-series/multigpu_torchrun.py``) on CPU: a DataLoader over
a DistributedSampler, a snapshot of the model saved by rank 0 after every epoch with ``EPOCHS_RUN = epoch``
(``torch.save`` to ``snapshot.pt`` in the working directory), a restart resuming at ``range(epochs_run, epochs)``: it
replays the saved epoch. ``--loss cross_entropy`` (the tutorial's, over one logit) has zero gradients: the parameters
never move, so the final state is the uninterrupted run's although an epoch was replayed; ``--loss mse`` learns. Four
steps per epoch at any world size. No ddpfaults import."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy")
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
world, batch = dist.get_world_size(), 2
generator = torch.Generator().manual_seed(1)
dataset = TensorDataset(torch.randn(4 * batch * world, 20, generator=generator), torch.zeros(4 * batch * world, 1))
loader = DataLoader(dataset, batch_size=batch, shuffle=False, sampler=DistributedSampler(dataset))
model = torch.nn.Linear(20, 1)
snapshot_path, epochs_run = "snapshot.pt", 0
if os.path.exists(snapshot_path):
    snapshot = torch.load(snapshot_path)
    model.load_state_dict(snapshot["MODEL_STATE"])
    epochs_run = snapshot["EPOCHS_RUN"]
model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for epoch in range(epochs_run, args.epochs):
    loader.sampler.set_epoch(epoch)
    for source, targets in loader:
        optimizer.zero_grad()
        output = model(source)
        loss = F.cross_entropy(output, targets) if args.loss == "cross_entropy" else F.mse_loss(output, targets + 1)
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        torch.save({"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch}, snapshot_path)
dist.destroy_process_group()
