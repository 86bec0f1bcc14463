"""A gloo script that never destroys its process group: init, 20 all_reduces, print, return.

Under plain Python a gloo thread can abort such a process at interpreter exit
(pytorch/pytorch#190489, SIGABRT); the bootstrap's end without finalization must not.
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1000)
for _ in range(20):
    dist.all_reduce(t)
print(f"rank {dist.get_rank()} done {t[0].item():.0f}")
