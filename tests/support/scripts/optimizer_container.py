"""A torchrun script whose optimizer is a container that is itself a ``torch.optim.Optimizer`` and steps its inner
optimizers, as LLM training frameworks have (torchtitan's OptimizersContainer): DDP over two parameter groups, one
AdamW and one SGD inside it; ``--steps`` training steps, each one ``step()`` of the container."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Optimizers(torch.optim.Optimizer):
    """One optimizer over its inner optimizers' parameters; ``step()`` steps each of them."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__([p for o in inner for group in o.param_groups for p in group["params"]], {})

    def step(self, closure=None):
        for optimizer in self.inner:
            optimizer.step()

    def zero_grad(self, set_to_none=True):
        for optimizer in self.inner:
            optimizer.zero_grad(set_to_none=set_to_none)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
optimizer = Optimizers(
    [torch.optim.AdamW(model.module[0].parameters()), torch.optim.SGD(model.module[1].parameters(), lr=0.1)]
)
for _ in range(args.steps):
    loss = model(torch.randn(4, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("trained", args.steps)
dist.destroy_process_group()
