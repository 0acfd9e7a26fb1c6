"""Two nodes on one machine: two network namespaces joined by a veth pair, one torchrun agent in each, c10d
rendezvous on the first, gloo over the veth (GLOO_SOCKET_IFNAME). The addresses are private test addresses that
exist only inside the namespaces this module creates and removes. Needs root (`ip netns`); skipped elsewhere."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ALGOS, child_env, wait_for

ADDRESS = {"A": "10.77.0.1", "B": "10.77.0.2"}  # node A hosts the rendezvous
PORT = 29400  # free: nothing else lives in a fresh namespace
ENV = "CartPole-v1"


def ip(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def nodes():
    """Namespace and veth names of nodes A and B (unique to this process), removed at the end."""
    suffix = os.getpid() % 100_000
    node = {name: (f"distrl{name}{suffix}", f"v{name}{suffix}") for name in "AB"}
    steps = [
        *[["netns", "add", node[name][0]] for name in "AB"],
        ["link", "add", node["A"][1], "type", "veth", "peer", "name", node["B"][1]],
    ]
    for name in "AB":
        namespace, veth = node[name]
        steps += [
            ["link", "set", veth, "netns", namespace],
            ["-n", namespace, "addr", "add", f"{ADDRESS[name]}/24", "dev", veth],
            ["-n", namespace, "link", "set", veth, "up"],
            ["-n", namespace, "link", "set", "lo", "up"],
        ]
    try:
        for step in steps:
            proc = ip(*step)
            if proc.returncode != 0:
                pytest.skip(f"two-node tests need network namespaces (root): `ip {' '.join(step)}`: {proc.stderr}")
        yield node
    finally:
        for namespace, _ in node.values():
            ip("netns", "del", namespace)


def start_agent(node: dict, name: str, algo: str, cwd, *args) -> subprocess.Popen:
    """One node's torchrun agent with one rank, in its own namespace and process group."""
    namespace, veth = node[name]
    cwd.mkdir(exist_ok=True)
    command = [
        *["ip", "netns", "exec", namespace, "env", f"GLOO_SOCKET_IFNAME={veth}"],
        *[sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"],
        *["--rdzv-backend=c10d", f"--rdzv-endpoint={ADDRESS['A']}:{PORT}", f"--rdzv-id=distrl{os.getpid()}"],
        # node A must be told that the endpoint is its own address, or no store server starts
        *(["--rdzv-conf", "is_host=1"] if name == "A" else []),
        *["--local-addr", ADDRESS[name], str(ALGOS / f"{algo}.py"), *map(str, args)],
    ]
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_all(procs: dict) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def finish(procs: dict, timeout: float) -> dict:
    try:
        return {name: proc.communicate(timeout=timeout)[0] for name, proc in procs.items()}
    finally:
        kill_all(procs)


CASES = {
    "ddppo": ["--total-timesteps", 4096, "--local-num-envs", 8, "--eval-episodes", 2],
    # rank 0: the learner with one local actor; rank 1 on node B: a remote actor
    "seed": ["--total-timesteps", 16000, "--num-actors", 1, "--inference-timeout-ms", 10000, "--eval-episodes", 2],
    "es": ["--total-timesteps", 2000, "--eval-episodes", 2],
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_two_nodes_train_together(nodes, tmp_path, algo):
    import json

    procs = {name: start_agent(nodes, name, algo, tmp_path / name, *CASES[algo]) for name in "AB"}
    outputs = finish(procs, timeout=240)
    for name, proc in procs.items():
        assert proc.returncode == 0, f"node {name} exited {proc.returncode}:\n{outputs[name][-3000:]}"
    summary = json.loads((tmp_path / "A" / "runs" / f"{ENV}__{algo}__1" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert not (tmp_path / "B" / "runs" / f"{ENV}__{algo}__1" / "summary.json").exists()  # rank 0 writes it
    if algo == "seed":  # node B's actor took part: every inference batch held its envs beside the local actor's
        assert summary["num_actors"] == 2 and summary["inference_batch_mean"] == 2 * 8
    if algo == "es":  # node B evaluated its half of every generation
        assert summary["global_step"] >= 2000
    if algo == "ddppo":
        assert summary["global_step"] == 4096


def namespace_pids(namespace: str) -> list:
    """Living processes of a namespace (`ip netns pids`; zombies excluded)."""
    pids = [int(pid) for pid in ip("netns", "pids", namespace).stdout.split()]
    return [
        pid
        for pid in pids
        if os.path.exists(f"/proc/{pid}") and "\nState:\tZ" not in open(f"/proc/{pid}/status").read()
    ]


def test_dead_node_ends_the_other_within_seconds(nodes, tmp_path):
    """Node B disappears (every process in its namespace SIGKILLed at once): node A's rank fails its next
    collective, and node A's agent ends non-zero within seconds, with no process left in its namespace."""
    procs = {name: start_agent(nodes, name, "ddppo", tmp_path / name, "--total-timesteps", 10**8) for name in "AB"}
    try:
        run_dir = tmp_path / "A" / "runs" / f"{ENV}__ddppo__1"
        assert wait_for(lambda: any(run_dir.glob("events.out.tfevents.*")), 120, 0.2), "node A did not start"
        time.sleep(2.0)
        victims = namespace_pids(nodes["B"][0])
        assert len(victims) >= 2  # the agent and its rank
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        output = procs["A"].communicate(timeout=60)[0]
        assert time.time() - killed_at < 20, f"node A took {time.time() - killed_at:.0f} s to end:\n{output[-3000:]}"
        assert procs["A"].returncode != 0, output[-3000:]
        assert wait_for(lambda: not namespace_pids(nodes["A"][0]), 10), "a process of node A outlived it"
    finally:
        kill_all(procs)
