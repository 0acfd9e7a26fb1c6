"""How large IMPALA's gradient is on Pong-v5 before the clip: the global norm of the gradient of the file's own
loss (impala_loss, a mean over the batch's valid steps) on batches of the preset's shape (8 envs, unrolls of 20),
collected on-policy by the weights of a checkpoint, or by fresh weights. Beside the norms: the share of batches
that each clip (`--max-grad-norm`) would scale down.

The paper, monobeast and Cleanba clip at 40 a loss summed over the batch (scalable_agent does not clip), 640 steps
in the paper's 32 unrolls of 20. On a mean over N steps that clip is 40 / N per step: 0.0625 at 640 steps, 0.25 at
the preset's 160. The preset's `--max-grad-norm 40` acts on the mean.

  python benchmark/grad_norms.py --checkpoints RUN/checkpoint.pt ... --batches 50 --out benchmark/results/X.json
  (the word `fresh` in --checkpoints: freshly initialised weights, the start of a run)
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from run import machine  # noqa: E402

CLIPS = [0.0625, 0.25, 0.5, 1.0, 40.0]


def load_impala():
    spec = importlib.util.spec_from_file_location("impala", ROOT / "algos" / "impala.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def collect(module, args, agent, envs, carry: dict) -> dict:
    """One unroll of the preset's shape, acted by `agent` (so behaviour and target policies are the same), in the
    layout take_batch gives the learner: obs [T + 1, N, ...], the rest [T, N]. `carry` holds the envs' observation
    and valid flags between unrolls, as an actor does."""
    T = args.unroll_length
    N = args.num_envs
    batch = {"obs": torch.zeros((T + 1, N) + carry["obs"].shape[1:], dtype=torch.uint8)}
    for key in ["actions", "logits", "rewards", "terms", "dones", "valid"]:
        batch[key] = []
    batch["state"] = agent.initial_state(N)
    for t in range(T):
        batch["obs"][t] = carry["obs"]
        with torch.no_grad():
            logits, _, _ = agent(carry["obs"].unsqueeze(0), carry["valid"].unsqueeze(0), batch["state"])
        action = torch.multinomial(torch.softmax(logits[0], -1), 1).squeeze(-1)
        next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
        done = terminated | truncated
        batch["actions"].append(action)
        batch["logits"].append(logits[0])
        batch["rewards"].append(torch.as_tensor(reward, dtype=torch.float32))
        batch["terms"].append(torch.as_tensor(terminated, dtype=torch.float32))
        batch["dones"].append(torch.as_tensor(done, dtype=torch.float32))
        batch["valid"].append(carry["valid"])
        carry["obs"] = torch.as_tensor(next_obs)
        carry["valid"] = torch.as_tensor(~done, dtype=torch.float32)
    batch["obs"][T] = carry["obs"]
    for key in ["actions", "logits", "rewards", "terms", "dones", "valid"]:
        batch[key] = torch.stack(batch[key])
    return batch


def norms_of(module, checkpoint: str, batches: int, seed: int) -> dict:
    """The gradient norms of `batches` consecutive unrolls acted by the checkpoint's weights (or fresh ones)."""
    torch.manual_seed(seed)
    args = module.Args(**module.PRESETS["atari"])
    step = 0
    if checkpoint != "fresh":
        payload = torch.load(checkpoint, weights_only=True, map_location="cpu")
        args.ent_coef = payload["config"]["ent_coef"]
        step = payload["global_step"]
    envs = module.make_env(args.env_id, args.num_envs, seed)
    agent = module.Agent(envs.observation_space.shape, envs.action_space.n, args.network, args.use_lstm)
    if checkpoint != "fresh":
        agent.load_state_dict(payload["model"])
    carry = {"obs": torch.as_tensor(envs.reset()[0]), "valid": torch.ones(args.num_envs)}
    norms = []
    for _ in range(batches):
        batch = collect(module, args, agent, envs, carry)
        loss, _ = module.impala_loss(agent, batch, args)
        agent.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(agent.parameters(), float("inf"))))
    envs.close()
    quantiles = np.quantile(norms, [0.1, 0.5, 0.9, 1.0]).round(4).tolist()
    return {
        "checkpoint": checkpoint,
        "global_step": step,
        "ent_coef": args.ent_coef,
        "batches": batches,
        "norm_p10_p50_p90_max": quantiles,
        "share_clipped": {str(clip): float(np.mean(np.array(norms) > clip)) for clip in CLIPS},
        "norms": [round(norm, 5) for norm in norms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", nargs="+", default=["fresh"])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    torch.set_num_threads(1)
    module = load_impala()
    rows = [norms_of(module, checkpoint, options.batches, options.seed) for checkpoint in options.checkpoints]
    for row in rows:
        shares = ", ".join(f"> {clip}: {share:.2f}" for clip, share in row["share_clipped"].items())
        print(f"{row['checkpoint']} (step {row['global_step']:,}): p10/p50/p90/max {row['norm_p10_p50_p90_max']}")
        print(f"  share of batches clipped {shares}")
    if options.out:
        record = {"command": "python " + " ".join(sys.argv), "machine": machine(), "clips": CLIPS, "rows": rows}
        Path(options.out).write_text(json.dumps(record, indent=1) + "\n")
        print("written to", options.out)


if __name__ == "__main__":
    main()
