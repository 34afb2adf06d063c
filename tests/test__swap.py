"""The checkpoint folder swap: a kill between the two renames recovers the newer checkpoint,
stale temp folders of dead writers are cleaned, a live writer's never."""

import errno
import os
import sys

import pytest
import torch

from headwise import _swap
from headwise import checkpoint as ckpt
from headwise.errors import OutputError
from tests.test_checkpoint import _lm


def test_temp_and_old_names_sit_beside_the_folder_and_name_the_writer(tmp_path):
    folder = tmp_path / "checkpoint"
    assert _swap.old_of(folder) == tmp_path / ".checkpoint.old"
    assert _swap.temp_for(folder).parent == tmp_path
    assert _swap.temp_for(folder).name.startswith(".checkpoint.tmp-")
    assert str(os.getpid()) in _swap.temp_for(folder).name


def test_writing_turns_a_filesystem_error_into_one_output_error():
    with pytest.raises(OutputError, match=r"^cannot write x/y: No space left on device "
                                          r"\(errno 28\); free some space"):
        with _swap.writing("x/y"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(KeyError):  # not a filesystem error: passes through untouched
        with _swap.writing("x/y"):
            raise KeyError("bug")


_FULL_DISK = """
import resource, signal, sys, torch
from headwise import checkpoint as ckpt
from headwise.errors import OutputError
from headwise.models import LMConfig, build
torch.manual_seed(1)
cfg = LMConfig(vocab_size=11, d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=16)
model = build(cfg)
opt = torch.optim.AdamW(model.parameters())
ckpt.save(sys.argv[1], model, cfg)  # the previous checkpoint, written with room to spare
# a file may grow to 20 kB, then writes fail as on a full disk (EFBIG instead of ENOSPC)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    ckpt.save(sys.argv[1], model, cfg, optimizer=opt, train_state={"step": 2})
except OutputError as e:
    print(e)
"""


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux",
                    reason="RLIMIT_FSIZE stands in for a full disk on Linux")
def test_a_full_disk_while_safetensors_writes_is_one_output_error(tmp_path):
    """safetensors reports a failed write as SafetensorError('... I/O error: ...'), not an
    OSError, so a full disk during a save (and so during training or --resume) ended in
    'internal error' with a traceback; now it is the same OutputError line as any write."""
    import subprocess
    folder = tmp_path / "checkpoint"
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"cannot write {folder}: File too large"), done.stdout
    assert "free some space" in done.stdout
    ckpt.load(folder)  # the previous checkpoint is still whole (its hashes are checked)
    assert not any(p.name.startswith(".checkpoint.tmp") for p in tmp_path.iterdir())


_KILL_BETWEEN_RENAMES = """
import os, signal, sys, torch
from headwise import checkpoint as ckpt
from headwise.errors import OutputError
from headwise.models import LMConfig, build
real, calls = os.replace, []
def replace(src, dst):  # SIGKILL right after the first rename (checkpoint -> .checkpoint.old)
    real(src, dst)
    calls.append(dst)
    if len(calls) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
torch.manual_seed(1)
cfg = LMConfig(vocab_size=11, d_model=32, num_heads=4, num_layers=2, d_ff=48, max_len=16,
               dropout=0.0)
model = build(cfg)
opt = torch.optim.AdamW(model.parameters())
ckpt.save(sys.argv[1], model, cfg, optimizer=opt, train_state={"step": 2})
"""


def _kill_between_renames(folder, tmp_path):
    import subprocess
    import sys
    script = tmp_path / "kill.py"
    script.write_text(_KILL_BETWEEN_RENAMES, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(folder)], capture_output=True)
    assert done.returncode == -9, done.stderr.decode()[-2000:]


def test_a_kill_between_the_two_renames_recovers_the_newer_checkpoint(tmp_path):
    model, cfg = _lm()  # seed 0: the older checkpoint, step 1
    opt = torch.optim.AdamW(model.parameters())
    folder = tmp_path / "run" / "checkpoint"
    ckpt.save(folder, model, cfg, optimizer=opt, train_state={"step": 1})
    _kill_between_renames(folder, tmp_path)
    # the state the kill left: no checkpoint, the old one aside, the complete new one in temp
    assert not folder.exists() and (folder.parent / ".checkpoint.old").is_dir()
    temps = list(folder.parent.glob(".checkpoint.tmp-*"))
    assert len(temps) == 1
    newer = {k: v.clone() for k, v in ckpt.load(temps[0]).model.state_dict().items()}
    older = model.state_dict()
    assert any(not torch.equal(newer[k], older[k]) for k in older)  # the test can fail

    loaded = ckpt.load(tmp_path / "run")  # what view / trace / resume read
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, newer[k]), k
    assert ckpt.load_train_state(tmp_path / "run")["step"] == 2
    assert folder.is_dir() and not (folder.parent / ".checkpoint.old").exists()
    assert not list(folder.parent.glob(".checkpoint.tmp-*"))


def test_a_recovered_run_resumes_from_the_newer_step(tmp_path):
    import shutil

    from headwise.train import TrainConfig, train
    run = tmp_path / "run"
    cfg = TrainConfig(task="copy", steps=4, batch_size=8, min_len=4, max_len=6, warmup=1,
                      model=dict(d_model=16, num_heads=2, num_layers=1, d_ff=16),
                      eval_size=8, eval_every=0, precision="fp32")
    quiet = dict(progress=False, verbose=False)
    train(cfg, out=run, steps=2, **quiet)
    shutil.copytree(run / "checkpoint", tmp_path / "step2")
    train(resume=run, out=run, steps=3, **quiet)
    # the state a kill between the renames of the step-3 save leaves
    (run / "checkpoint").rename(run / ".checkpoint.tmp-999999999")  # a pid that cannot exist
    shutil.copytree(tmp_path / "step2", run / ".checkpoint.old")
    final = train(resume=run, out=run, steps=4, **quiet)
    assert [h["step"] for h in final.history] == [2, 3, 4]  # resumed at 3, not at 2


def test_stale_temp_folders_are_cleaned_but_not_a_live_writers(tmp_path):
    import subprocess
    import sys
    model, cfg = _lm()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid whose process has exited (and been reaped)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [tmp_path / f".c.tmp-{gone.pid}", tmp_path / ".c.tmp-999999999"]
        running = tmp_path / f".c.tmp-{live.pid}"
        for folder in [*stale, running]:
            folder.mkdir()
            (folder / "model.safetensors").write_bytes(b"half-written")
        ckpt.save(tmp_path / "c", model, cfg)
        assert not any(p.exists() for p in stale)
        assert running.is_dir()  # its writer still runs: never touched
        assert ckpt.load(tmp_path / "c").config == cfg
    finally:
        live.kill()
        live.wait()
