"""A plain torchrun script with no DataLoader, as nanoGPT draws its batches: random offsets (``torch.randint``)
into one token array, DDP, AdamW. A fault acting on DataLoader batches has nothing to act on here."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    tokens = torch.randint(0, 16, (256,))
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(4):
        at = torch.randint(0, len(tokens) - 9, (4,))
        x = torch.stack([tokens[i : i + 8] for i in at])
        y = torch.stack([tokens[i + 1 : i + 9] for i in at])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
