"""What ES and the Deep GA would cost on Atari, measured per core: neither file takes images (docs/es.md, ga.md),
so this times the work one of their workers does per Atari step, one process per core: envpool's Pong-v5 (one
env, DeepMind preprocessing as in the files) stepped with the Nature CNN's greedy action at batch 1 (the
network of both papers' Atari runs, here algos/a3c.py's torso and policy head). It runs the loop in 1 process
and then in one process per CPU this process may use, all at once, and reports steps/s per core (4 frames a
step), plus the time to draw one Gaussian perturbation of the network's parameters (ES draws one per episode
pair; the GA's compact encoding redraws one per generation of an individual's lineage to decode it).

Projection: the Deep GA paper's comparison table budgets ES and the GA at 1 billion frames (250M forward passes)
for its Atari runs (about 1 hour on 720 cores); the wall time of those 250M steps at C cores is 250M / (C x the
all-cores rate per core), assuming perfect scaling (both algorithms send only seeds and returns).

  python benchmark/evolution_atari_rate.py --seconds 20   # -> benchmark/results/evolution_atari_rate.json
"""

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from run import machine  # noqa: E402

spec = importlib.util.spec_from_file_location("a3c", ROOT / "algos" / "a3c.py")
a3c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(a3c)

BUDGET_STEPS = 250_000_000  # 1B frames at 4 frames a step


def worker(index: int, seconds: float, start, results) -> None:
    """Greedy Nature-CNN play of one Pong-v5 env on one core: 2 s of warm-up, then `seconds` timed."""
    torch.set_num_threads(1)
    env = a3c.make_env("Pong-v5", 1, seed=index)
    agent = a3c.Agent(env.observation_space.shape, env.action_space)
    state = agent.initial_state(1)
    valid = torch.ones(1, 1)
    obs, _ = env.reset()

    def play(duration: float) -> float:
        nonlocal obs
        steps = 0
        began = time.perf_counter()
        while time.perf_counter() - began < duration:
            out, _, _ = agent(torch.from_numpy(obs).unsqueeze(0), valid, state)
            obs, *_ = env.step(out[0].argmax(-1).numpy())
            steps += 1
        return steps / (time.perf_counter() - began)

    start.wait()
    with torch.no_grad():
        play(2.0)
        results.put(play(seconds))


def steps_per_core(processes: int, seconds: float) -> list:
    ctx = mp.get_context("fork")
    start = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, seconds, start, results)) for i in range(processes)]
    for p in procs:
        p.start()
    rates = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sorted(rates)


def perturbation_seconds(repeats: int = 20) -> tuple:
    """Seconds to draw one N(0, 1) vector of the network's size and add it to the parameters, and that size."""
    torch.set_num_threads(1)
    agent = a3c.Agent((4, 84, 84), a3c.gym.spaces.Discrete(6))
    theta = torch.nn.utils.parameters_to_vector(agent.parameters())
    generator = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    for _ in range(repeats):
        theta.add_(torch.randn(theta.numel(), generator=generator), alpha=0.002)
    return (time.perf_counter() - began) / repeats, theta.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds of each measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmark" / "results" / "evolution_atari_rate.json")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    one = steps_per_core(1, args.seconds)
    everyone = steps_per_core(cores, args.seconds)
    draw_s, n_params = perturbation_seconds()
    per_core = float(np.mean(everyone))
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "cores": cores,
        "steps_per_s_one_process": one[0],
        "steps_per_s_per_core_all_cores": everyone,
        "frames_per_s_per_core_all_cores": 4 * per_core,
        "parameters": n_params,
        "perturbation_draw_s": draw_s,
        "budget_steps": BUDGET_STEPS,
        "projected_hours": {str(c): BUDGET_STEPS / (c * per_core) / 3600 for c in (cores, 16, 720)},
    }
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k not in ("machine", "what")}, indent=1))


if __name__ == "__main__":
    main()
