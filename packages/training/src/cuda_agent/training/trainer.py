"""The training backends shared by ``rft``, ``critic`` and ``ppo``.

One loop, two backends:

- ``torch`` (default): one process; fp32 parameters (the master weights) with bf16 autocast on
  CUDA, AdamW, gradient clipping, optional gradient checkpointing.
- ``deepspeed`` (``--deepspeed configs/ds_zero2.json``): ZeRO-2/3 over every rank the launcher
  started (``deepspeed --num_gpus N`` or ``torchrun``); bf16 parameters with fp32 master weights
  held by the ZeRO optimizer. ``"auto"`` entries of the JSON are filled from the CLI options.

:class:`Backend` wraps one model with its optimizer on either backend (``ppo`` holds two);
:func:`train` is the data-set loop on top of it. What changes between trainers is an :class:`Objective`: how to build the model, what one unit of
normalisation is (a policy token for SFT, a trajectory for value pretraining), and the loss of a
micro-batch as a *sum* over units. The loop divides by the number of units in the whole
optimizer step, over all micro-batches and ranks, so the loss is an exact mean over the global
batch whatever the bucketing and gradient accumulation.

Checkpoints (``OUT/checkpoint-<step>/``) are Hugging Face model directories plus
``trainer_state.json`` and the optimizer state (``trainer.pt`` or ``deepspeed/``); ``OUT/latest``
names the newest. ``--resume`` continues from it at the next step, with the same data order.
The final model is written to ``OUT/final``. Metrics go to ``OUT/metrics.jsonl`` (and
TensorBoard under ``OUT/tb`` when installed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cuda_agent.records.cli_helpers import log

from .data import Example, Schedule, bucket, collate, fingerprint
from .metrics import MetricsLogger

STATE_FILE = "trainer_state.json"


class TrainError(RuntimeError):
    """A training job that cannot start or continue (bad options, mismatched resume, ...)."""


@dataclass
class TrainConfig:
    """Options of a training run (the CLI's flags)."""

    out: Path
    lr: float = 1e-5
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.95)  # AdamW's betas
    max_grad_norm: float = 1.0
    epochs: float = 1.0
    max_steps: int | None = None
    grad_accum: int = 1
    batch_tokens: int = 16384
    precision: str = "auto"  # auto | bf16 | fp32
    grad_ckpt: bool = False
    deepspeed: Path | None = None
    save_every: int = 0  # 0: only at the end (and at --stop-after)
    keep_checkpoints: int = 2
    log_every: int = 1  # a metrics.jsonl line every N optimizer steps (and the last)
    seed: int = 0
    device: str = "auto"
    stop_after: int | None = None  # optimizer steps in this invocation, then checkpoint and exit
    resume: bool = False
    tensorboard: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # objective options, stored in the state

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out)
        d["deepspeed"] = str(self.deepspeed) if self.deepspeed else None
        return d


class Objective(Protocol):
    """What a trainer optimises. ``loss`` returns ``(sum of per-unit losses, metric sums)``."""

    name: str

    def build_model(self, source: str | Path, dtype: Any) -> Any: ...

    def units(self, examples: list[Example]) -> float: ...

    def loss(self, model: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, float]]: ...

    def summarize(self, sums: dict[str, float], units: float) -> dict[str, float]: ...

    def save(self, model: Any, out_dir: Path, state_dict: dict | None = None) -> None: ...


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    deepspeed: bool = False
    cpu: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_dist(cfg: TrainConfig) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.deepspeed is None:
        if world == 1:
            return Dist()
        # several ranks without DeepSpeed: every rank holds the whole model and the gradients
        # are summed by an all-reduce before the update (plain data parallelism)
        import torch
        import torch.distributed as tdist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available() and cfg.device != "cpu"
        if cuda:
            torch.cuda.set_device(local_rank)
        if not tdist.is_initialized():
            tdist.init_process_group("nccl" if cuda else "gloo")
        return Dist(tdist.get_rank(), tdist.get_world_size(), local_rank, False, not cuda)
    try:
        import deepspeed
    except ImportError as e:
        raise TrainError(
            f"--deepspeed needs the deepspeed package ({e}); install it with "
            "`uv sync --all-packages --extra deepspeed` (or `pip install deepspeed`), "
            "or drop --deepspeed to use the plain PyTorch backend"
        ) from None
    import torch

    # CUDA_AGENT_DEEPSPEED_CPU=1: DeepSpeed's CPU accelerator over gloo (a smoke test of this
    # code path on machines without a GPU; slow, fp32 only)
    on_cpu = os.environ.get("CUDA_AGENT_DEEPSPEED_CPU") == "1"
    if not torch.cuda.is_available() and not on_cpu:
        raise TrainError("--deepspeed needs CUDA GPUs; drop --deepspeed to train on the CPU")
    for k, v in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ["LOCAL_RANK"])
    if not on_cpu:
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="gloo" if on_cpu else "nccl")
    import torch.distributed as tdist

    return Dist(tdist.get_rank(), tdist.get_world_size(), local_rank, True, on_cpu)


def _resolve_device(cfg: TrainConfig, dist: Dist) -> Any:
    import torch

    if dist.deepspeed or dist.world > 1:
        return torch.device("cpu") if dist.cpu else torch.device("cuda", dist.local_rank)
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _use_bf16(cfg: TrainConfig, device: Any) -> bool:
    if cfg.precision == "auto":
        return device.type == "cuda"
    if cfg.precision not in ("bf16", "fp32"):
        raise TrainError(f"--precision must be auto, bf16 or fp32, not {cfg.precision!r}")
    return cfg.precision == "bf16"


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class _LRLambda:
    """Picklable schedule (a ``LambdaLR`` with a plain function cannot be checkpointed)."""

    def __init__(self, total: int, warmup: int, min_ratio: float):
        self.total, self.warmup, self.min_ratio = total, warmup, min_ratio

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.total, self.warmup, self.min_ratio)


def _param_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (
            no_decay if p.ndim < 2 or "norm" in name.lower() or name.endswith(".bias") else decay
        ).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def enable_checkpointing(model: Any) -> None:
    """Activation (gradient) checkpointing of every decoder layer, non-reentrant."""
    fn = getattr(model, "activation_checkpointing_enable", None)
    if fn is not None:  # transformers >= 5.x
        fn(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _ds_config(cfg: TrainConfig, dist: Dist, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed JSON with every ``"auto"`` filled from ``cfg``."""
    raw = json.loads(Path(cfg.deepspeed).read_text())

    def fill(d: dict[str, Any], key: str, value: Any) -> None:
        if d.get(key, "auto") == "auto":
            d[key] = value

    fill(raw, "train_micro_batch_size_per_gpu", 1)
    fill(raw, "gradient_accumulation_steps", cfg.grad_accum)
    fill(
        raw,
        "train_batch_size",
        raw["train_micro_batch_size_per_gpu"] * raw["gradient_accumulation_steps"] * dist.world,
    )
    fill(raw, "gradient_clipping", cfg.max_grad_norm)
    raw.setdefault("bf16", {})
    fill(raw["bf16"], "enabled", bf16)
    raw.setdefault("steps_per_print", 10**9)
    raw.setdefault("wall_clock_breakdown", False)
    if raw["gradient_accumulation_steps"] != cfg.grad_accum:
        raise TrainError(
            f"{cfg.deepspeed}: gradient_accumulation_steps {raw['gradient_accumulation_steps']} "
            f'disagrees with --grad-accum {cfg.grad_accum}; set it to "auto"'
        )
    return raw


def latest_checkpoint(out: Path) -> Path | None:
    """The newest whole checkpoint under ``out`` (``out/latest``, else the highest step)."""
    marker = out / "latest"
    if marker.is_file():
        p = out / marker.read_text().strip()
        if (p / STATE_FILE).is_file():
            return p
    found = sorted(
        (p for p in out.glob("checkpoint-*") if (p / STATE_FILE).is_file()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    return found[-1] if found else None


def barrier(dist: Dist) -> None:
    """Wait for every rank (a no-op in one process)."""
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()


def all_reduce_sum(values: list[float], dist: Dist, device: Any) -> list[float]:
    """Element-wise sums of ``values`` over ranks (the values themselves in one process)."""
    if dist.world == 1:
        return values
    import torch
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    tdist.all_reduce(t)
    return t.tolist()


def publish_checkpoint(out: Path, tmp: Path, step: int, keep: int) -> Path:
    """Move the finished ``tmp`` directory to ``out/checkpoint-<step>``, point ``out/latest`` at
    it (atomically) and delete all but the newest ``keep`` checkpoints. Rank 0 only."""
    final_dir = out / f"checkpoint-{step}"
    shutil.rmtree(final_dir, ignore_errors=True)
    tmp.rename(final_dir)
    (out / "latest.tmp").write_text(final_dir.name)
    (out / "latest.tmp").replace(out / "latest")
    old = sorted(
        (p for p in out.glob("checkpoint-*") if p != final_dir),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final_dir


def publish_dir(src: Path, dest: Path) -> None:
    """Replace ``dest`` by a copy of ``src``; a reader never sees a half-copied ``dest``."""
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


class Backend:
    """A model with its optimizer and LR schedule on the torch or the DeepSpeed backend.

    The piece every trainer shares (``ppo`` holds one for the actor and one for the critic).
    One optimizer step is: for each micro-batch ``with b.autocast(): loss = ...`` then
    ``b.backward(loss)``, where ``loss`` is already divided by the units of the whole global
    step; then ``grad_norm = b.step()``. Gradients are sums over ranks, clipped to
    ``cfg.max_grad_norm``; the LR follows warm-up + cosine over ``total_steps``.

    ``variable_accumulation=True`` (PPO, whose optimizer steps have a varying number of
    micro-batches): the caller passes ``last=True`` to the final ``backward`` of a step and
    ``step()`` applies the update. Under ZeRO every ``backward`` is collective, so every rank
    must call it equally often (pad with a zero loss, see ``ppo``).
    """

    def __init__(
        self,
        model: Any,
        cfg: TrainConfig,
        dist: Dist,
        device: Any,
        bf16: bool,
        total_steps: int,
        variable_accumulation: bool = False,
    ):
        import torch

        self.cfg, self.dist, self.device, self.bf16 = cfg, dist, device, bf16
        self.variable_accumulation = variable_accumulation
        if cfg.grad_ckpt:
            enable_checkpointing(model)
        model.to(device)
        model.train()
        self.model = model
        self.optimizer = torch.optim.AdamW(
            _param_groups(model, cfg.weight_decay),
            lr=cfg.lr,
            betas=cfg.adam_betas,
            fused=device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _LRLambda(total_steps, cfg.warmup_steps, cfg.min_lr_ratio)
        )
        self.engine = None
        if dist.deepspeed:
            import deepspeed

            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model,
                optimizer=self.optimizer,
                lr_scheduler=self.scheduler,
                config=_ds_config(cfg, dist, bf16),
            )
        # DeepSpeed keeps bf16 parameters itself; the torch backend autocasts fp32 ones
        self._autocast = bf16 and self.engine is None

    @property
    def name(self) -> str:
        return "deepspeed" if self.engine is not None else "torch"

    @property
    def module(self) -> Any:
        """The ``nn.Module`` to call (unwrapped from the DeepSpeed engine)."""
        return self.engine.module if self.engine is not None else self.model

    @property
    def lr(self) -> float:
        if self.scheduler is None:
            return self.cfg.lr
        return float(self.scheduler.get_last_lr()[0])

    def autocast(self) -> Any:
        """bf16 autocast on the torch backend when bf16 is on (``--precision auto`` on CUDA)."""
        import torch

        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast)

    def backward(self, loss: Any, last: bool = True) -> None:
        """Accumulate the gradient of one micro-batch's (globally normalised) loss; ``last``
        marks the final micro-batch of an optimizer step (``variable_accumulation`` only)."""
        if self.engine is not None:
            if self.variable_accumulation:
                self.engine.set_gradient_accumulation_boundary(last)
            # DeepSpeed averages gradients over ranks: undo that to keep a global-batch sum
            self.engine.backward(loss * self.dist.world, scale_wrt_gas=False)
            if not self.variable_accumulation:
                self.engine.step()  # a no-op until the accumulation boundary
        else:
            loss.backward()

    def step(self) -> float:
        """Clip, update, advance the LR schedule, zero the gradients; the pre-clip grad norm."""
        import torch

        if self.engine is not None:
            if self.variable_accumulation:
                self.engine.step()
            gn = self.engine.get_global_grad_norm()
            return float(gn) if gn is not None else float("nan")
        if self.dist.world > 1:  # plain data parallelism: sum the gradients of all ranks
            import torch.distributed as tdist

            for p in self.model.parameters():
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    tdist.all_reduce(p.grad)
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(gn)

    def full_state_dict(self) -> dict | None:
        """The whole model's weights where they are partitioned (ZeRO-3; collective), else
        ``None`` (``module.state_dict()`` is then complete)."""
        if self.engine is not None and self.engine.zero_optimization_stage() == 3:
            return self.engine._zero3_consolidated_16bit_state_dict()
        return None

    def save_state(self, ckpt: Path) -> None:
        """Optimizer and schedule state into ``ckpt`` (collective under DeepSpeed)."""
        import torch

        if self.engine is not None:
            self.engine.save_checkpoint(str(ckpt / "deepspeed"), tag="state")
        elif self.dist.main:
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
            torch.save(state, ckpt / "trainer.pt")

    def load_state(self, ckpt: Path) -> None:
        """Restore what :meth:`save_state` wrote (under DeepSpeed the weights too)."""
        import torch

        if self.engine is not None:
            self.engine.load_checkpoint(str(ckpt / "deepspeed"), tag="state")
            return
        st = torch.load(ckpt / "trainer.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])


def setup_distributed(cfg: TrainConfig) -> tuple[Dist, Any, bool]:
    """``(dist, device, bf16)`` for ``cfg``; starts DeepSpeed's process group when asked."""
    dist = _init_dist(cfg)
    device = _resolve_device(cfg, dist)
    return dist, device, _use_bf16(cfg, device)


def train(
    objective: Objective,
    model_source: str | Path,
    examples: list[Example],
    cfg: TrainConfig,
    save_extra: Any = None,
) -> dict[str, Any]:
    """Train ``objective`` on ``examples`` from ``model_source``; returns the last step's metrics.

    Guarantees: the loss of a step is the mean over all units of the step's global batch; a run
    stopped after a checkpoint and resumed reaches the same weights as an uninterrupted run
    (same data order, optimizer and scheduler state); ``OUT/final`` is a loadable HF directory.
    ``save_extra(dir)`` is called on rank 0 for every saved model directory (e.g. the tokenizer).
    """
    import torch

    if not examples:
        raise TrainError("no training examples (see the data messages above)")
    out = Path(cfg.out)
    dist, device, bf16 = setup_distributed(cfg)
    if bf16 and device.type == "cpu" and dist.main:
        log("train: bf16 autocast on the CPU is slow; --precision fp32 is the CPU default")
    torch.manual_seed(cfg.seed)

    schedule = Schedule(bucket(examples, cfg.batch_tokens), cfg.grad_accum, dist.world, cfg.seed)
    if cfg.max_steps is not None:
        total_steps = cfg.max_steps
    else:
        total_steps = max(1, math.ceil(cfg.epochs * schedule.steps_per_epoch))
    data_fp = fingerprint(examples)

    ckpt = latest_checkpoint(out) if cfg.resume else None
    start_step = 0
    if cfg.resume and ckpt is None and dist.main:
        log(f"train: --resume but no checkpoint in {out}; starting from step 0")
    if ckpt is not None:
        state = json.loads((ckpt / STATE_FILE).read_text())
        mismatch = [
            f"{k}: checkpoint {state.get(k)!r}, now {v!r}"
            for k, v in (
                ("objective", objective.name),
                ("data_fingerprint", data_fp),
                ("total_steps", total_steps),
                ("batch_tokens", cfg.batch_tokens),
                ("grad_accum", cfg.grad_accum),
                ("world_size", dist.world),
                ("seed", cfg.seed),
                ("backend", "deepspeed" if dist.deepspeed else "torch"),
                ("extra", cfg.extra),
            )
            if state.get(k) != v
        ]
        if mismatch:
            raise TrainError(
                f"cannot resume from {ckpt}: the run differs (" + "; ".join(mismatch) + "); "
                "use another --out or the same options"
            )
        start_step = int(state["step"])
        if dist.main:
            log(f"train: resuming from {ckpt} at step {start_step + 1}/{total_steps}")

    # the model: fp32 parameters (master weights); DeepSpeed casts its own copy to bf16
    source = ckpt / "model" if (ckpt is not None and not dist.deepspeed) else model_source
    backend = Backend(
        objective.build_model(source, torch.float32), cfg, dist, device, bf16, total_steps
    )
    if ckpt is not None:
        backend.load_state(ckpt)
    module = backend.module

    metrics_log = MetricsLogger(
        out / "metrics.jsonl",
        tb_dir=out / "tb" if cfg.tensorboard else None,
        resume_step=start_step,
        enabled=dist.main,
    )
    if dist.main:
        n_tok = sum(len(e) for e in examples)
        log(
            f"train: {objective.name}, {len(examples)} examples, {n_tok} tokens, "
            f"{len(schedule.batches)} micro-batches, {schedule.steps_per_epoch} steps/epoch, "
            f"{total_steps} steps, device {device}, "
            f"{backend.name} backend, "
            f"{'bf16' if bf16 else 'fp32'}, world {dist.world}"
        )

    def save(step: int) -> Path:
        """Checkpoint after ``step`` completed steps (collective under DeepSpeed)."""
        final_dir = out / f"checkpoint-{step}"
        tmp = out / f".tmp-checkpoint-{step}"
        if dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(dist)
        sd = backend.full_state_dict()
        backend.save_state(tmp)
        if dist.main:
            objective.save(module, tmp / "model", state_dict=sd)
            if save_extra is not None:
                save_extra(tmp / "model")
            state = {
                "step": step,
                "total_steps": total_steps,
                "objective": objective.name,
                "data_fingerprint": data_fp,
                "batch_tokens": cfg.batch_tokens,
                "grad_accum": cfg.grad_accum,
                "world_size": dist.world,
                "seed": cfg.seed,
                "backend": backend.name,
                "extra": cfg.extra,
                "config": cfg.to_json(),
            }
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
            publish_checkpoint(out, tmp, step, cfg.keep_checkpoints)
            log(f"train: saved {final_dir}")
        barrier(dist)
        return final_dir

    last: dict[str, Any] = {}
    t_start = time.monotonic()
    done_here = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = start_step
    for step in range(start_step, total_steps):
        t0 = time.monotonic()
        lr_now = backend.lr
        all_mbs = schedule.all_step_batches(step)
        total_units = sum(objective.units([examples[i] for i in mb]) for mb in all_mbs)
        sums: dict[str, float] = {}
        tokens = 0
        for mb in schedule.step_batches(step, dist.rank):
            batch = {
                k: v.to(device, non_blocking=True)
                for k, v in collate([examples[i] for i in mb]).items()
            }
            tokens += int(batch["attention_mask"].sum())
            with backend.autocast():
                loss_sum, m = objective.loss(module, batch)
            backend.backward(loss_sum / max(total_units, 1e-12))
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        grad_norm = backend.step()
        keys = sorted(sums)
        reduced = all_reduce_sum([sums[k] for k in keys] + [float(tokens)], dist, device)
        sums = dict(zip(keys, reduced[:-1], strict=True))
        tokens = int(reduced[-1])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.monotonic() - t0
        done_here += 1
        metrics = objective.summarize(sums, total_units)
        metrics.update(
            lr=lr_now,
            grad_norm=grad_norm,
            tokens=tokens,
            tokens_per_s=tokens / dt if dt > 0 else 0.0,
            step_s=dt,
            epoch=step / schedule.steps_per_epoch,
        )
        if device.type == "cuda":
            metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        last = metrics
        if dist.main:
            metrics_log.write(step + 1, metrics)
            if (step + 1) % cfg.log_every == 0 or step + 1 == total_steps:
                shown = ", ".join(
                    f"{k} {v:.4g}" for k, v in metrics.items() if k not in ("tokens", "epoch")
                )
                log(f"step {step + 1}/{total_steps}: {shown}")
        stopping = cfg.stop_after is not None and done_here >= cfg.stop_after
        if step + 1 < total_steps and (
            stopping or (cfg.save_every and (step + 1) % cfg.save_every == 0)
        ):
            save(step + 1)
        if stopping and step + 1 < total_steps:
            if dist.main:
                log(
                    f"train: stopped after {done_here} steps (--stop-after); continue with --resume"
                )
            metrics_log.close()
            return {**last, "stopped": True, "step": step + 1}
    if start_step < total_steps:
        save(total_steps)
    if dist.main:
        final = out / "final"
        publish_dir(out / f"checkpoint-{total_steps}" / "model", final)
        wall = time.monotonic() - t_start
        log(f"train: done, {done_here} steps in {wall:.1f}s; final model in {final}")
    metrics_log.close()
    barrier(dist)
    return {**last, "stopped": False, "step": total_steps}
