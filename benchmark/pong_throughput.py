"""Pong-v5 throughput of algos/impala.py and algos/seed.py on this machine, as a fraction of the compute limit
measured in the same run: limit = 1 / (t_env + t_infer + t_learn) environment steps per second, where t_env is
envpool's stepping time per env step (8 envs, random actions), t_infer the Nature-CNN forward pass per env step
(batch of 8, as one actor's), and t_learn the learner's forward, backward, clip and Adam step per sample (batch
of 32 unrolls of 20 steps, V-trace loss), each timed alone with all cores. Then both files train on Pong-v5 with
the same sizes and their training SPS is divided by the limit.

  python benchmark/pong_throughput.py                  # -> benchmark/results/pong_throughput.json
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from run import machine  # noqa: E402

spec = importlib.util.spec_from_file_location("impala", ROOT / "algos" / "impala.py")
impala = importlib.util.module_from_spec(spec)
spec.loader.exec_module(impala)


def timed(fn, seconds: float) -> float:
    """Seconds per call of fn, over about `seconds` of calls after one warm-up call."""
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="timing per component")
    p.add_argument("--total-timesteps", type=int, default=60000, help="training steps per file")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "pong_throughput.json"))
    a = p.parse_args()
    torch.set_num_threads(2)
    N, T, B = 8, 20, 32
    envs = impala.make_env("Pong-v5", N, 1, num_threads=2)
    envs.reset()
    n_act = envs.action_space.n
    t_env = timed(lambda: envs.step(np.random.randint(0, n_act, N)), a.seconds) / N
    agent = impala.Agent((4, 84, 84), n_act)
    obs = torch.as_tensor(envs.reset()[0]).unsqueeze(0)
    with torch.no_grad():
        t_infer = timed(lambda: agent(obs, torch.ones(1, N), agent.initial_state(N)), a.seconds) / N
    args = impala.Args(env_id="Pong-v5")
    batch = {
        "obs": torch.randint(0, 255, (T + 1, B, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, n_act, (T, B)),
        "logits": torch.zeros(T, B, n_act),
        "state": agent.initial_state(B),
        "rewards": torch.zeros(T, B),
        "terms": torch.zeros(T, B),
        "dones": torch.zeros(T, B),
        "valid": torch.ones(T, B),
    }
    flat = impala.flatten_parameters(agent)
    optimizer = torch.optim.Adam([flat], lr=1e-4, eps=1e-5)

    def learn():
        loss, _ = impala.impala_loss(agent, batch, args)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([flat], 40.0)
        optimizer.step()

    t_learn = timed(learn, a.seconds) / (T * B)
    limit = 1.0 / (t_env + t_infer + t_learn)
    print(
        f"t_env {t_env * 1e3:.3f} ms, t_infer {t_infer * 1e3:.3f} ms, t_learn {t_learn * 1e3:.3f} ms per step: "
        f"limit {limit:.0f} steps/s",
        flush=True,
    )
    record = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "t_env_ms": t_env * 1e3,
        "t_infer_ms": t_infer * 1e3,
        "t_learn_ms": t_learn * 1e3,
        "limit_sps": limit,
        "runs": {},
    }
    record["commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    for name in ["impala", "seed"]:
        cmd = [
            sys.executable,
            str(ROOT / "algos" / f"{name}.py"),
            "--env-id",
            "Pong-v5",
            "--num-envs",
            str(N),
            "--unroll-length",
            str(T),
            "--batch-size",
            str(B),
            "--learning-rate",
            "3e-4",
            "--total-timesteps",
            str(a.total_timesteps),
            "--eval-episodes",
            "1",
            "--exp-name",
            "throughput",
            "--torch-threads",
            "2",
        ]  # the learner gets every core, as when it was timed alone
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(cmd, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
            summary = json.loads((Path(tmp) / "runs" / "Pong-v5__throughput__1" / "summary.json").read_text())
        record["runs"][name] = {
            "command": " ".join(cmd[1:]),
            "sps": summary["sps"],
            "ratio": summary["sps"] / limit,
            "policy_lag_mean": summary["policy_lag_mean"],
        }
        print(f"{name}: {summary['sps']:.0f} SPS = {summary['sps'] / limit:.2f} of the limit", flush=True)
    Path(a.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
