"""clusterddp.train.fit on a tiny MLP with checkpoints and evaluation every epoch; argv: STEP_DELAY
EPOCHS [KILL_STEP]: rank 1 SIGKILLs itself at step KILL_STEP of the first attempt (a fault to restart)."""
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from clusterddp import train as T

delay, epochs = float(sys.argv[1]), int(sys.argv[2])
kill_step = int(sys.argv[3]) if len(sys.argv) > 3 else -1
calls = 0


def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    global calls
    calls += 1
    time.sleep(delay)
    if calls == kill_step and os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return nn.functional.cross_entropy(outputs, targets)


def main() -> None:
    ctx = T.init_distributed()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 8, generator=g), torch.randint(0, 4, (512,), generator=g))
    torch.manual_seed(1)
    model = T.prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = T.make_train_loader(data, 16, ctx, num_workers=0)
    T.fit(model, optimizer, loader, criterion, ctx,
          T.FitConfig(epochs=epochs, checkpoint_dir=os.environ.get("CKPT_DIR", "ckpt"), resume="auto"),
          eval_loader=T.make_eval_loader(data, 64, ctx, num_workers=0))
    T.cleanup()


if __name__ == "__main__":
    T.run_main(main)
