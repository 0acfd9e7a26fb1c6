"""benchmark/scaling.py: the hook that counts what crosses the wire, the alpha-beta costs of the collectives, the
projection's limits, and docs/scaling.md's table against the results file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import scaling  # noqa: E402
from conftest import check_ok, child_env  # noqa: E402

MB = 2**20
# every op of the hook once, between two ranks
CALLS = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.zeros(10))
dist.all_gather([torch.zeros(3, dtype=torch.float64) for _ in range(2)], torch.zeros(3, dtype=torch.float64))
dist.gather(torch.zeros(5), [torch.zeros(5) for _ in range(2)] if rank == 0 else None, dst=0)
dist.broadcast(torch.zeros(7, dtype=torch.int64), 0)
if rank == 0:
    dist.send(torch.zeros(100, dtype=torch.uint8), 1)
else:
    dist.recv(torch.zeros(100, dtype=torch.uint8), 0)
dist.barrier()
dist.destroy_process_group()
"""


def test_the_hook_counts_every_calls_payload_per_rank(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(scaling.HOOK)
    (tmp_path / "calls.py").write_text(CALLS)
    counts = tmp_path / "counts"
    counts.mkdir()
    env = child_env()
    env["SCALING_COUNTS"] = str(counts)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    command = [*scaling.torchrun(2), str(tmp_path / "calls.py")]
    check_ok(subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120))
    ranks = {path.name.split("_")[0]: json.loads(path.read_text()) for path in counts.glob("rank*.json")}
    assert sorted(ranks) == ["rank0", "rank1"]
    payload = {op: entry["bytes"] for op, entry in ranks["rank0"].items()}
    assert payload == {"all_reduce": 40, "all_gather": 24, "gather": 20, "broadcast": 56, "send": 100, "barrier": 0}
    assert ranks["rank1"]["recv"] == {"calls": 1, "bytes": 100, "seconds": ranks["rank1"]["recv"]["seconds"]}
    assert all(entry["calls"] == 1 for rank in ranks.values() for entry in rank.values())


def test_collectives_cost_what_the_alpha_beta_model_says():
    bandwidth = 1e9
    # large payload, no latency: the ring's 2 (n - 1) / n passes of the payload beat the tree's 2 log2(n)
    assert scaling.collective_s("all_reduce", 8, MB, bandwidth, 0.0) == pytest.approx(2 * 7 / 8 * MB / bandwidth)
    # tiny payload, 1,024 ranks: the tree's 2 log2(n) latencies beat the ring's 2 (n - 1)
    assert scaling.collective_s("all_reduce", 1024, 8, bandwidth, 1e-5) == pytest.approx(20 * (1e-5 + 8 / bandwidth))
    # every rank's block crosses the root's link
    assert scaling.collective_s("gather", 5, MB, bandwidth, 0.0) == pytest.approx(4 * MB / bandwidth)
    assert scaling.collective_s("all_gather", 4, MB, bandwidth, 1e-5) == pytest.approx(3 * (1e-5 + MB / bandwidth))
    assert scaling.collective_s("all_reduce", 1, MB, bandwidth, 1e-5) == 0.0


def record(mode: str, ops: dict, **one) -> dict:
    summary = {"train_time_s": 10.0, "global_step": 100_000, "sps": 10_000.0, "generations": 100}
    return {
        "mode": mode,
        "n1": {"summary": summary, **one},
        "n2": {"summary": {"global_step": 200_000, "sps": 20_000.0}, "wire": {"rank0": ops}},
    }


def test_weak_scaling_without_a_wire_is_perfect_and_a_payload_per_step_costs_its_transfer():
    silent = record("weak", {"barrier": {"calls": 1, "bytes": 0, "seconds": 0.0}})
    silent["n2"]["wire"]["rank0"] = {}
    assert scaling.efficiency("ddppo", silent, 1024, 1e9, 1e-5) == pytest.approx(1.0)
    # one all-reduce of 1 MB per 1,000 of a rank's steps (100 calls over 100k steps): 1e-4 s of compute per step
    heavy = record("weak", {"all_reduce": {"calls": 100, "bytes": 100 * MB, "seconds": 0.0}})
    per_step = 1e-4 + scaling.collective_s("all_reduce", 64, MB, 1e9, 1e-5) / 1000
    assert scaling.efficiency("ddppo", heavy, 64, 1e9, 1e-5) == pytest.approx(1e-4 / per_step)


def test_es_update_grows_with_the_population_and_a_split_population_keeps_its_serial_part():
    # rollouts take 0.075 of the 0.1 s per generation: a quarter of the compute is the update
    es = record("population", {}, rollout_s_per_update=0.075)
    es["n2"]["wire"]["rank0"] = {}
    assert scaling.efficiency("es", es, 4, 1e9, 0.0) == pytest.approx(1e-4 / (0.75e-4 + 4 * 0.25e-4))
    assert scaling.efficiency("ga", es, 4, 1e9, 0.0) == pytest.approx(1.0)  # GA's update does not grow
    split = scaling.projected_sps("ga", es, 2, 1e9, 0.0, split=True)
    assert split == pytest.approx(1 / (0.75e-4 / 2 + 0.25e-4))  # Amdahl


def test_central_actors_are_bounded_by_rank_0s_link_and_rank_0_compute_is_reported_apart():
    central = {
        "mode": "central",
        "n1": {"summary": {"sps": 5_000.0}},
        "n2": {
            "summary": {"global_step": 30_000, "sps": 3_000.0, "total_actors": 3},  # 1,000 steps/s per actor
            "wire": {"rank1": {"send": {"calls": 10_000, "bytes": 10_000_000, "seconds": 0.0}}},  # 1 kB per step
        },
    }
    assert scaling.projected_sps("seed", central, 64, 1e9, 0.0) == pytest.approx(64_000.0)
    assert scaling.projected_sps("seed", central, 64, 2e6, 0.0) == pytest.approx(2_000.0)  # the link: 2 MB/s
    assert scaling.rank0_actors(central) == pytest.approx(5.0)  # rank 0 alone processed 5,000 steps/s
    # one call per step adds its latency to every actor step; efficiency is against an actor beside its learner
    assert scaling.projected_sps("seed", central, 1, 1e9, 1e-3) == pytest.approx(1 / (1e-3 + 1e-3))
    assert scaling.efficiency("seed", central, 8, 1e9, 1e-3) == pytest.approx(0.5)


def test_the_check_at_two_processes_shares_this_machines_cores():
    busy = record("weak", {})
    busy["n2"]["wire"]["rank0"] = {}
    busy["n1"]["cores_busy"] = 2.0  # one process kept both cores busy: two get one each
    loopback = {"bytes_per_s": 1e9, "latency_s": 0.0}
    assert scaling.check_two("ddppo", busy, loopback, cores=2) == pytest.approx(10_000.0)
    busy["n1"]["cores_busy"] = 1.0
    assert scaling.check_two("ddppo", busy, loopback, cores=2) == pytest.approx(20_000.0)


def test_docs_scaling_table_is_the_results_files():
    results = json.loads(scaling.OUT.read_text())
    assert scaling.table(results) in scaling.DOC.read_text()
    assert scaling.wire_table(results) in scaling.DOC.read_text()
    measured = json.loads(scaling.WORKERS_OUT.read_text())
    assert scaling.workers_table(results, measured) in scaling.DOC.read_text()
    assert sorted(results["files"]) == sorted(scaling.FILES)


def test_workers_runs_small_counts_first_skips_what_passes_the_deadline_and_keeps_what_finished(tmp_path, monkeypatch):
    ran = []
    clock = iter(range(0, 1000, 10))  # each look at the clock 10 s later

    def fake_run(name, count, run_dir):
        ran.append((name, count))
        return {"summary": {"sps": 1000.0 * count}, "cores_busy": 1.0}

    monkeypatch.setattr(scaling, "workers_run", fake_run)
    monkeypatch.setattr(scaling.time, "time", lambda: next(clock))
    monkeypatch.setattr(scaling, "machine", lambda: {"cores": 16})
    out = tmp_path / "workers.json"
    scaling.workers(["ga", "fedpg"], [1, 16, 2], out, deadline_s=35)
    # federated PG has no more workers than its 10 clients; the clock passed 35 s before the count of 2
    assert ran == [("ga", 1), ("fedpg", 1), ("ga", 16)]
    assert json.loads(out.read_text())["files"] == {
        "ga": {"1": fake_run("ga", 1, None), "16": fake_run("ga", 16, None)},
        "fedpg": {"1": fake_run("fedpg", 1, None)},
    }


def test_a_timed_run_logs_its_output_and_counts_the_cores_its_processes_kept_busy(tmp_path):
    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\nprint('spun')"
    wall, cores_busy = scaling.timed_run([sys.executable, "-c", spin], tmp_path, dict(os.environ), timeout=60)
    assert (tmp_path / "stdout.log").read_text() == "spun\n"
    assert wall >= 0.6 and 0.5 * 0.6 / wall < cores_busy <= 1.05  # one process, busy for 0.6 of its CPU seconds
    sleep = "import time\ntime.sleep(1.0)"
    wall, cores_busy = scaling.timed_run([sys.executable, "-c", sleep], tmp_path, dict(os.environ), timeout=60)
    assert wall >= 1.0 and cores_busy < 0.5  # asleep: the interpreter's start-up only
