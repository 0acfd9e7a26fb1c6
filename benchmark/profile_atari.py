"""Where the time goes on Pong-v5, per Atari file: milliseconds per environment step in each part of the work,
each part timed alone at the file's own sizes (`--preset atari`) and thread counts, beside the network's best
measured training rate on this CPU.

Parts, per environment step (median over the timed calls; with --before, the two versions' calls alternate):
  env        envpool stepping the actor's envs with random actions (one thread, as an actor)
  inference  the actor's forward pass at its batch (one thread; SEED: the learner's batched inference)
  copy       assembling the learner's batch from the buffers or the replay
  forward    the learner's forward passes (with gradient, plus the algorithm's own no-grad passes)
  targets    V-trace, GAE or n-step returns on the learner (none where actors compute them)
  optimizer  the gradient clip and the optimizer's step
  backward   the update minus copy, forward, targets and optimizer (backward and what else the update does)
  update     the learner's whole update, the file's own function, timed as one call
The reference is the Nature CNN with a linear head: forward, backward and Adam at the learner's batch of samples
with gradient and its thread count, fp32 with channels_last input (the best layout measured here); bf16 autocast
beside it (by default only where the CPU has bf16 in hardware). `update / reference` is the learner's overhead
over the network's best rate. Per update, torch.profiler counts the leaf operators (a proxy for GPU kernel
launches), those of the targets alone (eager, also in --compile's rows), and the scalar reads
(`aten::_local_scalar_dense`, a proxy for host-device syncs). `limit` is the steps/s of the file's processes on this
machine's cores if the parts ran side by side with no overhead; the rate each file trains at is `python
benchmark/atari.py throughput`'s.

  python benchmark/profile_atari.py                       # -> benchmark/results/profile_atari.json and .md
  python benchmark/profile_atari.py --files impala --seconds 2 --before HEAD~1   # each part before and after
  python benchmark/profile_atari.py --files impala seed --compile   # also the update with --compile's loss

With --compile, IMPALA's and SEED's rows are followed by a variant whose learner step takes the loss under
torch.compile (the files' --compile); its parts other than the update stay eager, and its operator count adds the
compiled kernels to the leaf operators. `first_update_s` is the first update's time (with --compile: compiling).
"""

import argparse
import importlib.util
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
from run import machine  # noqa: E402

TEXT = dict(capture_output=True, text=True, check=True)
FILES = ["impala", "seed", "ddppo", "a3c", "apex", "r2d2"]
PARTS = ["env", "inference", "copy", "forward", "targets", "backward", "optimizer"]
MEASURED = ["steps_per_update", "reference_batch", "threads", "cores", "env", "inference", "copy", "forward"]
MEASURED += ["targets", "optimizer", "update", "reference", "reference_bf16"]
MEASURED += ["operators_per_update", "scalar_reads_per_update", "targets_operators", "first_update_s"]


def source(name: str, rev: str = "") -> Path:
    """algos/<name>.py: the working tree's, or a copy of the file at git revision `rev` (each file stands alone)."""
    if not rev:
        return ROOT / "algos" / f"{name}.py"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(subprocess.run(["git", "show", f"{rev}:algos/{name}.py"], cwd=ROOT, **TEXT).stdout)
    return path


def load(name: str, rev: str = ""):
    spec = importlib.util.spec_from_file_location(name, source(name, rev))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def preset_args(module, **extra):
    """The file's Args with its Atari preset (and `extra`) applied."""
    return module.Args(**{**module.PRESETS["atari"], **extra})


def timed(fns: list, seconds: float) -> list:
    """Median seconds per call of each of fns, called in turn (a, b, a, b, ...) for about `seconds` each after a
    warm-up call each, so that a slow or fast spell of the machine falls on all of them alike. At least three
    calls each, or one where a warm-up took longer than `seconds`."""
    warm_up = time.perf_counter()
    for fn in fns:
        fn()
    min_calls = 1 if time.perf_counter() - warm_up > seconds * len(fns) else 3
    times = [[] for _ in fns]
    start = time.perf_counter()
    while time.perf_counter() - start < seconds * len(fns) or len(times[0]) < min_calls:
        for fn, fn_times in zip(fns, times, strict=True):
            call_start = time.perf_counter()
            fn()
            fn_times.append(time.perf_counter() - call_start)
    return [statistics.median(fn_times) for fn_times in times]


def counted(fn) -> tuple:
    """(leaf operators, scalar reads) recorded by torch.profiler over one call of fn."""
    # quiet: the profiler's own start and stop lines
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    leaves = sum(1 for e in events if not any(c.name.startswith("aten::") for c in e.cpu_children))
    # torch.compile's kernels (recorded with inductor's cpp.enable_kernel_profile, set by --compile)
    leaves += sum(1 for e in prof.events() if "cpp_fused" in e.name)
    scalars = sum(1 for e in events if e.name == "aten::_local_scalar_dense")
    return leaves, scalars


def nature_cnn(num_actions: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3136, 512),
        nn.ReLU(),
        nn.Linear(512, num_actions),
    )


def reference(batch: int, bf16: bool = False):
    """One forward, backward and Adam step of the Nature CNN at `batch`, channels_last input (a function)."""
    net = nature_cnn(6)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    frames = torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8)

    def step():
        x = (frames.float() / 255.0).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(x)
        out.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def env_time(module, num_envs: int, seconds: float) -> float:
    """Seconds per env step of envpool stepping num_envs Pong envs with random actions on one thread."""
    envs = module.make_env("Pong-v5", num_envs, 1, 1)
    envs.reset()
    actions = np.random.randint(0, envs.action_space.n, (64, num_envs))
    calls = [0]

    def step():
        envs.step(actions[calls[0] % 64])
        calls[0] += 1

    per_call = timed([step], seconds)[0]
    envs.close()
    return per_call / num_envs


def frames(*shape) -> torch.Tensor:
    return torch.randint(0, 255, shape + (4, 84, 84), dtype=torch.uint8)


def clip_and_step(flat: torch.Tensor, optimizer, max_norm: float):
    def step():
        torch.nn.utils.clip_grad_norm_([flat], max_norm)
        optimizer.step()

    return step


# ------------------------------------------------------------------------------------------------- the files
def case_impala(name: str, module, compiled: bool = False) -> dict:
    """IMPALA and SEED share the learner: V-trace on [T + 1, B] frames. IMPALA's actors each infer for their
    num_envs; SEED's learner infers for every actor at once (one per CPU). compiled: the update's loss under
    torch.compile, as the files' --compile."""
    args = preset_args(module)
    T, B, A = args.unroll_length, args.batch_size, 6
    agent = module.Agent((4, 84, 84), A)
    flat = module.flatten_parameters(agent)
    optimizer = module.make_optimizer(args, flat)
    K = max(2, B // args.num_envs)
    buffers = {
        "obs": frames(K, T + 1, args.num_envs),
        "actions": torch.randint(0, A, (K, T, args.num_envs)),
        "logits": torch.zeros(K, T, args.num_envs, A),
        "state": torch.zeros(K, 2, args.num_envs, 0),
        "meta": torch.zeros(K, 3, dtype=torch.long),
    }
    for key in ["rewards", "terms", "dones", "returns", "ep_length"]:
        buffers[key] = torch.zeros(K, T, args.num_envs)
    buffers["valid"] = torch.ones(K, T, args.num_envs)
    buffers["ep_return"] = torch.full((K, T, args.num_envs), float("nan"))
    indices = list(range(B // args.num_envs))

    def take():
        batch, returns, _, _ = module.take_batch(buffers, indices, queue.Queue(), "cpu")
        return batch, returns

    batch, returns = take()
    valid_all = torch.ones(T + 1, B)
    logits, values, _ = agent(batch["obs"], valid_all, batch["state"])
    target_logp = torch.log_softmax(logits[:T].detach(), -1).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)

    def targets():
        module.vtrace(
            target_logp,
            target_logp,
            batch["rewards"],
            values[:T].detach(),
            values[T].detach(),
            batch["terms"],
            batch["dones"],
            batch["valid"],
            args.gamma,
        )

    # the compiled loss as the files' --compile hands it over (revisions before the flag take no such argument)
    compiled_loss = (torch.compile(module.impala_loss),) if compiled else ()

    def update():
        b, r = take()
        if name == "impala":
            module.learner_step(args, agent, optimizer, flat, b, r, lambda: torch.zeros(2), *compiled_loss)
        else:
            # SEED: the step is the training thread's next call (step_and_publish), under the inference lock
            module.learner_step(args, agent, optimizer, flat, b, r, *compiled_loss)
            optimizer.step()

    inference_batch = args.num_envs * (len(os.sched_getaffinity(0)) if name == "seed" else 1)
    obs = frames(1, inference_batch)
    state = agent.initial_state(inference_batch)
    ones = torch.ones(1, inference_batch)

    def infer():
        with torch.no_grad():
            agent(obs, ones, state)

    loss, _ = module.impala_loss(agent, batch, args)
    loss.backward()
    return {
        "steps_per_update": T * B,
        "reference_batch": (T + 1) * B,
        "threads": 1,
        "actor_envs": args.num_envs,
        "inference_batch": inference_batch,
        "infer": infer,
        "copy": take,
        "forward": lambda: agent(batch["obs"], valid_all, batch["state"]),
        "targets": targets,
        "optimizer": clip_and_step(flat, optimizer, args.max_grad_norm),
        "update": update,
    }


def case_ddppo(module) -> dict:
    """One rank (the 2-core default): a rollout of num_steps x local_num_envs, GAE, update_epochs x
    num_minibatches Adam steps."""
    args = preset_args(module)
    T, N, A = args.num_steps, args.local_num_envs, 6
    space = module.gym.spaces.Discrete(A)
    agent = module.Agent((4, 84, 84), space)
    flat = module.flatten_parameters(agent)
    optimizer = module.make_optimizer(args, flat)
    buffers = {"obs": frames(T, N), "actions": torch.randint(0, A, (T, N))}
    for key in ["logprobs", "values", "rewards", "terms", "dones"]:
        buffers[key] = torch.zeros(T, N)
    buffers["valid"] = torch.ones(T, N)
    buffers["logprobs"] -= np.log(A)
    state = {"obs": frames(N)}
    generator = torch.Generator().manual_seed(1)
    minibatch = T * N // args.num_minibatches
    steps = args.update_epochs * args.num_minibatches
    batch = module.learning_batch(agent, buffers, buffers["rewards"], T, state, args)
    sample = frames(minibatch)
    sample_actions = torch.randint(0, A, (minibatch,))

    def forward():
        for _ in range(steps):
            agent.get_action_and_value(sample, sample_actions)

    def targets():
        module.compute_gae(
            buffers["rewards"], buffers["values"], buffers["values"][0], buffers["terms"], buffers["dones"], 0.99, 0.95
        )

    def optimizer_steps():
        for _ in range(steps):
            torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
            optimizer.step()

    def update():
        b = module.learning_batch(agent, buffers, buffers["rewards"], T, state, args)
        module.ppo_update(agent, optimizer, b, args, generator, 1)

    obs = frames(N)

    def infer():
        with torch.no_grad():
            agent.get_action_and_value(obs, generator=generator)

    return {
        "steps_per_update": T * N,
        "reference_batch": minibatch,
        "reference_calls": steps,
        "threads": 1,
        # one rank, the 2-core default: rollout and update in turn
        "processes": 1,
        "actor_envs": N,
        "inference_batch": N,
        "infer": infer,
        "copy": lambda: module.learning_batch(agent, buffers, buffers["rewards"], T, state, args),
        "forward": forward,
        "targets": targets,
        "optimizer": optimizer_steps,
        "update": update,
        "batch": batch,
    }


def case_a3c(module) -> dict:
    """One Hogwild worker's segment: t_max x num_envs steps, the bootstrap forward, n-step returns, the loss's
    forward and backward, the clip and the shared optimizer's step (each worker does all of it, one thread)."""
    args = preset_args(module)
    T, N, A = args.t_max, args.num_envs, 6
    agent = module.Agent((4, 84, 84), module.gym.spaces.Discrete(A))
    flat = module.flatten_parameters(agent)
    optimizer = module.make_optimizer(args, flat)
    seg = {"obs": frames(T, N), "valid": torch.ones(T, N), "actions": torch.randint(0, A, (T, N))}
    for key in ["rewards", "terms", "dones", "values"]:
        seg[key] = torch.zeros(T, N)
    seg["state"] = agent.initial_state(N)
    live = {"obs": frames(N), "valid": torch.ones(N), "state": agent.initial_state(N)}

    def bootstrap_and_returns():
        with torch.no_grad():
            bootstrap = agent(live["obs"].unsqueeze(0), live["valid"].unsqueeze(0), live["state"])[1][0]
        return module.nstep_returns(seg["rewards"], seg["values"], bootstrap, seg["terms"], seg["dones"], args.gamma)

    returns = bootstrap_and_returns()

    def update():
        r = bootstrap_and_returns()
        optimizer.zero_grad(set_to_none=False)
        loss, _ = module.a3c_loss(agent, seg, r, args)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([flat], args.max_grad_norm)
        optimizer.step()

    def forward():
        with torch.no_grad():
            agent(live["obs"].unsqueeze(0), live["valid"].unsqueeze(0), live["state"])
        agent(seg["obs"], seg["valid"], seg["state"])

    obs = frames(1, N)

    def infer():
        with torch.no_grad():
            agent(obs, torch.ones(1, N), agent.initial_state(N))

    loss, _ = module.a3c_loss(agent, seg, returns, args)
    loss.backward()
    return {
        "steps_per_update": T * N,
        "reference_batch": T * N,
        "threads": 1,
        "actor_envs": N,
        "inference_batch": N,
        "infer": infer,
        "copy": None,
        "forward": forward,
        "targets": lambda: module.nstep_returns(
            seg["rewards"], seg["values"], seg["values"][0], seg["terms"], seg["dones"], args.gamma
        ),
        "optimizer": clip_and_step(flat, optimizer, args.max_grad_norm),
        "update": update,
    }


def replay_case(name: str, module) -> dict:
    """Ape-X and R2D2: a prioritized batch from a full replay, the file's learner_step (sample, loss, clip, Adam,
    priorities). Their n-step targets are the actors' work; the learner's own no-grad passes (double Q's
    bootstrap, the target network, R2D2's burn-in) count in forward."""
    args = preset_args(module)
    spec = module.envpool.make_spec("Pong-v5")
    q_net = module.make_network(args, spec)
    target_net = module.make_network(args, spec)
    flat = module.flatten_parameters(q_net)
    optimizer = torch.optim.Adam([flat], lr=args.learning_rate, eps=args.adam_eps)
    buffers = module.block_buffers(args, spec, 1, shared=False)
    keys = module.TRANSITION_KEYS if name == "apex" else module.SEQUENCE_KEYS
    fields = {key: buffers[key][0, 0] for key in keys}
    capacity = 4 * args.batch_size
    replay = module.PrioritizedReplay(capacity, fields, args.alpha, args.priority_eps, "cpu")
    for value in replay.data.values():
        if value.dtype == torch.uint8:
            value.random_(0, 255)
    if name == "r2d2":
        replay.data["obs_valid"].fill_(1.0)
        replay.data["train"].fill_(1.0)
        replay.data["boot"].copy_(torch.arange(replay.data["boot"].shape[1]).clamp(max=replay.data["boot"].shape[1]))
        replay.data["prev_action"].random_(0, spec.action_space.n)
    replay.tree.update(np.arange(capacity), np.ones(capacity))
    replay.size = capacity
    rng = np.random.default_rng(1)
    progress = {"global_step": 0, "update": 0}
    stats = {"sample_s": 0.0, "sampled": 0, "learn_s": 0.0}
    extra = (module.rescaling_eps(args, spec),) if name == "r2d2" else ()
    _, batch, weights = replay.sample(args.batch_size, args.beta, rng)

    def forward():
        if name == "apex":
            module.apex_loss(q_net, target_net, batch, weights)
        else:
            module.r2d2_loss(q_net, target_net, batch, weights, args.burn_in, args.eta, *extra)

    def update():
        module.learner_step(args, q_net, target_net, optimizer, replay, rng, progress, stats, *extra)

    # the samples with gradient: Ape-X's batch; R2D2's sequences after the burn-in, with their bootstrap step
    samples = args.batch_size if name == "apex" else args.batch_size * (args.sequence_length + 1)
    obs = torch.as_tensor(frames(args.num_envs).numpy())

    if name == "apex":

        def infer():
            with torch.no_grad():
                q_net(obs)
    else:
        state = q_net.initial_state(args.num_envs)
        prev = torch.zeros(args.num_envs, 1, dtype=torch.long)

        def infer():
            with torch.no_grad():
                q_net(obs.unsqueeze(1), prev, prev.float(), torch.ones(args.num_envs, 1), state)

    forward_out = module.apex_loss(q_net, target_net, batch, weights) if name == "apex" else None
    if forward_out is None:
        forward_out = module.r2d2_loss(q_net, target_net, batch, weights, args.burn_in, args.eta, *extra)
    forward_out[0].backward()
    return {
        "steps_per_update": int(args.steps_per_update),
        "reference_batch": samples,
        "threads": 1,
        "actor_envs": args.num_envs,
        "inference_batch": args.num_envs,
        "infer": infer,
        "copy": lambda: replay.sample(args.batch_size, args.beta, rng),
        "forward": forward,
        "targets": None,
        "optimizer": clip_and_step(flat, optimizer, args.max_grad_norm),
        "update": update,
        "module": module,
    }


def make_case(name: str, module, compiled: bool = False) -> dict:
    if name in ("impala", "seed"):
        return case_impala(name, module, compiled)
    if name == "ddppo":
        return case_ddppo(module)
    if name == "a3c":
        return case_a3c(module)
    return replay_case(name, module)


# ------------------------------------------------------------------------------------------------- main
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX); without it autocast emulates bf16."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def profile(name: str, seconds: float, variants: list, bf16: bool) -> list:
    """One row per variant of the file ((git revision, "" for the working tree; compiled)), each part timed in
    turn across the variants; the reference is timed in turn with the updates."""
    modules = [load(name, rev) for rev, _ in variants]
    # the process's allocator as the file sets it at start (keep_freed_memory, where the version has it); process-wide,
    # so it holds for every later part and file of this invocation: compare versions across it in two invocations
    for module in modules:
        if hasattr(module, "keep_freed_memory"):
            module.keep_freed_memory()
    cases = [make_case(name, module, compiled) for module, (_, compiled) in zip(modules, variants, strict=True)]
    # the sizes (the preset's) are the same in every variant
    case = cases[0]
    steps = case["steps_per_update"]
    torch.set_num_threads(1)
    # envpool's stepping: the same library call in every variant
    env = env_time(modules[-1], case["actor_envs"], seconds)
    inference = timed([c["infer"] for c in cases], seconds)
    torch.set_num_threads(case["threads"])
    first_update = []
    for c in cases:
        start = time.perf_counter()
        c["update"]()
        first_update.append(time.perf_counter() - start)
    parts = {}
    for part in ["copy", "forward", "targets", "optimizer"]:
        parts[part] = timed([c[part] for c in cases], seconds) if case[part] is not None else [0.0] * len(cases)
    references = [reference(case["reference_batch"])] + ([reference(case["reference_batch"], True)] if bf16 else [])
    times = timed([c["update"] for c in cases] + references, seconds)
    parts["update"] = times[: len(cases)]
    ref = times[len(cases)]
    ref_bf16 = times[len(cases) + 1 :]
    calls = case.get("reference_calls", 1)
    rows = []
    for v, variant in enumerate(cases):
        row = {"steps_per_update": steps, "reference_batch": case["reference_batch"], "threads": case["threads"]}
        row["env"] = env
        row["inference"] = inference[v] / case["inference_batch"]
        for part, times in parts.items():
            row[part] = times[v] / steps
        row["reference"] = ref * calls / steps
        row["reference_bf16"] = ref_bf16[0] * calls / steps if bf16 else None
        row["operators_per_update"], row["scalar_reads_per_update"] = counted(variant["update"])
        row["targets_operators"] = counted(variant["targets"])[0] if variant["targets"] is not None else 0
        row["cores"] = min(len(os.sched_getaffinity(0)), case.get("processes", 64))
        row["first_update_s"] = first_update[v]
        rows.append(row)
    return rows


def table(rows: dict) -> str:
    head = "| file | " + " | ".join(PARTS) + " | update | reference | bf16 | update / ref | ops | targets ops"
    head += " | scalar reads |"
    lines = [head, "|" + "---|" * (len(PARTS) + 8)]
    for name, row in rows.items():
        cells = [f"{1e3 * row[part]:.3f}" for part in PARTS]
        bf16 = f"{1e3 * row['reference_bf16']:.3f}" if row["reference_bf16"] is not None else "not run"
        cells += [f"{1e3 * row['update']:.3f}", f"{1e3 * row['reference']:.3f}", bf16]
        cells += [f"{row['update_over_reference']:.2f}", str(int(row["operators_per_update"]))]
        cells += [str(int(row.get("targets_operators", 0)))]  # records before the count: 0
        cells += [str(int(row["scalar_reads_per_update"]))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| file | CPU ms per step | cores | limit (steps/s) |")
    lines.append("|---|---|---|---|")
    for name, row in rows.items():
        lines.append(f"| {name} | {row['cpu_ms_per_step']:.3f} | {row['cores']} | {row['limit_sps']:.0f} |")
    return "\n".join(lines) + "\n"


def derived(row: dict) -> dict:
    """The measured parts and what follows from them: backward (the rest of the update), the update over the
    reference, the CPU time per step and the limit on the file's cores (the parts side by side, no overhead)."""
    measured = {key: value for key, value in row.items() if key in MEASURED}
    rest = sum(measured[part] for part in ["copy", "forward", "targets", "optimizer"])
    measured["backward"] = max(0.0, measured["update"] - rest)
    measured["update_over_reference"] = measured["update"] / measured["reference"]
    cpu = measured["env"] + measured["inference"] + measured["update"]
    measured["cpu_ms_per_step"] = 1e3 * cpu
    measured["limit_sps"] = measured["cores"] / cpu
    return measured


def median_row(rows: list) -> dict:
    """Each measured figure's median over repeated profiles of one file (the counts are the same in each), and
    what follows from the medians."""
    medians = {key: None if rows[0][key] is None else statistics.median(row[key] for row in rows) for key in rows[0]}
    return derived(medians)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", nargs="+", default=FILES, choices=FILES)
    p.add_argument("--seconds", type=float, default=4.0, help="timing per part")
    p.add_argument("--repeats", type=int, default=1, help="profiles per file; each figure is the median over them")
    p.add_argument("--before", default="", help="also profile the files at this git revision, each part in turn")
    p.add_argument("--bf16", choices=["auto", "on", "off"], default="auto", help="auto: where the CPU has bf16")
    p.add_argument("--compile", action="store_true", help="IMPALA and SEED: also the update with --compile's loss")
    p.add_argument("--out", default=str(ROOT / "benchmark" / "results" / "profile_atari.json"))
    p.add_argument("--table", metavar="RESULTS", help="only write the tables (and derived figures) of this record")
    a = p.parse_args()
    if a.table:
        record = json.loads(Path(a.table).read_text())
        record["rows"] = {label: derived(row) for label, row in record["rows"].items()}
        Path(a.table).write_text(json.dumps(record, indent=2) + "\n")
        Path(a.table).with_suffix(".md").write_text(table(record["rows"]))
        print(table(record["rows"]))
        return
    if a.compile:
        # the compiled kernels as profiler events, so that `counted` sees them
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    bf16 = a.bf16 == "on" or (a.bf16 == "auto" and native_bf16())
    rows = {}
    for name in a.files:
        variants = [(a.before, False), ("", False)] if a.before else [("", False)]
        if a.compile and name in ("impala", "seed"):
            variants.append(("", True))
        runs = [profile(name, a.seconds, variants, bf16) for _ in range(a.repeats)]
        for v, (rev, compiled) in enumerate(variants):
            label = f"{name} at {rev}" if rev else name + (", compiled" if compiled else "")
            rows[label] = median_row([run[v] for run in runs])
            print(f"{label}: " + ", ".join(f"{k} {1e3 * rows[label][k]:.3f}" for k in PARTS + ["update", "reference"]))
    record = {"machine": machine(), "command": " ".join(sys.argv).replace(str(ROOT) + "/", ""), "ms": "per env step"}
    record["before"] = a.before
    record["native_bf16"] = native_bf16()
    record["rows"] = rows
    Path(a.out).write_text(json.dumps(record, indent=2) + "\n")
    Path(a.out).with_suffix(".md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
