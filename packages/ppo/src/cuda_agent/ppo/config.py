"""The ``ppo train`` configuration: a TOML file, validated (unknown keys are errors).

Every key is documented next to its default below; ``configs/*.toml`` hold the presets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec


class _Cfg(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelCfg(_Cfg):
    actor: str = "smollm2"  # local HF checkpoint dir, or "smollm2" (the embedded default)
    critic: str | None = None  # critic dir (from `critic pretrain`); None: fresh head on the actor
    ref: str | None = None  # reference model for the KL term; None: the initial actor
    tiny: bool = False  # replace the actor by a tiny random-weight model (smoke tests)


class DataCfg(_Cfg):
    tasks: str = "runs/tasks.jsonl"  # Task records (JSONL)
    tasks_per_step: int = 4  # tasks sampled per PPO step
    samples_per_task: int = 2  # episodes per task
    seed: int = 0  # task order (a fresh permutation per pass over the data)


class RolloutCfg(_Cfg):
    mode: Literal["multi-turn", "single-turn"] = "multi-turn"  # single-turn = the warm-up stage
    # hf: in-process transformers, sharing weights with the trainer. server: an inference server
    # (vLLM's /v1/completions with token ids; agent.server_policy.ServerPolicy) that the trainer
    # makes load the actor from disk (SGLang's /update_weights_from_disk: SGLang or
    # `python -m cuda_agent.agent.serve`) before the first rollout and after every update
    engine: Literal["hf", "server"] = "hf"
    server_url: str | None = None  # engine = "server": the server's root, http://HOST:PORT
    server_model: str | None = None  # the served model name; None: the first in /v1/models
    # where the actor is saved for the server to load (a path the server can read); None:
    # OUT/server-weights (only the newest step-N is kept)
    server_weights_dir: str | None = None
    server_timeout: float = 600.0  # seconds per generation request
    # retries of a request after a connection error, timeout or HTTP 502/503/504 (backoff from
    # 0.5 s, doubled each time, at most 30 s); then the episode (or the weight reload) fails
    server_retries: int = 5
    max_turns: int = 200  # the paper: up to ~200 turns
    max_new_tokens: int = 4096  # per turn
    max_context: int = 131072  # the paper: 128k tokens
    temperature: float = 1.0  # sampling temperature of the rollout
    top_p: float = 1.0  # nucleus sampling (1.0: off)
    include_skill: bool = True  # SKILL.md in the prompt (False: the no-skill ablation)
    tools: list[str] | None = None  # the tools offered, e.g. ["Write", "Submit"]; None: all

    def __post_init__(self) -> None:
        if self.engine == "server" and not self.server_url:
            raise ValueError('rollout.engine = "server" needs rollout.server_url')
        if self.tools is not None:
            from cuda_agent.agent.tools import check_tool_names

            check_tool_names(self.tools, "rollout.tools")


class SandboxCfg(_Cfg):
    backend: Literal["auto", "cuda", "cpu"] = "auto"  # auto: cuda when a GPU and nvcc exist
    # the anti-hacking rules of the episodes' evaluations (docs/guards.md)
    guard_policy: Literal["strict", "kernelbench", "off"] = "strict"
    timing: bool = True  # time candidates (needed for rewards above 1)
    compile_baseline: bool | None = None  # None: on for cuda, off for cpu
    # evaluate every rank's episodes on a Ray cluster (RayPool; the `ray` extra) instead of a
    # pool of each rank's own: "auto" (the running cluster), "local" (start one here), HOST:PORT
    # or ray://...; one fleet for the whole run. None: each rank's own local pool
    ray_address: str | None = None
    # with ray_address: the fleet's workers (default: the cluster's GPUs; its CPUs on cpu). Every
    # rank starts its own fleet: with several ranks give each its share of the cluster
    ray_workers: int | None = None


class RewardCfg(_Cfg):
    # paper: -1 / 1 / 2 / 3 (incorrect, correct, faster than eager, faster than both baselines)
    scheme: Literal["paper", "speedup", "log-speedup"] = "paper"
    threshold: float = 0.05  # "faster" means more than 5% faster
    use_ci: bool = True  # decide on the speed-up CI's lower end when present


class PPOCfg(_Cfg):
    steps: int = 1  # PPO steps (rollout + update)
    epochs: int = 1  # K: passes over each step's samples
    minibatches: int = 1  # optimizer steps per epoch (samples split evenly)
    actor_lr: float = 1e-6  # actor learning rate (constant after its warm-up)
    # optimizer steps over which the actor's LR rises linearly to actor_lr (0: none): Adam's
    # first steps move every weight by about the LR whatever the gradient. On SmolLM2-135M at
    # 3e-5 it delayed the break of its kernels by two PPO steps, no more (docs/learning.md)
    actor_lr_warmup_steps: int = 0
    critic_lr: float = 1e-5  # critic learning rate (constant)
    eps_low: float = 0.2  # the paper's asymmetric clip: ratio >= 1 - eps_low
    eps_high: float = 0.28  # and ratio <= 1 + eps_high
    dual_clip: float | None = None  # e.g. 3.0; off by default
    value_clip: float | None = 0.2  # clipped value loss; None: plain squared error
    tis_cap: float | None = (
        2.0  # truncated importance sampling between rollout and trainer log-probs
    )
    gamma: float = 1.0  # GAE discount (also `critic pretrain --gamma` in bin/train_all.sh)
    lam: float = 1.0  # GAE lambda (also `critic pretrain --lambda`)
    kl_coef: float = (
        0.0  # KL to the reference model: off by default, always logged when a ref exists
    )
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # the per-token KL estimate of the KL term
    entropy_coef: float = 0.0  # entropy bonus: off by default, entropy always logged
    whiten_advantages: bool = True  # advantages scaled to mean 0, std 1 over the step
    max_grad_norm: float = 1.0  # gradient-norm clip of actor and critic
    critic_warmup_steps: int = 0  # steps that train only the critic
    use_critic: bool = True  # False: advantages are reward - a baseline (`critic_free_baseline`)
    # without a critic, the baseline subtracted from an episode's reward: "step", the mean
    # reward of the step's episodes; "task", the mean of the same task's samples in the step
    # (GRPO-style groups: a task whose samples all score alike contributes no gradient)
    critic_free_baseline: Literal["step", "task"] = "step"
    per_turn_samples: bool = False  # train each turn as its own sample (prefix as context)
    micro_batch_tokens: int = 16384  # padded tokens per forward pass (memory vs speed)

    def __post_init__(self) -> None:
        if self.actor_lr_warmup_steps < 0:
            raise ValueError(f"ppo.actor_lr_warmup_steps = {self.actor_lr_warmup_steps}: 0 or more")


class TrainCfg(_Cfg):
    out: str = "runs/ppo"  # the run directory: checkpoints, metrics, trajectories, final/
    device: str = "auto"  # auto | cpu | cuda
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    grad_ckpt: bool = False  # activation checkpointing (memory for time)
    # DeepSpeed JSON for actor and critic (configs/ds_zero2.json, ds_zero3.json); None: plain
    # PyTorch (one process, or plain data parallelism with an all-reduce under torchrun)
    deepspeed: str | None = None
    save_every: int = 1  # checkpoint every N steps (and at the end)
    keep_checkpoints: int = 2  # the newest N checkpoints are kept
    seed: int = 0  # sampling and initialisation seed
    tensorboard: bool = True  # also write TensorBoard events (when tensorboard is installed)


class PipelineCfg(_Cfg):
    """Stages of ``bin/train_all.sh`` around PPO (read by the script through ``ppo config-env``)."""

    data: Literal["synth", "ops6k", "tasks"] = "synth"  # where training tasks come from
    tasks_file: str | None = None  # data = "tasks": an existing Task JSONL
    ops6k: str | None = None  # data = "ops6k": the released parquet
    synth_n: int = 6000  # data = "synth": composed tasks before filtering
    synth_size: Literal["auto", "cpu", "gpu"] = "auto"  # shapes sized for the backend
    synth_compile_check: bool = True  # filter also runs torch.compile (slow on a CPU)
    limit_tasks: int = 0  # keep only the first N tasks (0: all)
    baselines: bool = True  # fill Task.baseline with `profiler baseline` (cuda only)
    warmup_steps: int = 50  # single-turn PPO warm-up steps (0: skip the stage)
    collect_samples: int = 4  # agent episodes per task for RFT / critic data
    collect_tasks: int = 0  # tasks used for collection (0: all)
    rft_lr: float = 1e-5  # `rft train --lr`: peak learning rate
    rft_epochs: float = 2.0  # `rft train --epochs`: passes over the kept trajectories
    rft_min_reward: float = 0.0  # keep trajectories with reward > this
    critic_lr: float = 1e-5  # `critic pretrain --lr`: peak learning rate
    critic_epochs: float = 1.0  # `critic pretrain --epochs`
    deepspeed: str | None = None  # DeepSpeed JSON for rft / critic (e.g. configs/ds_zero2.json)
    kernelbench: str | None = None  # a KernelBench checkout: evaluate the final actor on it
    kb_levels: str = "1,2,3"  # KernelBench levels of the eval stage
    kb_problems: str | None = None  # e.g. "1-10" for a quick look


class PPOConfig(_Cfg):
    model: ModelCfg = msgspec.field(default_factory=ModelCfg)
    data: DataCfg = msgspec.field(default_factory=DataCfg)
    rollout: RolloutCfg = msgspec.field(default_factory=RolloutCfg)
    sandbox: SandboxCfg = msgspec.field(default_factory=SandboxCfg)
    reward: RewardCfg = msgspec.field(default_factory=RewardCfg)
    ppo: PPOCfg = msgspec.field(default_factory=PPOCfg)
    train: TrainCfg = msgspec.field(default_factory=TrainCfg)
    pipeline: PipelineCfg = msgspec.field(default_factory=PipelineCfg)


class ConfigError(ValueError):
    pass


def load_config(path: str | Path, overrides: list[str] | None = None) -> PPOConfig:
    """Read and validate a TOML config; ``overrides`` are ``section.key=value`` (TOML values)."""
    import tomllib

    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: {e}") from None
    for ov in overrides or []:
        key, sep, value = ov.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"override {ov!r}: use section.key=value")
        section, name = key.split(".", 1)
        try:
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare string
        data.setdefault(section, {})[name] = parsed
    try:
        return msgspec.convert(data, PPOConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{p}: {e}") from None


def shell_env(cfg: PPOConfig, prefix: str = "CA") -> str:
    """Every key as ``export CA_SECTION_KEY=value`` lines (shell-quoted; booleans 1/0; None empty)."""
    import shlex

    lines = []
    for section, values in msgspec.to_builtins(cfg).items():
        for key, v in values.items():
            if isinstance(v, bool):
                v = "1" if v else "0"
            elif v is None:
                v = ""
            lines.append(f"export {prefix}_{section.upper()}_{key.upper()}={shlex.quote(str(v))}")
    return "\n".join(lines) + "\n"
