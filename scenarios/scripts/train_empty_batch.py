"""The empty-batch scenario as the training script a team launches with torchrun: no ddpfaults calls.

It trains the set-prediction toy on batches from a ``DataLoader`` (``(points, [target, ...])``, one per step);
the ``EmptyBatch`` fault empties one batch at the DataLoader seam (every target keeps its schema, with no
instance). ``--strategy`` picks the field's shortcut or the fix, as in ``scenario_empty_batch.py``.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from ddpfaults import remedies
from ddpfaults.toy.data import make_batch, make_scene, stack_point2segment
from ddpfaults.toy.models import SetCriterion, SetPredictionModel, state_digest


class LocalCriterion(SetCriterion):
    """The set criterion without its ``num_masks`` all_reduce."""

    def _reduce_num_masks(self, num_masks):
        return torch.clamp(num_masks, min=1)


class Batches(Dataset):
    """One ready-made batch per step (the DataLoader hands them out as they are: ``batch_size=None``)."""

    def __init__(self, seed, rank, steps):
        self.seed, self.rank, self.steps = seed, rank, steps

    def __len__(self):
        return self.steps

    def __getitem__(self, step):
        return make_batch(seed=self.seed, rank=self.rank, step=step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="fixed", choices=("early_return", "skip_backward", "fixed"))
    parser.add_argument("--find-unused", action="store_true")
    parser.add_argument("--local-criterion", action="store_true", help="the criterion without its all_reduce")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = SetPredictionModel(seed=args.seed)
    ddp = DistributedDataParallel(model, find_unused_parameters=args.find_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = LocalCriterion() if args.local_criterion else SetCriterion()
    reference = make_scene(seed=args.seed, index=0)[1]
    for points, targets in DataLoader(Batches(args.seed, dist.get_rank(), args.steps), batch_size=None):
        is_empty = all(len(t["labels"]) == 0 for t in targets)
        if args.strategy == "fixed":
            if remedies.all_ranks_empty(is_empty):
                continue
            if is_empty:
                targets = remedies.fake_targets(reference, targets)
        outputs = ddp(points, stack_point2segment(targets))
        if is_empty and args.strategy == "skip_backward":
            continue
        if is_empty and args.strategy != "fixed":
            loss = outputs["pred_logits"].sum() * 0
        else:
            loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"replica digest: {state_digest(model)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
