"""A worker that only joins a gloo process group, passes a barrier and leaves (the floor's unit)."""
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
