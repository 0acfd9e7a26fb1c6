"""Device placement, checked on a CPU-only machine. The learner's functions run on PyTorch's "meta" device (shapes and
dtypes, no data) under a dispatch mode that applies CUDA's placement rules: a tensor created on the CPU in the middle
of work on the device fails here as it would on a GPU, instead of only on the first GPU run."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import load_algo
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ddppo, impala, seed, apex, r2d2 = (
    load_algo("ddppo"),
    load_algo("impala"),
    load_algo("seed"),
    load_algo("apex"),
    load_algo("r2d2"),
)
META, CPU = torch.device("meta"), torch.device("cpu")
aten = torch.ops.aten
# Explicit moves between devices (`.to`, `.cpu()`, `x[t] = cpu_tensor`, `torch.tensor(data)`) are allowed, as on CUDA.
TRANSFERS = {aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default, aten.lift_fresh_copy.default}


class MetaGenerator(torch.Generator):
    """Stands for a generator on the device: code that allocates on `generator.device` allocates on meta. (There are
    no meta generators; meta kernels ignore the generator, whose state lives on the CPU.)"""

    device = META


class OnDevice(TorchDispatchMode):
    """Every op that touches the device must find all its other tensors there too, except 0-dim CPU tensors (CUDA
    takes those as scalars); an op drawing from a generator must produce its result on the device (the generator is
    there). Stricter than CUDA in one way: index tensors must be on the device as well (CUDA silently copies CPU
    indices over, a host-to-device transfer each time). Copies from the device to the CPU return zeros (meta tensors
    have no data), so that code can hand actions to an environment."""

    def __init__(self, device=META):
        super().__init__()
        self.device = device

    def check(self, func, tensors, what):
        if any(t.device == self.device for t in tensors):
            for t in tensors:
                if t.device != self.device and t.dim() > 0:
                    raise AssertionError(f"{func} on {self.device}: {what} {tuple(t.shape)} {t.dtype} on {t.device}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default and args[0].device == self.device and kwargs.get("device") == CPU:
            return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if func is aten.copy_.default and args[0].device == CPU and args[1].device == self.device:
            return args[0].zero_()
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func not in TRANSFERS:
            self.check(func, inputs, "input")
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if func not in TRANSFERS:
            self.check(func, inputs + outputs, "output")
        if kwargs.get("generator") is not None and any(t.device != self.device for t in outputs):
            raise AssertionError(f"{func} draws from the device's generator into a tensor on {outputs[0].device}")
        return out


@pytest.fixture
def on_device(monkeypatch):
    """The mode, and collectives that check their tensor is on the device (NCCL reduces GPU tensors only): the
    tests pass world_size=2 so that the all-reduce branches run; the fake all-reduce leaves the tensor as it is."""
    calls = []

    def all_reduce(tensor, *args, **kwargs):
        assert tensor.device == META, f"all_reduce of a tensor on {tensor.device}"
        calls.append(tuple(tensor.shape))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    with OnDevice() as mode:
        mode.all_reduce_calls = calls
        yield mode


def test_the_guard_catches_what_cuda_rejects(on_device):
    x = torch.ones(5, device=META)
    for mistake in [
        lambda: torch.zeros(5).add_(x),  # CPU accumulator of device results
        lambda: x + torch.zeros(5),
        lambda: torch.randperm(5, generator=MetaGenerator()),  # device generator, CPU result
        lambda: x[torch.tensor([0, 1])],  # CPU index (stricter than CUDA)
        lambda: dist.all_reduce(torch.zeros(3)),
    ]:  # NCCL: GPU tensors only
        with pytest.raises(AssertionError):
            mistake()
    # allowed: CPU scalars, explicit transfers, generators drawing on the device, arrays from the environment
    x * torch.tensor(2.0) + 1.0
    assert x.cpu().device == CPU and torch.as_tensor(np.ones(5), device=META).device == META
    x[torch.randperm(5, generator=MetaGenerator(), device=META)] = torch.zeros(5, device=META)
    x[0] = torch.zeros(())
    dist.all_reduce(x)


# ------------------------------------------------------------------------------------------ DD-PPO
def ddppo_agent(continuous: bool, norm: bool = False):
    space = ddppo.gym.spaces.Box(-1, 1, (2,)) if continuous else ddppo.gym.spaces.Discrete(2)
    return ddppo.Agent((4,), space, norm_obs=norm, norm_reward=norm).to(META), space


@pytest.mark.parametrize("continuous,norm", [(False, False), (True, True)])
@pytest.mark.parametrize("n,minibatches", [(32, 2), (3, 4)])  # (3, 4): an empty minibatch takes the fallback path
def test_ddppo_learner_on_device(on_device, continuous, norm, n, minibatches):
    agent, _ = ddppo_agent(continuous, norm)
    actions = torch.zeros(n, 2, device=META) if continuous else torch.zeros(n, dtype=torch.long, device=META)
    batch = {
        "obs": torch.zeros(n, 4, device=META),
        "actions": actions,
        **{k: torch.zeros(n, device=META) for k in ["logprobs", "values", "advantages", "returns"]},
    }
    args = ddppo.Args(num_minibatches=minibatches, update_epochs=2, clip_vloss=True)
    optimizer = ddppo.make_optimizer(args, ddppo.flatten_parameters(agent))
    stats = ddppo.ppo_update(agent, optimizer, batch, args, MetaGenerator(), world_size=2)
    adam_state = optimizer.state_dict()["state"][0]
    assert stats.device == META and adam_state["exp_avg"].device == adam_state["exp_avg_sq"].device == META
    assert len(on_device.all_reduce_calls) == 1 + args.update_epochs * minibatches  # advantage stats + gradients
    T, N = 5, 3
    adv, ret = ddppo.compute_gae(
        *[torch.zeros(T, N, device=META)] * 2,
        torch.zeros(N, device=META),
        *[torch.zeros(T, N, device=META)] * 2,
        0.99,
        0.95,
    )
    assert adv.device == ret.device == META


@pytest.mark.parametrize("env_id,norm", [("CartPole-v1", False), ("Pendulum-v1", True)])
def test_ddppo_rollout_normalizers_and_evaluate_on_device(on_device, env_id, norm):
    spec = ddppo.envpool.make_spec(env_id)
    agent = ddppo.Agent(spec.observation_space.shape, spec.action_space, norm, norm).to(META)
    T, N = 6, 3
    args = ddppo.Args(env_id=env_id, num_steps=T, local_num_envs=N)
    envs = ddppo.make_env(env_id, N, 0)
    obs, _ = envs.reset()
    state = {
        "obs": torch.as_tensor(obs, device=META),
        "valid": torch.ones(N, device=META),
        "prev_done": np.zeros(N, bool),
        "ep_return": np.zeros(N),
        "ep_length": np.zeros(N),
        "finished": [],
        "ret_acc": torch.zeros(N, device=META),
    }
    buf = {k: torch.zeros(T, N, device=META) for k in ["logprobs", "values", "rewards", "terms", "dones", "valid"]}
    buf["obs"] = torch.zeros((T, N) + spec.observation_space.shape, device=META)
    buf["actions"] = torch.zeros(
        (T, N) + spec.action_space.shape, device=META, dtype=torch.float32 if agent.continuous else torch.long
    )
    assert ddppo.collect_rollout(agent, envs, state, buf, args, MetaGenerator(), None, 0) == T
    rewards, obs_stats = ddppo.update_normalizers(agent, buf, T, state, args, world_size=2)
    assert rewards.device == META and len(on_device.all_reduce_calls) == int(norm)
    if norm:
        agent.obs_rms.load(*obs_stats)
        assert state["ret_acc"].device == META
    assert ddppo.global_sum([1.0, 2.0], META, world_size=2).device == META  # main's per-update counters
    assert len(ddppo.evaluate(agent, env_id, 2, 0, META)) == 2


def test_ddppo_checkpoint_loads_onto_the_device(tmp_path):
    cpu_agent = ddppo.Agent((4,), ddppo.gym.spaces.Box(-1, 1, (2,)), True, True)  # a checkpoint of a CPU run
    cpu_optimizer = ddppo.make_optimizer(ddppo.Args(), ddppo.flatten_parameters(cpu_agent))
    cpu_optimizer.step()  # Adam's state exists from the first step
    checkpoint = {
        **ddppo.new_progress(ddppo.run_config(ddppo.Args())),
        "model": cpu_agent.state_dict(),
        "optimizer": cpu_optimizer.state_dict(),
    }
    ddppo.save_checkpoint(str(tmp_path / "c.pt"), checkpoint)
    agent, _ = ddppo_agent(True, True)
    with OnDevice():  # as main: parameters flattened on the device, then restore() loads the CPU checkpoint
        optimizer = ddppo.make_optimizer(ddppo.Args(), ddppo.flatten_parameters(agent))
        args = ddppo.RunArgs(resume=True)
        ddppo.restore(args, agent, optimizer, META, str(tmp_path / "c.pt"))
        optimizer.step()
    assert all(v.device == META for v in agent.state_dict().values())
    adam_state = optimizer.state_dict()["state"][0]
    assert adam_state["exp_avg"].device == adam_state["exp_avg_sq"].device == META


# ------------------------------------------------------------------------------------------ IMPALA and SEED learners
@pytest.mark.parametrize("module", [impala, seed], ids=["impala", "seed"])
@pytest.mark.parametrize("use_lstm", [False, True])
def test_vtrace_learner_on_device(on_device, module, use_lstm):
    T, B, A = 5, 3, 2
    agent = module.Agent((4,), A, use_lstm=use_lstm, norm_reward=True).to(META)
    batch = {
        "obs": torch.zeros(T + 1, B, 4, device=META),
        "actions": torch.zeros(T, B, dtype=torch.long, device=META),
        "logits": torch.zeros(T, B, A, device=META),
        "state": agent.initial_state(B, META),
        **{k: torch.zeros(T, B, device=META) for k in ["rewards", "terms", "dones", "valid"]},
    }
    rms = agent.return_rms  # main's reward scaler: scale with the statistics so far, merge the batch's returns
    batch["rewards"] = module.scale_rewards(batch["rewards"], rms, 10.0)
    rms.load(
        *module.rms_merge(
            rms.mean,
            rms.var,
            rms.count,
            module.rms_moments(torch.zeros(T, B, device=META), batch["valid"].reshape(-1), rms.mean),
        )
    )
    assert batch["rewards"].device == rms.var.device == META
    flat = module.flatten_parameters(agent)
    for optimizer in ("rmsprop", "adam"):  # main's learner step: loss, backward, clip, torch's optimizer on flat
        args = module.Args(optimizer=optimizer)
        torch_optimizer = module.make_optimizer(args, flat)
        extra = (lambda: torch.zeros(2, device=META),) if module is impala else ()
        losses = module.learner_step(args, agent, torch_optimizer, flat, dict(batch), torch.zeros(T, B), *extra)
        if module is impala:
            losses = losses[0]
        else:
            module.step_and_publish(torch_optimizer, module.threading.Lock(), {}, 1)
        state = [value for value in torch_optimizer.state[flat].values() if value.dim() > 0]
        assert losses.device == flat.grad.device == META and all(value.device == META for value in state)
    assert len(module.evaluate(agent, "CartPole-v1", 2, 0, META)) == 2


class Transfers(TorchDispatchMode):
    """Counts the copies from the CPU to the device."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default and args[0].device == CPU and kwargs.get("device") == META:
            self.count += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("module", [impala, seed], ids=["impala", "seed"])
def test_take_batch_moves_the_batch_in_one_copy(on_device, module):
    """The learner's tensors reach the device in one host-to-device copy; the bookkeeping stays on the CPU."""
    args = module.Args(num_envs=3, unroll_length=4)
    space = SimpleNamespace(observation_space=SimpleNamespace(shape=(4, 84, 84)), action_space=SimpleNamespace(n=6))
    buffers = module.unroll_buffers(args, space, 4, state_width=0)
    with Transfers() as transfers:
        batch, returns, _, _ = module.take_batch(buffers, [2, 0], module.queue.Queue(), META)
    assert transfers.count == 1
    assert all(value.device == META for value in batch.values()) and returns.device == CPU
    assert batch["obs"].shape == (5, 6, 4, 84, 84) and batch["obs"].dtype == torch.uint8
    assert batch["actions"].shape == (4, 6) and batch["actions"].dtype == torch.long


@pytest.mark.parametrize("module", [ddppo, impala, seed, apex, r2d2], ids=["ddppo", "impala", "seed", "apex", "r2d2"])
def test_a_resumed_optimizer_keeps_the_adam_of_its_device(module):
    """load_optimizer: the state of an unfused Adam (a CPU run's checkpoint) loads into a fused one (a CUDA run) as
    fused, and the other way round, and the loaded optimizer steps on from the saved counter. Fused Adam also runs
    on the CPU, which stands in for CUDA here."""
    for written, loading in [(False, True), (True, False)]:
        flat = torch.zeros(4)
        flat.grad = torch.ones(4)
        writer = torch.optim.Adam([flat], lr=1e-3, fused=written)
        writer.step()
        state = copy.deepcopy(writer.state_dict())
        resumed = torch.zeros(4)
        resumed.grad = torch.ones(4)
        reader = torch.optim.Adam([resumed], lr=1e-3, fused=loading)
        module.load_optimizer(reader, state)
        assert reader.param_groups[0]["fused"] is loading
        reader.step()
        assert reader.state[resumed]["step"].item() == 2
    rmsprop = torch.optim.RMSprop([flat])  # no implementation to keep (IMPALA's and SEED's --optimizer rmsprop)
    module.load_optimizer(rmsprop, copy.deepcopy(rmsprop.state_dict()))


# ------------------------------------------------------------------------------------------ Ape-X learner
def replay_learner_step(module, args, q_net, target_net, replay, *extra) -> None:
    """main's learner step of an Ape-X-family file (sample, loss, backward, clip, torch's Adam on the flat parameter
    vector, priority update, target copy), all on the device."""
    flat = module.flatten_parameters(q_net)
    optimizer = torch.optim.Adam([flat], lr=1e-3, eps=1e-5)
    progress = module.new_progress(module.run_config(args))
    stats = module.new_stats(progress)
    module.learner_step(args, q_net, target_net, optimizer, replay, np.random.default_rng(0), progress, stats, *extra)
    assert flat.grad.device == optimizer.state[flat]["exp_avg_sq"].device == stats["losses"].device == META
    assert progress["update"] == 1 and all(p.device == META for p in target_net.parameters())


@pytest.mark.parametrize("obs_shape", [(4,), (4, 84, 84)])
def test_apex_learner_on_device(on_device, obs_shape):
    """The replay stays on the CPU; each sampled batch (in one copy) and its importance weights must arrive on the
    device, and the loss, optimizer and priority update must run from there."""
    dtype = torch.float32 if len(obs_shape) == 1 else torch.uint8
    replay = apex.PrioritizedReplay(
        64,
        {
            "obs": torch.zeros(obs_shape, dtype=dtype),
            "next_obs": torch.zeros(obs_shape, dtype=dtype),
            "actions": torch.zeros((), dtype=torch.long),
            "returns": torch.zeros(()),
            "discounts": torch.zeros(()),
        },
        0.6,
        1e-6,
        META,
    )
    replay.add(
        {
            "obs": torch.zeros((40,) + obs_shape, dtype=dtype),
            "next_obs": torch.zeros((40,) + obs_shape, dtype=dtype),
            "actions": torch.zeros(40, dtype=torch.long),
            "returns": torch.zeros(40),
            "discounts": torch.zeros(40),
        },
        torch.rand(40),
    )
    q_net, target_net = apex.QNetwork(obs_shape, 6).to(META), apex.QNetwork(obs_shape, 6).to(META)
    with Transfers() as transfers:
        idx, batch, weights = replay.sample(8, 0.5, np.random.default_rng(0))
    assert weights.device == META and all(v.device == META for v in batch.values())
    assert transfers.count == 2  # the batch in one copy; the importance weights
    args = apex.RunArgs(batch_size=8, target_network_frequency=1)
    replay_learner_step(apex, args, q_net, target_net, replay)
    if len(obs_shape) == 1:
        assert len(apex.evaluate(q_net, "CartPole-v1", 2, 0, META)) == 2


# ------------------------------------------------------------------------------------------ R2D2 learner
@pytest.mark.parametrize("obs_shape", [(2,), (4, 84, 84)])
def test_r2d2_learner_on_device(on_device, obs_shape):
    """The sequence replay stays on the CPU; each sampled batch (with its stored LSTM states) must arrive on the
    device, and the burn-in, unroll, loss, optimizer and priority update must run from there."""
    args = r2d2.RunArgs(
        num_envs=2,
        burn_in=2,
        sequence_length=4,
        sequence_overlap=2,
        mask_velocity=len(obs_shape) == 1,
        env_id="CartPole-v1" if len(obs_shape) == 1 else "Pong-v5",
        batch_size=3,
        target_network_frequency=1,
    )
    buffers = r2d2.block_buffers(args, r2d2.envpool.make_spec(args.env_id), 1, shared=False)
    fields = {k: buffers[k][0, 0] for k in r2d2.SEQUENCE_KEYS}
    replay = r2d2.PrioritizedReplay(16, fields, 0.9, 1e-6, META)
    replay.add({k: buffers[k][0] for k in r2d2.SEQUENCE_KEYS}, torch.rand(4))
    q_net = r2d2.QNetwork(obs_shape, 6, hidden=args.hidden_size).to(META)
    target_net = r2d2.QNetwork(obs_shape, 6, hidden=args.hidden_size).to(META)
    with Transfers() as transfers:
        idx, batch, weights = replay.sample(3, 0.0, np.random.default_rng(0))
    assert weights.device == META and all(v.device == META for v in batch.values())
    assert transfers.count == 2  # the batch in one copy; the importance weights
    rescaling = r2d2.rescaling_eps(args, r2d2.envpool.make_spec(args.env_id))
    replay_learner_step(r2d2, args, q_net, target_net, replay, rescaling)
    if len(obs_shape) == 1:
        assert len(r2d2.evaluate(q_net, "CartPole-v1", 2, 0, META, mask_velocity=True)) == 2
