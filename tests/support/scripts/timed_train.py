"""A plain torchrun training script, no ddpfaults import: DDP on a small Linear, SGD steps of about 50 ms for
``--seconds`` (a healthy job that may outlast its deadline). ``--stuck-rank R --stuck-step S``: rank R sleeps for
ten minutes, outside any collective, once it reaches step S; its peers wait for it in DDP's gradient all_reduce."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--stuck-rank", type=int, default=None)
    parser.add_argument("--stuck-step", type=int, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    end, step = time.monotonic() + args.seconds, 0
    while time.monotonic() < end:
        if dist.get_rank() == args.stuck_rank and step == args.stuck_step:
            # fixed: stands for "never returns": the test ends it (a signal, a kill, the judge) long before
            time.sleep(600)
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        # fixed: a healthy job's pace (50 ms steps, mostly asleep: it leaves the CPU to other tests); the timeout
        # tests need it training, not any number of steps
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
