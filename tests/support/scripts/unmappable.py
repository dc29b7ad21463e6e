"""A GPU script that makes a CUDA call the mapping cannot give a CPU meaning to (``--call``), after its process group
is up and its model on the "GPU"."""

import argparse
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--call", choices=("graph", "external_stream"), default="graph")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = torch.nn.Linear(4, 1).cuda()
    if args.call == "graph":
        side = torch.cuda.CUDAGraph()
    else:
        side = torch.cuda.ExternalStream(0)
    print(model, side)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
