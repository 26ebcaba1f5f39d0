"""One rank of a gloo all-reduce, started by srun (ranks from enroot's hook's variables) or
torchrun (its own): env:// rendezvous; prints `ALLREDUCE {json}` with what the rank saw."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print("ALLREDUCE " + json.dumps({
    "rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item(),
    "local_rank": os.environ.get("LOCAL_RANK"), "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}), flush=True)
dist.destroy_process_group()
