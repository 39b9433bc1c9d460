"""The PPO loop: rollout -> sandbox rewards -> old log-probs and values -> GAE -> K epochs of
minibatch updates of actor and critic. Single process on CPU or one GPU; SPMD over ranks under
the DeepSpeed launcher (each rank rolls out its share of the tasks; token counts and advantage
statistics are all-reduced, so the update is that of one global batch).

Each rank evaluates its own episodes' solutions in its own ``SandboxPool`` (one per step, closed
with the step's rollouts): on cuda on the GPU its trainer uses (:func:`rank_gpus`), on the cpu
backend in its own process. Whatever is timed holds the device's gate, which is host-wide
(``cuda_agent.sandbox.gate``): ranks that share a device, or the host on the cpu backend, never
time at once.

Rollout engines (``rollout.engine``): ``hf`` generates in process with the actor's own weights
(under ZeRO-3 a full copy refreshed after every update); ``server`` asks an inference server
(:class:`cuda_agent.agent.server_policy.ServerPolicy`), which rank 0 makes load the actor from
``rollout.server_weights_dir`` (SGLang's ``/update_weights_from_disk``) before the first rollout
and after every update, every rank waiting until it has (:func:`_push_server_weights`).

Checkpoints (``OUT/checkpoint-<step>/``): the actor (HF directory, loadable by every package),
the critic, optimizer states, RNG states and the data position; ``--resume`` continues at the
next step with the same task order.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cuda_agent.records import RecordWriter, Task, Trajectory
from cuda_agent.records.cli_helpers import log
from cuda_agent.records.jsonl import load_records
from cuda_agent.training.trainer import all_reduce_sum, barrier, publish_checkpoint

from .config import PPOConfig
from .losses import PolicyLoss, ValueLoss, explained_variance, kl_estimate, whiten_with
from .samples import Sample, batch_logprobs, batch_values, build_samples, micro_batches

STATE_FILE = "ppo_state.json"


class PPOError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- distributed
def _allmax(value: int, dist: Any, device: Any) -> int:
    if dist.world == 1:
        return value
    import torch.distributed as tdist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t.item())


def _gather(obj: Any, dist: Any) -> list[Any]:
    """``obj`` of every rank, in rank order."""
    if dist.world == 1:
        return [obj]
    import torch.distributed as tdist

    out: list[Any] = [None] * dist.world
    tdist.all_gather_object(out, obj)
    return out


def _lockstep(groups: list[list[Any]], dist: Any, device: Any) -> list[list[Any] | None]:
    """``groups`` padded with ``None`` to the largest count of any rank: under ZeRO every forward
    (stage 3) and backward (stages 2, 3) is collective, so all ranks must run equally many."""
    n = _allmax(len(groups), dist, device)
    return list(groups) + [None] * (n - len(groups))


# ----------------------------------------------------------------------------- data order
def task_order(n: int, seed: int, start: int, count: int) -> list[int]:
    """Task indices ``start .. start+count`` of an endless stream of seeded permutations."""
    out = []
    for pos in range(start, start + count):
        epoch, k = divmod(pos, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(perm[k])
    return out


# ----------------------------------------------------------------------------- models
def _train_config(cfg: PPOConfig, lr: float, warmup_steps: int = 0) -> Any:
    """The options of one :class:`cuda_agent.training.trainer.Backend` (actor or critic): the
    LR constant after ``warmup_steps`` optimizer steps of linear warm-up, AdamW(0.9, 0.95), no
    weight decay, the PPO gradient clip."""
    from cuda_agent.training.trainer import TrainConfig

    return TrainConfig(
        out=Path(cfg.train.out),
        lr=lr,
        warmup_steps=warmup_steps,
        min_lr_ratio=1.0,
        weight_decay=0.0,
        adam_betas=(0.9, 0.95),
        max_grad_norm=cfg.ppo.max_grad_norm,
        precision=cfg.train.precision,
        grad_ckpt=cfg.train.grad_ckpt,
        deepspeed=Path(cfg.train.deepspeed) if cfg.train.deepspeed else None,
        seed=cfg.train.seed,
        device=cfg.train.device,
        tensorboard=False,
    )


def rank_gpus(backend: str, local_rank: int) -> list[str] | None:
    """The GPU the sandbox of the rank with ``local_rank`` evaluates on, as the sandbox names GPUs
    (``pool.visible_gpus``: an entry of ``$CUDA_VISIBLE_DEVICES`` when it is set, else the NVML
    index): the ``local_rank``-th visible GPU, the one the rank trains on (``cuda:<local_rank>``),
    wrapping around where there are fewer GPUs than ranks; ``[str(local_rank)]`` where none is
    listed. None on the cpu backend (the rank's own pool, in its own process)."""
    if backend != "cuda":
        return None
    from cuda_agent.sandbox.pool import visible_gpus

    gpus = visible_gpus()
    return [gpus[local_rank % len(gpus)]] if gpus else [str(local_rank)]


def sandbox_config(cfg: PPOConfig, backend: str) -> Any:
    """The ``SandboxConfig`` every evaluation of the run uses (``sandbox.*`` on ``backend``)."""
    from cuda_agent.sandbox.config import SandboxConfig

    return SandboxConfig(
        backend=backend,
        guard_policy=cfg.sandbox.guard_policy,
        timing=cfg.sandbox.timing,
        compile_baseline=cfg.sandbox.compile_baseline,
    )


@contextlib.contextmanager
def evaluation_fleet(cfg: PPOConfig, backend: str, wanted: bool = True) -> Iterator[Any]:
    """The run's Ray pool when ``sandbox.ray_address`` is set (and ``wanted``), else None; closed
    (its workers stopped, a cluster it started ended) when the run ends, however it ends."""
    if not (cfg.sandbox.ray_address and wanted):
        yield None
        return
    from cuda_agent.sandbox.fleet import RayPool

    try:
        pool = RayPool(
            sandbox_config(cfg, backend),
            address=cfg.sandbox.ray_address,
            workers=cfg.sandbox.ray_workers,
        )
    except (ImportError, RuntimeError, ConnectionError, ValueError) as e:
        raise PPOError(f"sandbox.ray_address = {cfg.sandbox.ray_address!r}: {e}") from e
    with pool:
        yield pool


def _where(backend: str, gpus: list[str] | None, fleet: Any = None, address: Any = None) -> str:
    if fleet is not None:
        return f"the Ray cluster {address} ({len(fleet.workers_info())} workers, {backend})"

    from cuda_agent.sandbox.gate import gate_dir

    d = gate_dir()
    gate = f"host-wide gate in {d}" if d is not None else "host-wide gate off"
    return f"GPU {gpus[0]} ({gate})" if gpus else f"the {backend} backend ({gate})"


def _initial_actor(cfg: PPOConfig, out: Path, dist: Any) -> str:
    from cuda_agent.agent.models import make_tiny_model

    if not cfg.model.tiny:
        return cfg.model.actor
    tiny = out / "tiny-actor"
    if dist.main and not (tiny / "config.json").exists():
        make_tiny_model(tiny, seed=cfg.train.seed)
    barrier(dist)
    return str(tiny)


def _is_zero3(backend: Any) -> bool:
    return backend.engine is not None and backend.engine.zero_optimization_stage() == 3


def _sync_rollout_weights(rollout: Any, backend: Any) -> None:
    """Copy the (partitioned, ZeRO-3) actor weights into the rollout model on every rank."""
    import deepspeed

    params = list(backend.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None), torch.no_grad():
        src = dict(backend.module.named_parameters())
        for name, p in rollout.named_parameters():
            p.copy_(src[name].data.to(p.dtype))


def _server_weights_dir(cfg: PPOConfig, out: Path) -> Path:
    return Path(cfg.rollout.server_weights_dir or out / "server-weights")


def _push_server_weights(
    cfg: PPOConfig, backend: Any, tok: Any, out: Path, updates: int, dist: Any
) -> Path:
    """Save the actor to ``<server_weights_dir>/step-<updates>`` and make the rollout server
    load it (rank 0; the weights' gather is collective under ZeRO-3). Returns once the server
    serves it, on every rank; a failed save or reload raises :class:`PPOError` on every rank.
    Older ``step-*`` directories are removed once the server has the new one."""
    from cuda_agent.agent.server_policy import ServerClient, ServerError

    wdir = _server_weights_dir(cfg, out)
    dest = wdir / f"step-{updates}"
    sd = backend.full_state_dict()
    err = None
    if dist.main:
        try:
            tmp = wdir / f".tmp-step-{updates}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            backend.module.save_pretrained(tmp, state_dict=sd)
            tok.save_pretrained(tmp)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.replace(dest)
            client = ServerClient(
                cfg.rollout.server_url or "",
                timeout=cfg.rollout.server_timeout,
                retries=cfg.rollout.server_retries,
            )
            msg = client.update_weights_from_disk(dest)
            for old in wdir.glob("step-*"):
                if old != dest:
                    shutil.rmtree(old, ignore_errors=True)
            log(f"ppo: rollout server {client.base_url} serves {dest} ({msg})")
        except (OSError, ServerError) as e:
            err = f"rollout server weights {dest}: {e}"
    errors = [e for e in _gather(err, dist) if e]
    if errors:
        raise PPOError(errors[0])
    return dest


# ----------------------------------------------------------------------------- one step
def critic_free_baselines(trajs: list[Any], kind: str, step_mean: float) -> list[float]:
    """Each episode's baseline without a critic: ``"step"``, the step's mean reward over all
    ranks (``step_mean``); ``"task"``, the mean reward of the episodes of the same task in this
    step (its samples are on one rank: ``_rollout`` gives each rank whole tasks)."""
    if kind == "step":
        return [step_mean] * len(trajs)
    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(t.task.id, []).append(float(t.reward))
    return [sum(groups[t.task.id]) / len(groups[t.task.id]) for t in trajs]


def _rollout(
    cfg: PPOConfig,
    actor: Any,
    tok: Any,
    tasks: list[Task],
    step: int,
    out: Path,
    dist: Any,
    reward_fn: Any = None,
    backend: str = "auto",
    gpus: list[str] | None = None,
    fleet: Any = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """This rank's episodes of ``step``, generated by ``actor`` in process or by the rollout
    server (``rollout.engine``), evaluated (unless ``reward_fn``) by ``fleet`` (the run's Ray
    pool) or else by a pool of this process on ``gpus`` (cuda), and rewarded."""
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
    from cuda_agent.agent.policy import HFPolicy

    idx = task_order(
        len(tasks), cfg.data.seed, step * cfg.data.tasks_per_step, cfg.data.tasks_per_step
    )
    mine = idx[dist.rank :: dist.world]
    jobs = [(tasks[i], s) for i in mine for s in range(cfg.data.samples_per_task)]
    env = SandboxEnv(sandbox_config(cfg, backend), gpus=gpus, pool=fleet)
    sampling = {
        "temperature": cfg.rollout.temperature,
        "top_p": cfg.rollout.top_p,
        "name": "ppo-actor",
        "seed": cfg.train.seed * 100_003 + step * 101 + dist.rank,
    }
    if cfg.rollout.engine == "server":
        from cuda_agent.agent.server_policy import ServerPolicy

        policy: Any = ServerPolicy(
            cfg.rollout.server_url or "",
            tok,
            cfg.rollout.server_model,
            timeout=cfg.rollout.server_timeout,
            retries=cfg.rollout.server_retries,
            **sampling,
        )
    else:
        policy = HFPolicy(actor, tok, **sampling)
    ecfg = EpisodeConfig(
        mode=cfg.rollout.mode,
        max_turns=cfg.rollout.max_turns,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_context_tokens=cfg.rollout.max_context,
        evaluate=reward_fn is None,
        include_skill=cfg.rollout.include_skill,
        tools=tuple(cfg.rollout.tools) if cfg.rollout.tools is not None else None,
    )
    ws = out / "workspaces" / f"step-{step + 1}-rank{dist.rank}"
    shutil.rmtree(ws, ignore_errors=True)
    actor.eval()
    t0 = time.monotonic()
    with env:  # the step's own pool is closed with its rollouts (a fleet is not: its owner's)
        trajs = EpisodeRunner(policy, env, ecfg, ws).run(jobs)
    wall = time.monotonic() - t0
    actor.train()
    from cuda_agent.reward import RewardConfig, apply

    rc = RewardConfig(
        scheme=cfg.reward.scheme, threshold=cfg.reward.threshold, use_ci=cfg.reward.use_ci
    )
    trajs = [apply(t, rc) for t in trajs]
    if reward_fn is not None:  # a programmatic reward (tests, ablations) instead of the sandbox's
        for t in trajs:
            t.reward = float(reward_fn(t))
            t.reward_reason = "reward_fn"
    gen_s = sum(t.meta["seconds"].get("generate_s", 0.0) for t in trajs)
    eval_s = sum(t.meta["seconds"].get("eval_s", 0.0) for t in trajs)
    tool_s = sum(v for t in trajs for k, v in t.meta["seconds"].items() if k.startswith("tool_"))
    return trajs, {
        "rollout_s": wall,
        "generate_s": gen_s,
        "sandbox_eval_s": eval_s,
        "tool_s": tool_s,
    }


def _episode_row(t: Trajectory) -> tuple[float, ...]:
    """The per-episode numbers the step metrics are made of (gathered from every rank)."""
    ok = t.eval_result is not None and str(t.eval_result.status) == "ok"
    sp = t.eval_result.speedup_vs_eager if t.eval_result is not None else None
    return (
        float(t.reward),
        float(ok),
        float(t.counters.get("turns", 0)),
        float(sum(t.loss_mask)),
        float(len(t.token_ids)),
        float(t.counters.get("schema_violations", 0)),
        float(sp) if sp else 0.0,
    )


def _episode_stats(rows: list[tuple[float, ...]]) -> dict[str, float]:
    """Reward, pass rate, lengths and speed-ups over the episodes of one step (all ranks)."""
    n = max(len(rows), 1)
    rewards = [r[0] for r in rows]
    m: dict[str, float] = {
        "reward_mean": sum(rewards) / n,
        "episodes": float(len(rows)),
        "pass_rate": sum(r[1] for r in rows) / n,
        "turns_mean": sum(r[2] for r in rows) / n,
        "response_tokens_mean": sum(r[3] for r in rows) / n,
        "episode_tokens_mean": sum(r[4] for r in rows) / n,
        "schema_violations": sum(r[5] for r in rows),
    }
    for v in (-1.0, 1.0, 2.0, 3.0):
        m[f"reward_frac_{v:+g}"] = sum(1 for x in rewards if x == v) / n
    sp = [r[6] for r in rows if r[6] > 0]
    if sp:
        m["speedup_vs_eager_geomean"] = math.exp(sum(math.log(x) for x in sp) / len(sp))
    return m


def _check_resume(state: dict[str, Any], dist: Any, backend_name: str, ckpt: Path) -> None:
    was = (state.get("world_size", 1), state.get("backend", "torch"))
    if was != (dist.world, backend_name):
        raise PPOError(
            f"cannot resume from {ckpt}: it was written by {was[0]} rank(s) on the {was[1]} "
            f"backend, this run has {dist.world} on {backend_name}; use the same launch"
        )


def train(
    cfg: PPOConfig,
    resume: bool = False,
    reward_fn: Any = None,
    rollout_fn: Callable[[int], list[Trajectory]] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cfg.ppo.steps`` PPO steps; returns the metrics of the steps run here.

    ``reward_fn(trajectory) -> float`` replaces the sandbox's evaluation and reward (for tests of
    the learning dynamics and for ablations); by default every episode is evaluated and rewarded.
    ``rollout_fn(step) -> trajectories`` (``step`` from 0) replaces the whole rollout of a step by
    this rank's share of a recorded, rewarded batch (replays: the same update in other launches).
    Each rank's evaluations run on its own device (module docstring, :func:`rank_gpus`), or with
    ``sandbox.ray_address`` on a Ray cluster, through one fleet (:func:`evaluation_fleet`) that
    the run opens first and closes when it ends.

    Guarantees: the policy loss of an update is the token mean over the global number of policy
    tokens in its minibatch (over all ranks); advantages are whitened over all ranks; resuming
    from a checkpoint continues at the next step with the same task order, weights, optimizer
    and RNG states. Runs in one process (CPU or GPU) or SPMD under ``torchrun`` / the DeepSpeed
    launcher (``train.deepspeed``: ZeRO-2/3 for actor and critic). With ``rollout.engine =
    "server"`` every rollout is generated by the server from the current actor's weights: it is
    made to load them (saved under ``rollout.server_weights_dir``) before the first rollout and
    after every update; metric ``server_reload_s`` is the time that took.
    """
    from cuda_agent.sandbox.config import resolve_backend

    backend = resolve_backend(cfg.sandbox.backend)
    evaluates = rollout_fn is None and reward_fn is None
    with evaluation_fleet(cfg, backend, wanted=evaluates) as fleet:
        return _train(cfg, resume, reward_fn, rollout_fn, backend, fleet)


def _train(
    cfg: PPOConfig,
    resume: bool,
    reward_fn: Any,
    rollout_fn: Callable[[int], list[Trajectory]] | None,
    sb_backend: str,
    fleet: Any,
) -> list[dict[str, Any]]:
    from cuda_agent.agent.models import load_causal_lm, load_tokenizer
    from cuda_agent.critic.gae import gae
    from cuda_agent.critic.model import ValueModel
    from cuda_agent.training.metrics import MetricsLogger
    from cuda_agent.training.trainer import Backend, latest_checkpoint, setup_distributed

    out = Path(cfg.train.out)
    out.mkdir(parents=True, exist_ok=True)
    actor_tc = _train_config(cfg, cfg.ppo.actor_lr, cfg.ppo.actor_lr_warmup_steps)
    dist, device, bf16 = setup_distributed(actor_tc)
    backend_name = "deepspeed" if dist.deepspeed else "torch"
    tasks = load_records(cfg.data.tasks, Task)
    if not tasks:
        raise PPOError(f"{cfg.data.tasks}: no tasks")
    sb_gpus = rank_gpus(sb_backend, dist.local_rank)
    if rollout_fn is None:  # every rank says where it evaluates (its pid: results name it)
        where = _where(sb_backend, sb_gpus, fleet, cfg.sandbox.ray_address)
        log(f"ppo: rank {dist.rank} (pid {os.getpid()}) evaluates on {where}")

    ckpt = latest_checkpoint(out) if resume else None
    if ckpt is not None and not (ckpt / STATE_FILE).exists():
        ckpt = None
    start = 0
    if ckpt is not None:
        state = json.loads((ckpt / STATE_FILE).read_text())
        _check_resume(state, dist, backend_name, ckpt)
        start = int(state["step"])
        if dist.main:
            log(f"ppo: resuming from {ckpt} at step {start + 1}/{cfg.ppo.steps}")
    torch.manual_seed(cfg.train.seed)
    init_actor = _initial_actor(cfg, out, dist)
    # the torch backend resumes from the checkpoint's HF weights; DeepSpeed from its own state
    from_ckpt = ckpt is not None and not dist.deepspeed
    tok = load_tokenizer(str(ckpt / "actor") if from_ckpt else init_actor)
    steps_total = max(1, cfg.ppo.steps * cfg.ppo.epochs * cfg.ppo.minibatches)
    actor_b = Backend(
        load_causal_lm(
            str(ckpt / "actor") if from_ckpt else init_actor, dtype=torch.float32, use_cache=False
        ),
        actor_tc,
        dist,
        device,
        bf16,
        steps_total,
        variable_accumulation=True,
    )
    critic_b = None
    if cfg.ppo.use_critic:
        csrc = str(ckpt / "critic") if from_ckpt else (cfg.model.critic or init_actor)
        critic_b = Backend(
            ValueModel.from_pretrained(csrc, seed=cfg.train.seed),
            _train_config(cfg, cfg.ppo.critic_lr),
            dist,
            device,
            bf16,
            steps_total,
            variable_accumulation=True,
        )
    if ckpt is not None:
        actor_b.load_state(ckpt / "actor-optim")
        if critic_b is not None:
            critic_b.load_state(ckpt / "critic-optim")
        rng = torch.load(ckpt / f"rng-rank{dist.rank}.pt", weights_only=False)
        torch.set_rng_state(rng["cpu"])
        random.setstate(rng["py"])
        if device.type == "cuda" and rng.get("cuda") is not None:
            torch.cuda.set_rng_state(rng["cuda"], device)
    actor = actor_b.module
    critic = critic_b.module if critic_b is not None else None
    model_dtype = torch.bfloat16 if (bf16 and dist.deepspeed) else torch.float32
    ref = None
    if cfg.ppo.kl_coef > 0 or cfg.model.ref is not None:
        ref = load_causal_lm(
            cfg.model.ref or init_actor, device, dtype=model_dtype, use_cache=False
        ).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    # ZeRO-3 partitions the actor's weights: generation (an unknown number of forward passes per
    # rank) runs on a full copy, refreshed from the trainer after every update
    rollout_model = actor
    server = cfg.rollout.engine == "server"
    if _is_zero3(actor_b) and not server:
        rollout_model = load_causal_lm(
            init_actor, device, dtype=model_dtype, use_cache=False
        ).eval()
        for p in rollout_model.parameters():
            p.requires_grad_(False)
    if dist.main:
        log(
            f"ppo: {len(tasks)} tasks, steps {start + 1}..{cfg.ppo.steps}, device {device}, "
            f"{actor_b.name} backend{' (ZeRO-3, rollout copy)' if rollout_model is not actor else ''}"
            f", {'bf16' if bf16 else 'fp32'}, world {dist.world}, "
            f"critic {'on' if critic is not None else 'off'}, rollout engine "
            f"{cfg.rollout.engine}{f' ({cfg.rollout.server_url})' if server else ''}"
        )

    policy_loss = PolicyLoss(cfg.ppo.eps_low, cfg.ppo.eps_high, cfg.ppo.dual_clip, cfg.ppo.tis_cap)
    value_loss = ValueLoss(cfg.ppo.value_clip)
    mlog = MetricsLogger(
        out / "metrics.jsonl",
        tb_dir=out / "tb" if cfg.train.tensorboard else None,
        resume_step=start,
        enabled=dist.main,
    )
    history = []
    dummy_seq, dummy_pos = [[0, 0]], [[1]]  # a padding micro-batch (see _lockstep)
    served: int | None = None  # the step whose weights the rollout server has (engine server)

    for step in range(start, cfg.ppo.steps):
        t_step = time.monotonic()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        if rollout_model is not actor:
            _sync_rollout_weights(rollout_model, actor_b)
        reload_s = 0.0
        if server and rollout_fn is None and served != step:
            t_reload = time.monotonic()
            _push_server_weights(cfg, actor_b, tok, out, step, dist)
            served, reload_s = step, time.monotonic() - t_reload
        if rollout_fn is not None:
            trajs = list(rollout_fn(step))
            times = dict.fromkeys(("rollout_s", "generate_s", "sandbox_eval_s", "tool_s"), 0.0)
        else:
            trajs, times = _rollout(
                cfg,
                rollout_model,
                tok,
                tasks,
                step,
                out,
                dist,
                reward_fn,
                sb_backend,
                sb_gpus,
                fleet,
            )
        if server:
            times["server_reload_s"] = reload_s
        for t in trajs:
            t.meta["ppo_step"] = step + 1
            t.meta["rank"] = dist.rank
        path = (
            out / "trajectories.jsonl"
            if dist.world == 1
            else out / f"trajectories.rank{dist.rank}.jsonl"
        )
        with RecordWriter(path) as w:
            for t in trajs:
                w.write(t)
        # an episode the harness failed (its evaluation by the sandbox, or a model request, tool
        # or workspace that raised) carries no learning signal
        infra = [t for t in trajs if t.infra_failed]
        errored = [t for t in trajs if t.harness_failed and not t.infra_failed]
        trajs = [t for t in trajs if not t.harness_failed]
        rows = [r for part in _gather([_episode_row(t) for t in trajs], dist) for r in part]
        metrics = _episode_stats(rows)
        metrics["infra_excluded"] = float(sum(_gather(len(infra), dist)))
        metrics["error_excluded"] = float(sum(_gather(len(errored), dist)))
        all_times = _gather(times, dist)
        for k in times:
            metrics[k] = sum(x[k] for x in all_times) / len(all_times)  # mean over ranks
        metrics["rollout_s_max"] = max(x["rollout_s"] for x in all_times)
        t_train = time.monotonic()
        samples = build_samples(trajs, cfg.ppo.per_turn_samples)
        # log-probs of the distribution the rollout sampled (logits / temperature), as verl and
        # OpenRLHF do: the ratio, TIS weight, KL and entropy all refer to that policy
        temp = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0

        # --- old log-probs, values, reference log-probs (no grad), scattered to trajectories
        T = [len(t.token_ids) for t in trajs]
        old_lp = [torch.zeros(n) for n in T]
        vals = [torch.zeros(n) for n in T]
        ref_lp = [torch.zeros(n) for n in T]
        lp_diff = [0.0, 0]  # |trainer's - rollout's log-prob| summed over policy tokens, count
        actor.eval()
        if critic is not None:
            critic.eval()
        with torch.no_grad(), actor_b.autocast():
            for group in _lockstep(
                micro_batches(samples, cfg.ppo.micro_batch_tokens), dist, device
            ):
                if group is None:  # keep ZeRO-3's parameter gathers in step with other ranks
                    batch_logprobs(actor, dummy_seq, dummy_pos, device)
                    if critic is not None:
                        batch_values(critic, dummy_seq, dummy_pos, device)
                    continue
                seqs = [trajs[s.traj].token_ids[: s.end] for s in group]
                poss = [s.positions for s in group]
                lps, _ = batch_logprobs(actor, seqs, poss, device, temperature=temp)
                vs = batch_values(critic, seqs, poss, device) if critic is not None else None
                rls = (
                    batch_logprobs(ref, seqs, poss, device, temperature=temp)[0]
                    if ref is not None
                    else None
                )
                for j, s in enumerate(group):
                    old_lp[s.traj][s.positions] = lps[j].float().cpu()
                    rollout_lp = torch.tensor([trajs[s.traj].logprobs[p] for p in s.positions])
                    lp_diff[0] += float((old_lp[s.traj][s.positions] - rollout_lp).abs().sum())
                    lp_diff[1] += len(s.positions)
                    if vs is not None:
                        vals[s.traj][s.positions] = vs[j].float().cpu()
                    if rls is not None:
                        ref_lp[s.traj][s.positions] = rls[j].float().cpu()
        actor.train()
        if critic is not None:
            critic.train()
        d_sum, d_n = all_reduce_sum([lp_diff[0], float(lp_diff[1])], dist, device)
        metrics["rollout_logp_diff"] = d_sum / max(d_n, 1.0)

        # --- advantages and returns over whole episodes
        adv, ret = [], []
        if critic is not None:
            for k, t in enumerate(trajs):
                m = torch.tensor([t.loss_mask], dtype=torch.float32)
                r = torch.zeros_like(m)
                pos = max((i for i, x in enumerate(t.loss_mask) if x), default=None)
                if pos is not None:
                    r[0, pos] = float(t.reward)
                a, rt = gae(vals[k][None], r, m, cfg.ppo.gamma, cfg.ppo.lam)
                adv.append(a[0])
                ret.append(rt[0])
        else:  # critic-free: reward minus a baseline
            base = critic_free_baselines(
                trajs, cfg.ppo.critic_free_baseline, metrics["reward_mean"]
            )
            for t, b in zip(trajs, base, strict=True):
                m = torch.tensor(t.loss_mask, dtype=torch.float32)
                adv.append((t.reward - b) * m)
                ret.append(t.reward * m)
        masks = [torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs]
        flat_a = (
            torch.cat([a[m] for a, m in zip(adv, masks, strict=True)]) if trajs else torch.zeros(0)
        )
        n_tok, s1, s2 = all_reduce_sum(
            [float(flat_a.numel()), float(flat_a.sum()), float((flat_a**2).sum())], dist, device
        )
        if cfg.ppo.whiten_advantages and n_tok > 1:
            mean = s1 / n_tok
            var = max(s2 / n_tok - mean**2, 0.0)
            # per-task baselines are the centring: scale only, so that a task whose samples all
            # scored alike keeps advantage 0
            if critic is None and cfg.ppo.critic_free_baseline == "task":
                adv = [a * torch.rsqrt(torch.tensor(var) + 1e-8) for a in adv]
            else:
                adv = [
                    whiten_with(a, torch.tensor(mean), torch.tensor(var)) * m.float()
                    for a, m in zip(adv, masks, strict=True)
                ]
        if critic is not None:
            vm = torch.cat([vals[k][m] for k, m in enumerate(masks)]) if trajs else torch.zeros(0)
            rm = torch.cat([ret[k][m] for k, m in enumerate(masks)]) if trajs else torch.zeros(0)
            vm_all = torch.cat([torch.tensor(x) for x in _gather(vm.tolist(), dist)])
            rm_all = torch.cat([torch.tensor(x) for x in _gather(rm.tolist(), dist)])
            metrics["explained_variance"] = explained_variance(
                vm_all, rm_all, torch.ones_like(vm_all)
            )
            metrics["value_mean"] = float(vm_all.mean()) if vm_all.numel() else 0.0

        # --- K epochs of minibatch updates
        agg = _Means()
        train_actor = step >= cfg.ppo.critic_warmup_steps
        rng = random.Random(cfg.train.seed * 7 + step + 1_000_003 * dist.rank)
        nmb = max(1, cfg.ppo.minibatches)  # the same on every rank (equal optimizer steps)
        for _epoch in range(cfg.ppo.epochs):
            order = list(range(len(samples)))
            rng.shuffle(order)
            for b in range(nmb):
                mb: list[Sample] = [samples[i] for i in order[b::nmb]]
                (gtok,) = all_reduce_sum([float(sum(len(s.positions) for s in mb))], dist, device)
                if gtok == 0:  # no policy token on any rank: nothing to update
                    continue
                groups = _lockstep(micro_batches(mb, cfg.ppo.micro_batch_tokens), dist, device)
                for gi, group in enumerate(groups):
                    last = gi == len(groups) - 1
                    if group is None:  # zero-loss micro-batch: ZeRO's collectives stay in step
                        with actor_b.autocast():
                            if train_actor:
                                lps, _ = batch_logprobs(actor, dummy_seq, dummy_pos, device)
                                actor_b.backward(lps[0].sum() * 0.0, last)
                            if critic_b is not None:
                                v = batch_values(critic, dummy_seq, dummy_pos, device)
                                critic_b.backward(v[0].sum() * 0.0, last)
                        continue
                    seqs = [trajs[s.traj].token_ids[: s.end] for s in group]
                    poss = [s.positions for s in group]
                    n_here = sum(len(p) for p in poss)

                    def cat(arrs: list[torch.Tensor], group: list[Sample] = group) -> torch.Tensor:
                        return torch.cat(
                            [a[s.positions] for a, s in zip(arrs, group, strict=True)]
                        ).to(device)[None]

                    adv_g = cat([adv[s.traj] for s in group])
                    old_g = cat([old_lp[s.traj] for s in group])
                    mask = torch.ones_like(adv_g)
                    with actor_b.autocast():
                        if train_actor:
                            lps, ents = batch_logprobs(
                                actor, seqs, poss, device, with_entropy=True, temperature=temp
                            )
                            lp = torch.cat(lps)[None]
                            ent_sum = torch.cat(ents).sum()
                            rollout = torch.tensor(
                                [trajs[s.traj].logprobs[p] for s in group for p in s.positions],
                                device=device,
                            )[None]
                            out_pl = policy_loss(
                                lp, old_g, adv_g, mask, rollout_logp=rollout, global_tokens=gtok
                            )
                            loss = out_pl.loss - cfg.ppo.entropy_coef * ent_sum / gtok
                            if ref is not None:
                                kl = kl_estimate(
                                    lp, cat([ref_lp[s.traj] for s in group]), cfg.ppo.kl_estimator
                                )
                                loss = loss + cfg.ppo.kl_coef * kl.sum() / gtok
                                agg.add("kl", float(kl.detach().mean()))
                            actor_b.backward(loss, last)
                            agg.add(
                                "policy_loss", float(out_pl.loss.detach()) * gtok / max(n_here, 1)
                            )
                            agg.add("clipfrac", out_pl.clipfrac)
                            agg.add("approx_kl", out_pl.approx_kl)
                            agg.add("ratio_mean", out_pl.ratio_mean)
                            agg.extreme("ratio_max", out_pl.ratio_max, max)
                            agg.extreme("ratio_min", out_pl.ratio_min, min)
                            agg.add("tis_capped_frac", out_pl.tis_capped_frac)
                            agg.add("entropy", float(ent_sum.detach()) / max(n_here, 1))
                        if critic_b is not None:
                            v = torch.cat(batch_values(critic, seqs, poss, device))[None]
                            vl, vclip = value_loss(
                                v.float(),
                                cat([vals[s.traj] for s in group]),
                                cat([ret[s.traj] for s in group]),
                                mask,
                                global_tokens=gtok,
                            )
                            critic_b.backward(vl, last)
                            agg.add("value_loss", float(vl.detach()) * gtok / max(n_here, 1))
                            agg.add("value_clipfrac", vclip)
                if train_actor:
                    agg.add("actor_grad_norm", actor_b.step())
                if critic_b is not None:
                    agg.add("critic_grad_norm", critic_b.step())
        metrics.update(_Means.merge(_gather(agg, dist)).result())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        metrics["train_s"] = time.monotonic() - t_train
        metrics["actor_lr"] = actor_b.lr  # for the next optimizer step (its warm-up, then flat)
        metrics["step_s"] = time.monotonic() - t_step
        metrics["sandbox_time_share"] = metrics["sandbox_eval_s"] / max(metrics["step_s"], 1e-9)
        metrics["actor_updated"] = float(train_actor)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) / 2**30
            peaks = _gather(peak, dist)
            metrics["peak_mem_gib"] = max(peaks)
            if len(peaks) > 1:  # memory per GPU: one key per rank
                metrics.update({f"peak_mem_gib_rank{i}": p for i, p in enumerate(peaks)})
        mlog.write(step + 1, metrics)
        history.append(metrics)
        if dist.main:
            log(
                f"ppo step {step + 1}/{cfg.ppo.steps}: reward {metrics['reward_mean']:+.3f}, "
                f"pass {metrics['pass_rate']:.2f}, clipfrac {metrics.get('clipfrac', 0):.3f}, "
                f"approx_kl {metrics.get('approx_kl', 0):.4f}, {metrics['step_s']:.1f}s "
                f"(rollout {metrics['rollout_s']:.1f}s, train {metrics['train_s']:.1f}s)"
            )
        if (step + 1) % max(cfg.train.save_every, 1) == 0 or step + 1 == cfg.ppo.steps:
            _save(out, step + 1, actor_b, critic_b, tok, device, cfg, dist)
    mlog.close()
    if dist.main and history:
        _publish_final(out)
    barrier(dist)
    return history


def _publish_final(out: Path) -> None:
    """``OUT/final``: the actor of the newest checkpoint (what the next stage loads), and
    ``OUT/final-critic``: its critic."""
    from cuda_agent.training.trainer import latest_checkpoint, publish_dir

    ck = latest_checkpoint(out)
    if ck is None:
        return
    publish_dir(ck / "actor", out / "final")
    if (ck / "critic").exists():
        publish_dir(ck / "critic", out / "final-critic")


class _Means:
    """Running means (NaN skipped) and extremes of per-sample metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.ext: dict[str, float] = {}

    def add(self, k: str, v: float) -> None:
        if v == v:
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def extreme(self, k: str, v: float, fn: Any) -> None:
        self.ext[k] = fn(self.ext[k], v) if k in self.ext else v

    def result(self) -> dict[str, float]:
        return {**{k: self.sums[k] / self.counts[k] for k in self.sums}, **self.ext}

    @staticmethod
    def merge(parts: list[_Means]) -> _Means:
        """The means and extremes over several ranks' accumulators."""
        out = _Means()
        for p in parts:
            for k, v in p.sums.items():
                out.sums[k] = out.sums.get(k, 0.0) + v
                out.counts[k] = out.counts.get(k, 0) + p.counts[k]
            for k, v in p.ext.items():
                fn = min if k.endswith("_min") else max
                out.extreme(k, v, fn)
        return out


def _save(
    out: Path,
    step: int,
    actor_b: Any,
    critic_b: Any,
    tok: Any,
    device: Any,
    cfg: PPOConfig,
    dist: Any,
) -> Path:
    """``OUT/checkpoint-<step>``: actor and critic (HF directories), their optimizer states, each
    rank's RNG states and ``ppo_state.json`` (collective on several ranks)."""
    final = out / f"checkpoint-{step}"
    tmp = out / f".tmp-checkpoint-{step}"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in ("actor-optim", "critic-optim"):
            (tmp / d).mkdir(parents=True)
    barrier(dist)
    sd_a = actor_b.full_state_dict()
    sd_c = critic_b.full_state_dict() if critic_b is not None else None
    actor_b.save_state(tmp / "actor-optim")
    if critic_b is not None:
        critic_b.save_state(tmp / "critic-optim")
    torch.save(
        {
            "cpu": torch.get_rng_state(),
            "py": random.getstate(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        },
        tmp / f"rng-rank{dist.rank}.pt",
    )
    barrier(dist)
    if dist.main:
        actor_b.module.save_pretrained(tmp / "actor", state_dict=sd_a)
        tok.save_pretrained(tmp / "actor")
        if critic_b is not None:
            critic_b.module.save_pretrained(tmp / "critic", state_dict=sd_c)
        state = {
            "step": step,
            "world_size": dist.world,
            "backend": actor_b.name,
            "config": msgspec_to_builtins(cfg),
        }
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        # the rft trainer's "latest" convention, so its latest_checkpoint() finds ours
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
        publish_checkpoint(out, tmp, step, cfg.train.keep_checkpoints)
        log(f"ppo: saved {final}")
    barrier(dist)
    return final


def msgspec_to_builtins(cfg: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(cfg)
