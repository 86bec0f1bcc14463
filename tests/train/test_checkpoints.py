"""Async checkpoints, manifests and the faults of issue 35, with real processes and files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from clusterddp import train as T
from clusterddp.train.ckptstore import (DirLock, manifest_name, newest_complete, state_name)
from rankrun import REPO, assert_ok, clean_env, run_ranks

JOB = Path(__file__).resolve().parent / "bin" / "ckpt_job.py"


def single() -> T.DistContext:
    return T.init_distributed()


def _model(mb: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    if mb:
        model.register_buffer("ballast", torch.randn(mb * 2 ** 18))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def _saved_model(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_async_save_writes_the_state_of_the_moment_it_was_called(tmp_path: Path) -> None:
    """The state is staged when save() returns: weights changed while the write runs are
    not in the checkpoint, and the manifest's size and sha256 match the file."""
    model, opt = _model(mb=16)
    ckpt = T.Checkpointer(tmp_path, single(), mode="async")
    ckpt.save(model=model, optimizer=opt, state=T.TrainState(epoch=0, step=3, global_step=3))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training goes on during the write
    ckpt.close()
    scan = newest_complete(tmp_path)
    assert scan.newest is not None and not scan.ignored
    path, manifest = scan.newest
    assert (manifest.step, manifest.global_step, manifest.world_size) == (3, 3, 1)
    saved = _saved_model(path)
    assert all(torch.equal(saved[k], v) for k, v in expected.items())
    assert torch.equal(_saved_model(tmp_path / "last.pt")["0.weight"], expected["0.weight"])


def test_the_next_optimizer_step_waits_for_the_deferred_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters and momentum are copied behind the next forward/backward, but the next
    optimizer.step waits for that copy: the checkpoint holds the state of the save, not
    the state after the step (a step pre-hook; ``defer_copy``). The writer is made to start
    its copy 0.3 s late, so a step that did not wait would land first."""
    from clusterddp.train.asyncckpt import Stager
    copy_pending = Stager.copy_pending

    def late(self: Stager) -> None:
        time.sleep(0.3)
        copy_pending(self)

    monkeypatch.setattr(Stager, "copy_pending", late)
    torch.manual_seed(0)
    model = nn.Linear(512, 512)  # 1 MB of weight: deferred
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 512)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    ckpt = T.Checkpointer(tmp_path, single(), mode="async")
    for i in range(3):
        ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=i))
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        momentum = opt.state[model.weight]["momentum_buffer"].clone()
        step()  # at once: before the writer thread has necessarily copied anything
        ckpt.wait()
        path, _ = newest_complete(tmp_path).newest  # type: ignore[misc]
        saved = torch.load(path, weights_only=True)
        assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())
        assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum)
        assert not torch.equal(saved["model"]["weight"], model.weight.detach())
    ckpt.close()


def test_at_most_one_save_in_flight_and_old_ones_pruned(tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """Saves back to back wait for the one in flight (said once), none is lost, and only the
    newest ``keep`` remain, each complete."""
    model, opt = _model(mb=32)
    ckpt = T.Checkpointer(tmp_path, single(), mode="async", keep=2)
    for i in range(4):
        with torch.no_grad():
            model[0].bias.fill_(float(i))
        ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=i))
    ckpt.close()
    err = capfd.readouterr().err
    assert err.count("cannot keep up") <= 1, err
    assert len(ckpt.saved) == 4
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt-"))
    assert names == [manifest_name(3), state_name(3), manifest_name(4), state_name(4)], names
    path, manifest = newest_complete(tmp_path).newest  # type: ignore[misc]
    assert manifest.global_step == 3 and _saved_model(path)["0.bias"][0].item() == 3.0


def _two_checkpoints(tmp_path: Path, job: str | None = None) -> None:
    model, opt = _model()
    ckpt = T.Checkpointer(tmp_path, single(), mode="sync", job=job)
    for i in range(2):
        ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=i))
    ckpt.close()


@pytest.mark.parametrize("damage", ["manifest size edited", "manifest truncated",
                                    "state truncated", "state byte flipped", "state missing"])
def test_a_damaged_newest_checkpoint_is_ignored_with_one_line(tmp_path: Path, damage: str) -> None:
    """A hand-edited or truncated manifest, or a state file that does not match it, makes
    resume take the previous checkpoint and say why in one line."""
    _two_checkpoints(tmp_path)
    manifest, state = tmp_path / manifest_name(2), tmp_path / state_name(2)
    if damage == "manifest size edited":
        data = json.loads(manifest.read_text())
        data["files"][state_name(2)]["size"] += 1
        manifest.write_text(json.dumps(data))
    elif damage == "manifest truncated":
        manifest.write_bytes(manifest.read_bytes()[:40])
    elif damage == "state truncated":
        state.write_bytes(state.read_bytes()[:-10])
    elif damage == "state byte flipped":
        raw = bytearray(state.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        state.write_bytes(bytes(raw))
    else:
        state.unlink()
    scan = newest_complete(tmp_path)
    assert scan.newest is not None and scan.newest[1].seq == 1
    assert len(scan.ignored) == 1 and "\n" not in scan.ignored[0], scan.ignored
    assert manifest_name(2) in scan.ignored[0]


def test_a_checkpoint_of_another_job_is_ignored(tmp_path: Path) -> None:
    """Resume never picks up another job's checkpoint from a shared directory."""
    _two_checkpoints(tmp_path, job="alpha")
    scan = newest_complete(tmp_path, job="beta")
    assert scan.newest is None
    assert [line.split(": ", 1)[1] for line in scan.ignored] == [
        "written by job 'alpha', this is 'beta'"] * 2


def test_two_runs_writing_one_directory_are_refused(tmp_path: Path) -> None:
    """A second run on a checkpoint directory in use exits 2 with one line, no traceback."""
    lock = DirLock(tmp_path / "ckpt")
    lock.acquire()
    try:
        done = subprocess.run([sys.executable, str(JOB), str(tmp_path), "--checkpoint-dir",
                               str(tmp_path / "ckpt")], cwd=REPO, env=clean_env(),
                              capture_output=True, text=True, timeout=300)
    finally:
        lock.release()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is in use by another run (pid" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_async_and_sync_train_to_the_same_weights_and_checkpoints(tmp_path: Path) -> None:
    """2 gloo ranks, a checkpoint every 2 steps: async and sync end with equal parameters
    and equal final checkpoints (the staged copy is the state of that step)."""
    results = {}
    for mode in ("async", "sync"):
        out = tmp_path / mode
        out.mkdir()
        assert_ok(run_ranks([str(out), "--checkpoint-dir", str(out / "ckpt"), "--mode", mode,
                             "--state-mb", "8"], script=JOB))
        scan = newest_complete(out / "ckpt")
        assert scan.newest is not None and not scan.ignored
        results[mode] = (torch.load(out / "params.pt"), _saved_model(scan.newest[0]),
                         scan.newest[1])
    (p_async, c_async, m_async), (p_sync, c_sync, m_sync) = results["async"], results["sync"]
    assert all(torch.equal(p_async[k], p_sync[k]) for k in p_sync)
    assert all(torch.equal(c_async[k], c_sync[k]) for k in c_sync)
    assert (m_async.epoch, m_async.global_step) == (m_sync.epoch, m_sync.global_step) == (2, 8)


def test_resume_after_a_kill_continues_from_the_newest_complete_mid_epoch(tmp_path: Path) -> None:
    """Checkpoints every 3 steps of 8: a resumed run starts at the newest complete one and
    ends with the parameters of an uninterrupted run (mid-epoch, async)."""
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    straight.mkdir(), cut.mkdir()
    common = ["--checkpoint-every", "3", "--epochs", "2"]
    assert_ok(run_ranks([str(straight), "--checkpoint-dir", str(straight / "ckpt"), *common],
                        script=JOB))
    assert_ok(run_ranks([str(cut), "--checkpoint-dir", str(cut / "ckpt"), *common], script=JOB))
    # Cut the history back to the checkpoint after step 6 (epoch 1, step 2): as if killed there.
    ckpt = cut / "ckpt"
    for seq in range(1, 20):
        manifest = ckpt / manifest_name(seq)
        if manifest.exists() and json.loads(manifest.read_text())["global_step"] > 6:
            manifest.unlink()
    scan = newest_complete(ckpt)
    assert scan.newest is not None and scan.newest[1].global_step == 6
    (cut / "params.pt").unlink()
    resumed = run_ranks([str(cut), "--checkpoint-dir", str(ckpt), *common], script=JOB)
    assert_ok(resumed)
    assert "resumed from" in resumed[0].stdout and "epoch 1 step 2" in resumed[0].stdout
    a, b = torch.load(straight / "params.pt"), torch.load(cut / "params.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _unshare() -> list[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private tmpfs mount")
    return ["unshare", "--mount", "--propagation", "private"]


def _in_tmpfs(directory: Path, options: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with a fresh tmpfs (mount ``options``) on ``directory``, in a private
    mount namespace that disappears with the process."""
    directory.mkdir(parents=True, exist_ok=True)
    script = f"mount -t tmpfs -o {options} tmpfs {directory} && exec \"$@\""
    return subprocess.run([*_unshare(), "sh", "-c", script, "sh", *argv], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=300)


def test_a_full_disk_fails_the_save_in_one_line_and_training_goes_on(tmp_path: Path) -> None:
    """ENOSPC during an async save: one line, training goes on, the previous checkpoint stays
    the newest; once space is back the next saves complete and the run ends with exit 0."""
    ckpt = tmp_path / "ckpt"
    script = (f"mount -t tmpfs -o size=16m tmpfs {ckpt} && \"$@\"; code=$?; "
              f"ls {ckpt} > {tmp_path}/listing; cp {ckpt}/ckpt-*.json {tmp_path}/ 2>/dev/null; exit $code")
    ckpt.mkdir()
    done = subprocess.run([*_unshare(), "sh", "-c", script, "sh", sys.executable, str(JOB),
                           str(tmp_path), "--checkpoint-dir", str(ckpt), "--state-mb", "4",
                           "--fill-disk-at", "4", "--free-disk-at", "7", "--epochs", "2"],
                          cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    failed = [line for line in done.stderr.splitlines() if "failed, training goes on" in line]
    assert failed and all("OSError: [Errno 28] No space left on device" in line
                          for line in failed), done.stderr
    for line in failed:  # the one before stays the newest (or none, if the first one failed)
        seq = int(line.split("checkpoint ckpt-")[1][:6])
        still = line.rsplit("still ", 1)[1]
        assert still == "none" or int(still[5:11]) < seq, line
    assert "done after 16 steps" in done.stdout
    manifests = sorted(tmp_path.glob("ckpt-*.json"))
    assert json.loads(manifests[-1].read_text())["global_step"] == 16


def test_a_read_only_checkpoint_directory_is_refused_at_start(tmp_path: Path) -> None:
    """A checkpoint directory that cannot be written: exit 2, one line, before training."""
    done = _in_tmpfs(tmp_path / "ckpt", "ro,size=1m",
                     [sys.executable, str(JOB), str(tmp_path), "--checkpoint-dir",
                      str(tmp_path / "ckpt")])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write: Read-only file system" in lines[0], done.stderr


def test_a_checkpoint_directory_that_vanishes_is_made_again(tmp_path: Path) -> None:
    """The directory removed mid-run (a cleanup job, a remount): the next save makes it again
    and completes; training never stops."""
    out = tmp_path
    assert_ok(run_ranks([str(out), "--checkpoint-dir", str(out / "ckpt"), "--remove-dir-at", "5"],
                        script=JOB))
    scan = newest_complete(out / "ckpt")
    assert scan.newest is not None and scan.newest[1].global_step == 8 and not scan.ignored


def test_a_save_still_running_at_the_end_of_training_is_waited_for(tmp_path: Path) -> None:
    """close() right after a long save: the checkpoint is complete, not lost."""
    model, opt = _model(mb=64)
    ckpt = T.Checkpointer(tmp_path, single(), mode="async")
    ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=7))
    ckpt.close()
    scan = newest_complete(tmp_path)
    assert scan.newest is not None and scan.newest[1].global_step == 7


def test_a_non_finite_state_is_never_written_and_every_rank_stops(tmp_path: Path) -> None:
    """The writer checks the staged copy: nothing is written, and the next save raises
    NonFiniteWeightsError (exit 65 under run_main)."""
    model, opt = _model()
    ckpt = T.Checkpointer(tmp_path, single(), mode="async")
    ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=1))
    with torch.no_grad():
        model[0].bias[0] = float("nan")
    ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=2))
    with pytest.raises(T.NonFiniteWeightsError):
        ckpt.save(model=model, optimizer=opt, state=T.TrainState(global_step=3))
    ckpt.close()
    scan = newest_complete(tmp_path)
    assert scan.newest is not None and scan.newest[1].global_step == 1
    assert not (tmp_path / state_name(2)).exists()


@pytest.mark.slow
@pytest.mark.parametrize(("written", "read"), [(4, 2), (2, 4)])
def test_a_checkpoint_of_one_world_size_resumes_on_another(tmp_path: Path, written: int,
                                                          read: int) -> None:
    """A mid-epoch checkpoint written by 4 ranks resumes on 2, and one of 2 on 4: the state is
    whole (DDP's is the same on every rank), the position is rescaled to the new step size."""
    ckpt = tmp_path / "ckpt"
    steps = 64 // (8 * written)  # per epoch
    assert_ok(run_ranks([str(tmp_path), "--checkpoint-dir", str(ckpt), "--epochs", "1",
                         "--checkpoint-every", "1"], nproc=written, script=JOB))
    for manifest in ckpt.glob("ckpt-*.json"):  # keep the one before the epoch's last step
        if json.loads(manifest.read_text())["global_step"] != steps - 1:
            manifest.unlink()
    resumed = run_ranks([str(tmp_path), "--checkpoint-dir", str(ckpt), "--epochs", "2"],
                        nproc=read, script=JOB)
    assert_ok(resumed)
    moved = (steps - 1) * written // read
    assert (f"checkpoint was written by {written} rank(s), this run has {read}: continuing "
            f"epoch 0 at step {moved} of {64 // (8 * read)}") in resumed[0].stdout, resumed[0].stdout
    scan = newest_complete(ckpt)
    assert scan.newest is not None and scan.newest[1].world_size == read
    assert scan.newest[1].epoch == 2
