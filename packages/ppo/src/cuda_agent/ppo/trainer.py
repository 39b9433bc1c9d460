"""The PPO loop: rollout -> sandbox rewards -> old log-probs and values -> GAE -> K epochs of
minibatch updates of actor and critic. Single process on CPU or one GPU; SPMD over ranks under
the DeepSpeed launcher (each rank rolls out its share of the tasks; token counts and advantage
statistics are all-reduced, so the update is that of one global batch).

Checkpoints (``OUT/checkpoint-<step>/``): the actor (HF directory, loadable by every package),
the critic, optimizer states, RNG states and the data position; ``--resume`` continues at the
next step with the same task order.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from cuda_agent.records import RecordWriter, Task, Trajectory
from cuda_agent.records.cli_helpers import log
from cuda_agent.records.jsonl import load_records

from .config import PPOConfig
from .losses import PolicyLoss, ValueLoss, explained_variance, kl_estimate, whiten_with
from .samples import Sample, batch_logprobs, batch_values, build_samples, micro_batches

STATE_FILE = "ppo_state.json"


class PPOError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- distributed
class Dist:
    """Rank, world size and all-reduce (a no-op in one process)."""

    def __init__(self) -> None:
        import os

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.world > 1:
            import torch.distributed as tdist

            if not tdist.is_initialized():
                tdist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, values: list[float], device: Any) -> list[float]:
        if self.world == 1:
            return values
        import torch.distributed as tdist

        t = torch.tensor(values, dtype=torch.float64, device=device)
        tdist.all_reduce(t)
        return t.tolist()


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
def _load_models(cfg: PPOConfig, device: Any, out: Path, ckpt: Path | None):
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model
    from cuda_agent.critic.model import ValueModel
    from cuda_agent.rft.modeling import load_causal_lm

    actor_src = cfg.model.actor
    if cfg.model.tiny:
        tiny = out / "tiny-actor"
        if not (tiny / "config.json").exists():
            make_tiny_model(tiny, seed=cfg.train.seed)
        actor_src = str(tiny)
    init_actor = actor_src
    if ckpt is not None:
        actor_src = str(ckpt / "actor")
    tok = load_tokenizer(actor_src)
    actor = load_causal_lm(actor_src, dtype=torch.float32).to(device)
    critic = None
    if cfg.ppo.use_critic:
        csrc = str(ckpt / "critic") if ckpt is not None else (cfg.model.critic or init_actor)
        critic = ValueModel.from_pretrained(csrc, seed=cfg.train.seed).to(device)
    ref = None
    if cfg.ppo.kl_coef > 0 or cfg.model.ref is not None:
        ref = load_causal_lm(cfg.model.ref or init_actor, dtype=torch.float32).to(device).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    return actor, critic, ref, tok


def _bf16(cfg: PPOConfig, device: Any) -> bool:
    if cfg.train.precision == "auto":
        return device.type == "cuda"
    return cfg.train.precision == "bf16"


# ----------------------------------------------------------------------------- one step
def _rollout(
    cfg: PPOConfig,
    actor: Any,
    tok: Any,
    tasks: list[Task],
    step: int,
    out: Path,
    dist: Dist,
    reward_fn: Any = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
    from cuda_agent.agent.policy import HFPolicy
    from cuda_agent.sandbox.config import SandboxConfig

    idx = task_order(
        len(tasks), cfg.data.seed, step * cfg.data.tasks_per_step, cfg.data.tasks_per_step
    )
    mine = idx[dist.rank :: dist.world]
    jobs = [(tasks[i], s) for i in mine for s in range(cfg.data.samples_per_task)]
    sb = SandboxConfig(
        backend=cfg.sandbox.backend,
        guard_policy=cfg.sandbox.guard_policy,
        timing=cfg.sandbox.timing,
        compile_baseline=cfg.sandbox.compile_baseline,
    )
    env = SandboxEnv(sb)
    policy = HFPolicy(
        actor,
        tok,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        name="ppo-actor",
        seed=cfg.train.seed * 100_003 + step * 101 + dist.rank,
    )
    ecfg = EpisodeConfig(
        mode=cfg.rollout.mode,
        max_turns=cfg.rollout.max_turns,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_context_tokens=cfg.rollout.max_context,
        evaluate=reward_fn is None,
        include_skill=cfg.rollout.include_skill,
    )
    ws = out / "workspaces" / f"step-{step + 1}-rank{dist.rank}"
    shutil.rmtree(ws, ignore_errors=True)
    actor.eval()
    t0 = time.monotonic()
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


def _masked_stats(trajs: list[Trajectory]) -> dict[str, float]:
    rewards = [t.reward for t in trajs]
    m: dict[str, float] = {
        "reward_mean": sum(rewards) / len(rewards),
        "episodes": float(len(trajs)),
        "pass_rate": sum(
            1 for t in trajs if t.eval_result is not None and str(t.eval_result.status) == "ok"
        )
        / len(trajs),
        "turns_mean": sum(t.counters.get("turns", 0) for t in trajs) / len(trajs),
        "response_tokens_mean": sum(sum(t.loss_mask) for t in trajs) / len(trajs),
        "episode_tokens_mean": sum(len(t.token_ids) for t in trajs) / len(trajs),
        "schema_violations": float(sum(t.counters.get("schema_violations", 0) for t in trajs)),
    }
    for r in (-1.0, 1.0, 2.0, 3.0):
        m[f"reward_frac_{r:+g}"] = sum(1 for x in rewards if x == r) / len(rewards)
    sp = [
        t.eval_result.speedup_vs_eager
        for t in trajs
        if t.eval_result and t.eval_result.speedup_vs_eager
    ]
    if sp:
        m["speedup_vs_eager_geomean"] = math.exp(sum(math.log(s) for s in sp) / len(sp))
    return m


def train(cfg: PPOConfig, resume: bool = False, reward_fn: Any = None) -> list[dict[str, Any]]:
    """Run ``cfg.ppo.steps`` PPO steps; returns the metrics of the steps run here.

    ``reward_fn(trajectory) -> float`` replaces the sandbox's evaluation and reward (for tests of
    the learning dynamics and for ablations); by default every episode is evaluated and rewarded.

    Guarantees: the policy loss of an update is the token mean over the global number of policy
    tokens in its minibatch; resuming from a checkpoint continues at the next step with the same
    task order and RNG state.
    """
    from cuda_agent.rft.metrics import MetricsLogger
    from cuda_agent.rft.trainer import latest_checkpoint

    dist = Dist()
    out = Path(cfg.train.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.train.device == "auto":
        device = (
            torch.device("cuda", dist.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    else:
        device = torch.device(cfg.train.device)
    bf16 = _bf16(cfg, device)
    tasks = load_records(cfg.data.tasks, Task)
    if not tasks:
        raise PPOError(f"{cfg.data.tasks}: no tasks")

    ckpt = latest_checkpoint(out) if resume else None
    if ckpt is not None and not (ckpt / STATE_FILE).exists():
        ckpt = None
    start = 0
    if ckpt is not None:
        state = json.loads((ckpt / STATE_FILE).read_text())
        start = int(state["step"])
        log(f"ppo: resuming from {ckpt} at step {start + 1}/{cfg.ppo.steps}")
    torch.manual_seed(cfg.train.seed)
    actor, critic, ref, tok = _load_models(cfg, device, out, ckpt)
    if cfg.train.grad_ckpt:
        from cuda_agent.rft.trainer import enable_checkpointing

        enable_checkpointing(actor)
        if critic is not None:
            enable_checkpointing(critic.backbone)
    opt_a = torch.optim.AdamW(
        actor.parameters(), lr=cfg.ppo.actor_lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    opt_c = (
        torch.optim.AdamW(critic.parameters(), lr=cfg.ppo.critic_lr, betas=(0.9, 0.95))
        if critic is not None
        else None
    )
    if ckpt is not None:
        st = torch.load(ckpt / "optim.pt", map_location=device, weights_only=False)
        opt_a.load_state_dict(st["actor"])
        if opt_c is not None and st.get("critic") is not None:
            opt_c.load_state_dict(st["critic"])
        torch.set_rng_state(st["rng_cpu"])
        random.setstate(st["rng_py"])
        if device.type == "cuda" and st.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(st["rng_cuda"], device)
    policy_loss = PolicyLoss(cfg.ppo.eps_low, cfg.ppo.eps_high, cfg.ppo.dual_clip, cfg.ppo.tis_cap)
    value_loss = ValueLoss(cfg.ppo.value_clip)
    mlog = MetricsLogger(
        out / "metrics.jsonl",
        tb_dir=out / "tb" if cfg.train.tensorboard else None,
        resume_step=start,
        enabled=dist.main,
    )
    history = []
    autocast = bf16

    for step in range(start, cfg.ppo.steps):
        t_step = time.monotonic()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trajs, times = _rollout(cfg, actor, tok, tasks, step, out, dist, reward_fn)
        with RecordWriter(out / "trajectories.jsonl") as w:
            for t in trajs:
                t.meta["ppo_step"] = step + 1
                w.write(t)
        metrics = _masked_stats(trajs)
        metrics.update(times)
        t_train = time.monotonic()
        samples = build_samples(trajs, cfg.ppo.per_turn_samples)

        # --- old log-probs, values, reference log-probs (no grad), scattered to trajectories
        T = [len(t.token_ids) for t in trajs]
        old_lp = [torch.zeros(n) for n in T]
        vals = [torch.zeros(n) for n in T]
        ref_lp = [torch.zeros(n) for n in T]
        actor.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            for group in micro_batches(samples, cfg.ppo.micro_batch_tokens):
                seqs = [trajs[s.traj].token_ids[: s.end] for s in group]
                poss = [s.positions for s in group]
                lps, _ = batch_logprobs(actor, seqs, poss, device)
                vs = batch_values(critic, seqs, poss, device) if critic is not None else None
                rls = batch_logprobs(ref, seqs, poss, device)[0] if ref is not None else None
                for j, s in enumerate(group):
                    old_lp[s.traj][s.positions] = lps[j].float().cpu()
                    if vs is not None:
                        vals[s.traj][s.positions] = vs[j].cpu()
                    if rls is not None:
                        ref_lp[s.traj][s.positions] = rls[j].float().cpu()
        actor.train()

        # --- advantages and returns over whole episodes
        from cuda_agent.critic.gae import gae

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
        else:  # critic-free baseline: reward minus the step's mean reward
            base = sum(t.reward for t in trajs) / len(trajs)
            for t in trajs:
                m = torch.tensor(t.loss_mask, dtype=torch.float32)
                adv.append((t.reward - base) * m)
                ret.append(t.reward * m)
        # global whitening over all policy tokens of all ranks
        flat_a = (
            torch.cat(
                [
                    a[torch.tensor(t.loss_mask, dtype=torch.bool)]
                    for a, t in zip(adv, trajs, strict=True)
                ]
            )
            if trajs
            else torch.zeros(0)
        )
        n_tok, s1, s2 = dist.sum(
            [float(flat_a.numel()), float(flat_a.sum()), float((flat_a**2).sum())], device
        )
        if cfg.ppo.whiten_advantages and n_tok > 1:
            mean = s1 / n_tok
            var = max(s2 / n_tok - mean**2, 0.0)
            adv = [
                whiten_with(a, torch.tensor(mean), torch.tensor(var))
                * torch.tensor(t.loss_mask, dtype=torch.float32)
                for a, t in zip(adv, trajs, strict=True)
            ]
        if critic is not None:
            vm = torch.cat(
                [vals[k][torch.tensor(t.loss_mask, dtype=torch.bool)] for k, t in enumerate(trajs)]
            )
            rm = torch.cat(
                [ret[k][torch.tensor(t.loss_mask, dtype=torch.bool)] for k, t in enumerate(trajs)]
            )
            metrics["explained_variance"] = explained_variance(vm, rm, torch.ones_like(vm))
            metrics["value_mean"] = float(vm.mean()) if vm.numel() else 0.0

        # --- K epochs of minibatch updates
        agg = _Means()

        train_actor = step >= cfg.ppo.critic_warmup_steps
        rng = random.Random(cfg.train.seed * 7 + step)
        for _epoch in range(cfg.ppo.epochs):
            order = list(range(len(samples)))
            rng.shuffle(order)
            nmb = max(1, min(cfg.ppo.minibatches, len(order)))
            for b in range(nmb):
                mb: list[Sample] = [samples[i] for i in order[b::nmb]]
                local_tokens = float(sum(len(s.positions) for s in mb))
                (gtok,) = dist.sum([local_tokens], device)
                gtok = max(gtok, 1.0)
                if train_actor:
                    opt_a.zero_grad(set_to_none=True)
                if opt_c is not None:
                    opt_c.zero_grad(set_to_none=True)
                for group in micro_batches(mb, cfg.ppo.micro_batch_tokens):
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
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                        if train_actor:
                            lps, ents = batch_logprobs(actor, seqs, poss, device, with_entropy=True)
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
                                agg.add("kl", float(kl.mean()))
                            loss.backward()
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
                        if critic is not None:
                            v = torch.cat(batch_values(critic, seqs, poss, device))[None]
                            vl, vclip = value_loss(
                                v,
                                cat([vals[s.traj] for s in group]),
                                cat([ret[s.traj] for s in group]),
                                mask,
                                global_tokens=gtok,
                            )
                            vl.backward()
                            agg.add("value_loss", float(vl.detach()) * gtok / max(n_here, 1))
                            agg.add("value_clipfrac", vclip)
                if dist.world > 1:
                    _all_reduce_grads(actor if train_actor else None, critic)
                if train_actor:
                    gn = torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.ppo.max_grad_norm)
                    agg.add("actor_grad_norm", float(gn))
                    opt_a.step()
                if opt_c is not None:
                    gn = torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.ppo.max_grad_norm)
                    agg.add("critic_grad_norm", float(gn))
                    opt_c.step()
        metrics.update(agg.result())
        metrics["train_s"] = time.monotonic() - t_train
        metrics["step_s"] = time.monotonic() - t_step
        metrics["sandbox_time_share"] = metrics["sandbox_eval_s"] / max(metrics["step_s"], 1e-9)
        metrics["actor_updated"] = float(train_actor)
        if device.type == "cuda":
            metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
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
            _save(out, step + 1, actor, critic, tok, opt_a, opt_c, device, cfg, dist)
    mlog.close()
    if dist.main and history:
        _publish_final(out)
    return history


def _publish_final(out: Path) -> None:
    """``OUT/final``: the actor of the newest checkpoint (what the next stage loads)."""
    from cuda_agent.rft.trainer import latest_checkpoint

    ck = latest_checkpoint(out)
    if ck is None:
        return
    tmp = out / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ck / "actor", tmp)
    shutil.rmtree(out / "final", ignore_errors=True)
    tmp.rename(out / "final")
    if (ck / "critic").exists():
        shutil.rmtree(out / "final-critic", ignore_errors=True)
        shutil.copytree(ck / "critic", out / "final-critic")


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


def _all_reduce_grads(*models: Any) -> None:
    import torch.distributed as tdist

    for m in models:
        if m is None:
            continue
        for p in m.parameters():
            if p.grad is not None:
                tdist.all_reduce(p.grad)


def _save(
    out: Path, step: int, actor, critic, tok, opt_a, opt_c, device, cfg: PPOConfig, dist: Dist
) -> Path:
    final = out / f"checkpoint-{step}"
    if not dist.main:
        return final
    tmp = out / f".tmp-checkpoint-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    actor.save_pretrained(tmp / "actor")
    tok.save_pretrained(tmp / "actor")
    if critic is not None:
        critic.save_pretrained(tmp / "critic")
    torch.save(
        {
            "actor": opt_a.state_dict(),
            "critic": opt_c.state_dict() if opt_c is not None else None,
            "rng_cpu": torch.get_rng_state(),
            "rng_py": random.getstate(),
            "rng_cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        },
        tmp / "optim.pt",
    )
    (tmp / STATE_FILE).write_text(
        json.dumps({"step": step, "config": msgspec_to_builtins(cfg)}, indent=1)
    )
    # the rft trainer's "latest" convention, so its latest_checkpoint() finds ours
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (out / "latest.tmp").write_text(final.name)
    (out / "latest.tmp").replace(out / "latest")
    old = sorted(
        (p for p in out.glob("checkpoint-*") if p != final), key=lambda p: int(p.name.split("-")[1])
    )
    for p in old[: max(0, len(old) - (cfg.train.keep_checkpoints - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    log(f"ppo: saved {final}")
    return final


def msgspec_to_builtins(cfg: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(cfg)
