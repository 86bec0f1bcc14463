"""Distributed inference with clusterddp.train: per-rank shards, one merged file (jobs/infer.yaml).

Every rank predicts its unpadded slice of the CIFAR-10 test set (or the same generated
stand-in jobs/cifar10.py uses), writes ``OUT/shards/predictions.rankNNNNN.jsonl``, and
rank 0 merges them into ``OUT/predictions.jsonl``: one row per image, in data-set order,
none repeated, none missing. Weights come from the cifar10 job's checkpoint when it exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import cifar10  # jobs/cifar10.py, beside this script: same model and data
from clusterddp import train as T


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="runs/cifar10/checkpoints/last.pt",
                   help="weights from jobs/cifar10.py (random weights if absent, and it says so)")
    p.add_argument("--data-dir", default="data/cifar10")
    p.add_argument("--out-dir", default="runs/infer")
    p.add_argument("--width", type=int, default=16, help="must match the checkpoint's model")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--synthetic-test", type=int, default=257,
                   help="stand-in test-set size when CIFAR-10 is absent (odd on purpose)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    ctx = T.init_distributed()
    data_args = argparse.Namespace(data_dir=args.data_dir, synthetic_train=0,
                                   synthetic_test=args.synthetic_test)
    _, test_set, origin = cifar10.load_data(data_args)
    model = cifar10.build_model(args.width)
    checkpoint = Path(args.checkpoint)
    if checkpoint.exists():
        T.load_checkpoint(checkpoint, ctx, model=model, restore_rng_state=False)
        weights = f"weights from {checkpoint}"
    else:
        weights = f"no checkpoint at {checkpoint}: random weights (run jobs/cifar10.yaml first)"
    if ctx.is_main:
        print(f"{origin}; {weights}; {ctx.world_size} rank(s)", flush=True)
    model = model.to(ctx.device).eval()  # no DDP: inference has no gradients to average
    loader = T.make_eval_loader(T.IndexedDataset(test_set), args.batch_size, ctx,
                                num_workers=args.workers)
    records = []
    with torch.no_grad():
        for indices, (images, labels) in loader:
            probs = model(images.to(ctx.device)).softmax(dim=1)
            confidence, predicted = probs.max(dim=1)
            for i, label, pred, conf in zip(indices.tolist(), labels.tolist(),
                                            predicted.tolist(), confidence.tolist()):
                records.append({"index": i, "label": label, "pred": pred,
                                "confidence": round(conf, 6)})
            T.heartbeat()
    out = Path(args.out_dir)
    merged = T.gather_results(records, out / "shards", ctx, name="predictions",
                              merged_path=out / "predictions.jsonl", expected=len(test_set))
    if ctx.is_main:
        rows = [json.loads(line) for line in merged.open()]
        correct = sum(r["label"] == r["pred"] for r in rows)
        print(f"{len(rows)} predictions merged into {merged} from {ctx.world_size} shard(s) "
              f"in {out / 'shards'}; accuracy {correct / len(rows):.4f} ({correct}/{len(rows)})",
              flush=True)
    return 0


if __name__ == "__main__":
    T.run_main(main)
