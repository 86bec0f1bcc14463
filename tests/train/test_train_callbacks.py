"""Lightning's and HF Trainer's one-line progress callbacks: a real tiny fit leaves the progress
record with the right step, and the phases were announced while they ran (skipped where the
library is not installed: CI has neither)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clusterddp.progress import read_progress

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="lightning is not installed (pip install lightning)")
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (pip install transformers)")

#: Reads the rank's own record while a phase runs: what the launcher would see then.
PEEK = """
import json, os
def peek(what):
    if not os.path.exists(os.environ["CLUSTERDDP_HEARTBEAT_FILE"]):
        return  # no step completed yet
    with open(os.environ["CLUSTERDDP_HEARTBEAT_FILE"]) as f:
        record = json.loads(f.read())
    with open(os.environ["PEEK_OUT"], "a") as f:
        f.write(json.dumps([what, record["phase"], record["step"], record["compute_s"]]) + "\\n")
"""

LIGHTNING = PEEK + """
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
from clusterddp.train.lightning import ProgressCallback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, index):
        if index == 1:
            peek("training_step")  # the record the first step wrote
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def validation_step(self, batch, _):
        peek("validation_step")
    def on_save_checkpoint(self, checkpoint):
        peek("on_save_checkpoint")
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, val_check_interval=3, limit_val_batches=1,
                    num_sanity_val_steps=0, logger=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=os.environ["OUT"], callbacks=[ProgressCallback()])
trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
"""

HF = PEEK + """
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments
from clusterddp.train.hf import ProgressCallback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def forward(self, x, labels=None):
        out = self.layer(x)
        peek("forward" if self.training else "eval forward")
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

class Data(Dataset):
    def __init__(self):
        self.x, self.y = torch.randn(32, 4), torch.randn(32, 1)
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}

class PeekSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        peek("after the save, before our on_save")  # runs before ProgressCallback (listed first)

args = TrainingArguments(output_dir=os.environ["OUT"], max_steps=6, per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=3, save_strategy="steps",
                         save_steps=3, report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
                         dataloader_num_workers=0)
trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), eval_dataset=Data(),
                  callbacks=[PeekSave(), ProgressCallback()])
trainer.train()
"""


def _run(tmp_path: Path, source: str) -> tuple[Any, list[list[Any]]]:
    script = tmp_path / "train.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERDDP_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CLUSTERDDP_HEARTBEAT_FILE=str(tmp_path / "rank0.heartbeat"), PEEK_OUT=str(tmp_path / "peek.jsonl"),
               OUT=str(tmp_path / "out"), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    peeks = [json.loads(line) for line in (tmp_path / "peek.jsonl").read_text().splitlines()]
    return read_progress(str(tmp_path / "rank0.heartbeat")), peeks


@needs_lightning
def test_lightning_callback_records_steps_and_phases(tmp_path: Path) -> None:
    """A 6-step Lightning fit: record at step 6 with compute time; validation ran as 'eval', the checkpoint save as 'checkpoint'."""
    record, peeks = _run(tmp_path, LIGHTNING)
    assert record is not None and record.step == 6, record
    assert record.phase == "train" and record.last is not None and record.last[0] == "checkpoint", record
    seen = [(what, phase, step) for what, phase, step, _ in peeks]
    assert ("validation_step", "eval", 3) in seen and ("validation_step", "eval", 6) in seen, peeks
    assert ("on_save_checkpoint", "checkpoint", 6) in seen, peeks
    first = next(p for p in peeks if p[0] == "training_step")
    assert first[1:3] == ["train", 1] and first[3] > 0, peeks  # the rank's own work, measured


@needs_transformers
def test_hf_callback_records_steps_and_phases(tmp_path: Path) -> None:
    """A 6-step HF Trainer run: record at step 6 with compute time; evaluation ran as 'eval', the save as 'checkpoint'."""
    record, peeks = _run(tmp_path, HF)
    assert record is not None and record.step == 6, record
    assert record.phase == "train" and record.last is not None and record.last[0] == "checkpoint", record
    seen = [(what, phase, step) for what, phase, step, _ in peeks]
    assert ("eval forward", "eval", 3) in seen and ("eval forward", "eval", 6) in seen, peeks
    assert ("after the save, before our on_save", "checkpoint", 3) in seen, peeks
    assert ("after the save, before our on_save", "checkpoint", 6) in seen, peeks
    first = next(p for p in peeks if p[0] == "forward" and p[2] == 1)
    assert first[1] == "train" and first[3] > 0, peeks  # the rank's own work, measured


def test_importing_the_callback_modules_imports_neither_library() -> None:
    """clusterddp.train.lightning and .hf import lightning/transformers only when the callback is first used."""
    code = ("import sys, clusterddp.train.lightning, clusterddp.train.hf, clusterddp.train; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
