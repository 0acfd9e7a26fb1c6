"""The SLURM scripts through a real scheduler: a one-node cluster on this machine (scripts/slurm_cluster.sh), jobs
submitted with sbatch as a user would, checked through the scheduler's own view and the runs' summary.json.

Needs root and Debian's `slurm-wlm` and `munge` (.ci/run installs them); skipped where they are absent."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, check_ok, free_port, wait_for

ENV = "CartPole-v1"
CLUSTER = ROOT / "scripts" / "slurm_cluster.sh"
SEEDS_SCRIPT = ROOT / "scripts" / "slurm_seeds.sbatch"
TORCHRUN_SCRIPT = ROOT / "scripts" / "slurm_ddppo.sbatch"
TINY = ["--total-timesteps", 2048, "--local-num-envs", 4, "--eval-episodes", 2]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

missing = [
    binary
    for binary in ["sbatch", "munged", "slurmctld", "slurmd"]
    if not shutil.which(binary, path="/usr/sbin:/usr/bin")
]
if missing or os.geteuid() != 0:
    pytest.skip(
        f"SLURM tests need root and `apt-get install -y slurm-wlm munge` (missing: {missing or 'root'})",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running one-node cluster; yields the environment that sbatch and the jobs see."""
    state = tmp_path_factory.mktemp("slurm")
    check_ok(subprocess.run(["bash", str(CLUSTER), "start", str(state)], capture_output=True, text=True, timeout=60))
    env = dict(os.environ, SLURM_CONF=str(state / "slurm.conf"), DISTRL_ROOT=str(ROOT), WANDB_MODE="disabled")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}:/usr/sbin"
    for name in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]:
        env.pop(name, None)
    yield env
    subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=60)


def slurm(env, *args, cwd=None) -> str:
    proc = subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    check_ok(proc)
    return proc.stdout.strip()


def submit(env, cwd: Path, *args) -> str:
    """sbatch from `cwd` (the job's runs/ lands there); returns the job id."""
    return slurm(env, "sbatch", "--parsable", *args, cwd=cwd).split(";")[0]


def job_fields(env, job: str) -> dict:
    """The scheduler's live record of one job (scontrol forgets a finished job MinJobAge seconds after its end)."""
    proc = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))


def job_ends(env, job: str) -> list:
    """Each end of `job` or of its array tasks, oldest first, as jobcomp/filetxt wrote it to jobcomp.log beside
    slurm.conf: the scheduler's lasting record of finished jobs on a cluster without an accounting database."""
    log = Path(env["SLURM_CONF"]).with_name("jobcomp.log")
    records = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in log.read_text().splitlines()] if log.exists() else []
    return [record for record in records if job in (record.get("JobId"), record.get("ArrayJobId"))]


def job_log(path: Path) -> str:
    """A job's output file ("" before the job writes it)."""
    return path.read_text() if path.exists() else ""


def wait_ended(env, job: str, count: int, timeout: float) -> list:
    """The final states of `job` (or of its `count` array tasks, in task order) once they have ended."""

    def ended():
        return [record for record in job_ends(env, job) if record["JobState"] in FINAL_STATES]

    assert wait_for(lambda: len(ended()) >= count, timeout, 0.5), (
        f"job {job} ended {len(ended())} of {count} times in {timeout} s; live record: {job_fields(env, job)}"
    )
    return [record["JobState"] for record in sorted(ended(), key=lambda record: int(record.get("ArrayTaskId", 0)))]


def test_array_job_runs_one_seed_per_task(cluster, tmp_path):
    job = submit(cluster, tmp_path, "--array=1-2", SEEDS_SCRIPT, "ddppo", *TINY)
    states = wait_ended(cluster, job, 2, 180)
    assert states == ["COMPLETED", "COMPLETED"], [path.read_text()[-2000:] for path in tmp_path.glob("slurm-*.out")]
    for seed in [1, 2]:
        summary = (tmp_path / "runs" / f"{ENV}__ddppo__{seed}" / "summary.json").read_text()
        assert f'"seed": {seed}' in summary and '"global_step": 2048' in summary


def test_torchrun_job_with_two_ranks(cluster, tmp_path):
    env = dict(cluster, NPROC="2", RDZV_PORT=str(free_port()))
    job = submit(env, tmp_path, "--nodes=1", TORCHRUN_SCRIPT, *TINY)
    states = wait_ended(cluster, job, 1, 180)
    assert states == ["COMPLETED"], next(tmp_path.glob("slurm-*.out")).read_text()[-3000:]
    # a fresh submission is a fresh run, named after its job
    summary = (tmp_path / "runs" / f"{ENV}__ddppo-{job}__1" / "summary.json").read_text()
    assert '"world_size": 2' in summary, summary


def test_preemption_checkpoints_requeues_and_resumes(cluster, tmp_path):
    """USR1 to the batch shell (what --signal=B:USR1@90 or a preempting scheduler sends): the ranks checkpoint, the
    job is requeued, starts again with --resume and finishes the run with whole-run figures."""
    total = 200 * 256  # a whole number of updates (16 envs x 16 steps each), some 10 s of training
    env = dict(cluster, NPROC="1", RDZV_PORT=str(free_port()))
    job = submit(env, tmp_path, "--nodes=1", TORCHRUN_SCRIPT, "--total-timesteps", total, "--eval-episodes", 2)
    log_path = tmp_path / f"slurm-ddppo-{job}.out"
    assert wait_for(lambda: "global_step=" in job_log(log_path), 120, 0.2), (
        job_fields(cluster, job),
        job_log(log_path)[-3000:],
    )
    slurm(cluster, "scancel", "--signal=USR1", "--batch", job)
    assert wait_for(lambda: "checkpoint of update" in log_path.read_text(), 60, 0.2), log_path.read_text()[-3000:]
    # requeued, it waits in PD (BeginTime) until its old credential expires (cred_expire, 10 s in this cluster)
    assert wait_for(lambda: job_fields(cluster, job).get("Restarts") == "1", 60, 0.5), job_fields(cluster, job)
    states = wait_ended(cluster, job, 1, 240)
    log = log_path.read_text()
    assert states == ["COMPLETED"], (job_ends(cluster, job), log[-3000:])
    assert [record["JobState"] for record in job_ends(cluster, job)] == ["PENDING", "COMPLETED"]  # requeued once
    assert log.count("preemption warning") == 1, log[-3000:]
    # the requeued job kept its id, and so its run
    summary = (tmp_path / "runs" / f"{ENV}__ddppo-{job}__1" / "summary.json").read_text()
    assert f'"global_step": {total}' in summary, summary
    # the second start continued from the checkpoint: its first progress line is past the cut
    cut = int(re.search(r"checkpoint of update (\d+)", log).group(1))
    after = log.split("checkpoint of update", 1)[1]
    first_update = int(re.search(r"update (\d+)/", after).group(1))
    assert first_update > cut, after[:2000]


def processes_running(marker: str) -> list:
    """PIDs whose command line holds `marker` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_text():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_scancel_cancels_without_requeue(cluster, tmp_path):
    """A plain scancel (TERM, untrapped): the job is cancelled, not requeued, and no rank outlives it."""
    env = dict(cluster, NPROC="1", RDZV_PORT=str(free_port()))
    marker = f"cancelled{os.getpid()}"
    job = submit(env, tmp_path, "--nodes=1", TORCHRUN_SCRIPT, "--total-timesteps", 10**8, "--exp-name", marker)
    log_path = tmp_path / f"slurm-ddppo-{job}.out"
    assert wait_for(lambda: "global_step=" in job_log(log_path), 120, 0.2), (
        job_fields(cluster, job),
        job_log(log_path)[-3000:],
    )
    assert processes_running(marker)
    cancelled_at = time.time()
    slurm(cluster, "scancel", job)
    assert wait_for(lambda: not processes_running(marker), 15), "a process of the job outlived scancel"
    assert time.time() - cancelled_at < 15
    assert wait_ended(cluster, job, 1, 30) == ["CANCELLED"]
    time.sleep(2.0)  # a requeue would add a line (PENDING) before the last
    assert [record["JobState"] for record in job_ends(cluster, job)] == ["CANCELLED"], job_ends(cluster, job)
    assert not (tmp_path / "runs" / f"{ENV}__{marker}__1" / "summary.json").exists()


def test_benchmark_runner_submits_a_suite_as_one_array_job(cluster, tmp_path):
    """`benchmark/run.py SUITE --slurm`: one array task per run, `sbatch --wait`, then the record and tables."""
    import json

    out = tmp_path / "smoke.json"
    runs = tmp_path / "runs"
    command = [sys.executable, ROOT / "benchmark" / "run.py", "smoke", "--seeds", 1, "--slurm"]
    proc = subprocess.run(
        [str(part) for part in [*command, "--runs-dir", runs, "--out", out]],
        env=cluster,
        capture_output=True,
        text=True,
        timeout=300,
    )
    check_ok(proc)
    record = json.loads(out.read_text())
    assert record["slurm"] and sorted(record["runs"]) == ["ddppo", "es"]
    for entry in ["ddppo", "es"]:
        assert [summary["seed"] for summary in record["runs"][entry]] == [1]
    assert len(list(runs.glob("slurm-distrl-smoke-*_*.out"))) == 2  # one log per array task
    assert out.with_suffix(".md").exists() and out.with_suffix(".csv").exists()
