"""Bad arguments, one table across the nine files (docs/conventions.md §8, docs/reliability.md): each is refused
with exit code 2 and one line on stderr naming the argument, before anything starts. The table runs in-process
through the files' own parser (tyro) and `validate`, which `main` calls before it creates a run folder, a worker or
an environment; one case per file runs end to end as a user would (exit 2, one line, no runs/ folder, under 10 s).
Bad checkpoints: test_bad_checkpoint.py."""

import time

import pytest
import tyro
from conftest import assert_bad_argument, command_line_args, load_algo

VALUE_BASED = [
    (["--seed", -1], "seed"),
    (["--env-id", "NoSuchEnv-v0"], "env-id"),
    (["--env-id", "Pendulum-v1"], "env-id"),
]
APEX = VALUE_BASED + [
    (["--n-step", 0], "n-step"),
    (["--gamma", 1.5], "gamma"),
    (["--beta", 0], "beta"),
    (["--network", "nature"], "network"),
    (["--batch-size", 512, "--buffer-size", 256], "batch-size"),
    (["--num-buffers", 1], "num-buffers"),
    (["--steps-per-update", 0], "steps-per-update"),
    (["--num-envs", 0], "num-envs"),
    (["--buffer-size", 100, "--batch-size", 32], "buffer-size"),
    (["--max-grad-norm", 0], "max-grad-norm"),
]

# file -> [(arguments, the argument the one line must name), ...]
BAD = {
    "a3c": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--t-max", 0], "t-max"),
        (["--num-workers", -1], "num-workers"),
        (["--gamma", 1.5], "gamma"),
        (["--rmsprop-eps", 0], "rmsprop-eps"),
        (["--env-id", "Pong-v5", "--num-envs", 0], "num-envs"),
    ],
    "apex": APEX,
    "r2d2": VALUE_BASED
    + [
        (["--sequence-overlap", 20, "--sequence-length", 20], "sequence-overlap"),
        (["--burn-in", -1], "burn-in"),
        (["--eta", 1.5], "eta"),
        (["--mask-velocity", "--env-id", "Acrobot-v1"], "mask-velocity"),
        (["--buffer-size", 20, "--batch-size", 8], "buffer-size"),
        (["--value-rescaling-eps", 0], "value-rescaling-eps"),
    ],
    "ddppo": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "MiniGrid-Empty-5x5-v0"], "env-id"),
        (["--num-minibatches", 3], "num-minibatches"),
        (["--local-num-envs", -4], "local-num-envs"),
        (["--total-timesteps", 0], "total-timesteps"),
        (["--sync-frac", 1.5], "sync-frac"),
        (["--env-id", "Pong-v5", "--norm-obs"], "norm-obs"),
        (["--clip-obs", 0], "clip-obs"),
        (["--clip-reward", -1], "clip-reward"),
        (["--max-grad-norm", 0], "max-grad-norm"),
    ],
    "es": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "Pong-v5"], "env-id"),
        (["--population-size", 7], "population-size"),
        (["--sigma", 0], "sigma"),
        (["--noise-table-size", 100], "noise-table-size"),
        (["--num-workers", 0], "num-workers"),
    ],
    "ga": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "Pong-v5"], "env-id"),
        (["--truncation", 64], "truncation"),
        (["--elite-candidates", 0], "elite-candidates"),
        (["--sigma", -1], "sigma"),
        (["--population-size", 1], "population-size"),
    ],
    "fedpg": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "Pong-v5"], "env-id"),
        (["--num-byzantine", 5], "num-byzantine"),
        (["--num-clients", 0], "num-clients"),
        (["--aggregator", "fedpg-br", "--local-updates", 2], "local-updates"),
        (["--alpha", 0.5], "alpha"),
        (["--trim-fraction", 0.5], "trim-fraction"),
        (["--heterogeneity", 0.5, "--env-id", "Pendulum-v1"], "heterogeneity"),
        (["--num-workers", 11], "num-workers"),
    ],
    "impala": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "Pendulum-v1"], "env-id"),
        (["--batch-size", 12], "batch-size"),
        (["--num-envs", 0], "num-envs"),
        (["--rho-bar", 0], "rho-bar"),
        (["--vtrace-lambda", 1.5], "vtrace-lambda"),
        (["--network", "resnet"], "network"),
        (["--deterministic", "--num-actors", 3], "num-actors"),
        (["--num-buffers", 1, "--batch-size", 16], "num-buffers"),
        (["--max-grad-norm", 0], "max-grad-norm"),
        (["--restart-every", 5], "restart-every"),  # restart points are the deterministic mode's
        (["--deterministic", "--restart-every", -1], "restart-every"),
    ],
    "seed": [
        (["--seed", -1], "seed"),
        (["--env-id", "NoSuchEnv-v0"], "env-id"),
        (["--env-id", "Pendulum-v1"], "env-id"),
        (["--batch-size", 12], "batch-size"),
        (["--inference-timeout-ms", -1], "inference-timeout-ms"),
        (["--c-bar", 0], "c-bar"),
        (["--network", "nature"], "network"),
        (["--num-buffers", 1, "--batch-size", 16], "num-buffers"),
        # 3 actors and 2 buffers per batch would deadlock: 3 + 2 - 1 = 4 buffers needed
        (["--num-actors", 3, "--batch-size", 16, "--num-buffers", 3], "num-buffers"),
        (["--max-grad-norm", 0], "max-grad-norm"),
    ],
}
# the timeouts every file takes (reliability: hangs)
TIMEOUTS = {name: ["collective-timeout"] for name in BAD}
TIMEOUTS.update(
    {
        "a3c": ["worker-timeout"],
        "apex": ["collective-timeout", "actor-timeout"],
        "r2d2": ["collective-timeout", "actor-timeout"],
        "impala": ["collective-timeout", "actor-timeout"],
        "seed": ["collective-timeout", "actor-timeout"],
    }
)
# envpool renders MuJoCo through a GPU context; without one its render() would end the process
for name in ["a3c", "ddppo", "es", "fedpg", "ga"]:
    BAD[name] = BAD[name] + [(["--env-id", "Hopper-v4", "--capture-video"], "capture-video")]


def timeout_cases(name: str) -> list:
    """Every timeout refused at 0 and -1; the silence timeouts of local actors and workers under 2 s as well (a
    pause of the learner's own over half of one restarts its count: a shorter one might never fire)."""
    cases = []
    for timeout in TIMEOUTS[name]:
        for value in (0, -1, 1.5) if timeout in ("actor-timeout", "worker-timeout") else (0, -1):
            cases.append(([f"--{timeout}", value], timeout))
    return cases


CASES = [
    pytest.param(name, args, arg, id=f"{name}-{arg}={args[1]}")
    for name, table in BAD.items()
    for args, arg in table + timeout_cases(name)
]
MODULES = {}


def module(name: str):
    if name not in MODULES:
        MODULES[name] = load_algo(name)
    return MODULES[name]


@pytest.mark.parametrize("name,args,arg", CASES)
def test_bad_argument_is_refused_naming_it(capsys, name, args, arg):
    algo = module(name)
    with pytest.raises(SystemExit) as refused:
        algo.validate(tyro.cli(command_line_args(algo), args=[str(a) for a in args]))
    assert refused.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--{arg}" in lines[0], lines


def test_an_unknown_choice_is_refused_by_the_parser(capsys):
    """tyro itself refuses a value outside a Literal's choices: exit 2 with a message that names the argument."""
    algo = module("fedpg")
    with pytest.raises(SystemExit) as refused:
        tyro.cli(algo.Args, args=["--attack", "label-flip"])
    assert refused.value.code == 2 and "--attack" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_argument_ends_the_real_command_at_once(runner, name):
    """End to end, as a user types it: `python algos/<name>.py --seed -1` exits 2 with one line, no traceback,
    no runs/ folder, in under 10 s (start-up included)."""
    started = time.time()
    proc = runner.run(name, "--seed", -1, timeout=60)
    assert_bad_argument(proc, "--seed", runner.cwd)
    assert time.time() - started < 10
