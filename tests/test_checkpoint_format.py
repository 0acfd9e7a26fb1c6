"""Every file refuses a checkpoint written before the progress format (docs/conventions.md §1a) with exit 2 and one
line naming --resume, instead of resuming from the wrong generation or ending in a traceback."""

import pytest
import torch

ALGOS = ["a3c", "apex", "ddppo", "es", "fedpg", "ga", "impala", "r2d2", "seed"]
# fedpg's clients read the checkpoint in their own processes: with several, the parent reports exit 1 naming the
# worker that exited 2 (as for its other checkpoint checks); one client process keeps the file's own exit 2
EXTRA = {"fedpg": ["--num-workers", 1]}


@pytest.mark.parametrize("name", ALGOS)
def test_a_checkpoint_of_the_old_format_is_refused(runner, name):
    run_dir = runner.run_dir("CartPole-v1", "old")
    run_dir.mkdir(parents=True)
    # the old files kept their counters at the top level under other names ("generation", "updates", ...)
    torch.save({"global_step": 1000, "generation": 3, "wall_time_s": 5.0}, run_dir / "checkpoint.pt")
    proc = runner.run(name, "--exp-name", "old", "--resume", "--total-timesteps", 20000, *EXTRA.get(name, []))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "progress format" in lines[0], proc.stderr[-2000:]
