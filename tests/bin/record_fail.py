"""A torchrun-style script: env:// init, @record, and rank 1 raises a ValueError after a barrier."""

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("bad batch shape in rank one")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
