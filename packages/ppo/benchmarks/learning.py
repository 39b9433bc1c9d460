"""Does the recipe learn? SmolLM2-135M on real cpu-backend sandbox rewards, 3 seeds (issue #29).

Stages, each resumable (a stage whose output exists is skipped), under ``--work``:

1. ``tasks``: a curriculum of one-line elementwise cpu tasks (``x * 2.5``, ``clamp``, ...), in
   families; each family's constants are split into train tasks and HELD-OUT tasks.
2. ``coldstart``: the scripted policy (``agent.policy.ScriptedPolicy``) solves every train task
   with a known-good kernel, evaluated and rewarded by the sandbox; ``rft select`` keeps them.
   This is the stated cold start: SmolLM2 writes no working kernel by itself.
3. ``base``: held-out evaluation of the base model (once: one model stands for every seed).
4. ``rft train`` on the kept scripted trajectories (once, shared by the seeds; per seed with
   ``--no-shared-rft``) -> held-out evaluation -> per seed:
   multi-turn ``ppo train`` (critic-free, real sandbox rewards), evaluated on the held-out tasks
   after every ``--eval-every`` PPO steps.

Every evaluation writes a metrics line to ``WORK/results.jsonl``; ``report`` aggregates them
(mean and spread over seeds per stage), writes ``summary.json`` and the plot.

    OMP_NUM_THREADS=2 uv run python packages/ppo/benchmarks/learning.py run --work runs/learning
    uv run python packages/ppo/benchmarks/learning.py report --work runs/learning --out OUT

What it measured: docs/learning.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import msgspec
import typer

# torch's threads in this process and the rft/ppo subprocesses (OMP_NUM_THREADS=2 uses both
# cores of a 2-core machine; 1 leaves a core to the sandbox's compiles)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
THREADS = int(os.environ["OMP_NUM_THREADS"])

app = typer.Typer(add_completion=False, no_args_is_help=True)

TOOLS = ("Write", "Submit")

# the reference programs: one elementwise expression of x, the kernel's C expression of x[i]
REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""

# family -> (task name, torch expression, C expression) templates over constants a, b
FAMILIES: dict[str, tuple[str, str, str]] = {
    "scale": ("Scale_{a}", "x * {a}", "x[i] * {a}f"),
    "shift": ("Shift_{a}", "x + {a}", "x[i] + {a}f"),
    "affine": ("Affine_{a}_{b}", "x * {a} + {b}", "x[i] * {a}f + {b}f"),
    "leaky": ("LeakyReLU_{a}", "torch.where(x > 0, x, x * {a})", "x[i] > 0.f ? x[i] : x[i] * {a}f"),
    "clampmax": ("ClampMax_{a}", "torch.clamp(x, max={a})", "x[i] > {a}f ? {a}f : x[i]"),
    "square": ("SquareScale_{a}", "x * x * {a}", "x[i] * x[i] * {a}f"),
    "rsub": ("RSub_{a}", "{a} - x", "{a}f - x[i]"),
    "relushift": ("ReLUShift_{a}", "torch.relu(x - {a})", "x[i] > {a}f ? x[i] - {a}f : 0.f"),
}
# (a, b) per task; the last HELDOUT_PER_FAMILY of each family are held out
CONSTS: list[tuple[str, str]] = [
    ("0.5", "1.0"),
    ("2.0", "0.5"),
    ("3.0", "2.0"),
    ("1.5", "0.25"),
    ("2.5", "1.5"),
]

KERNEL = """extern "C" void op_launch(float* y, const float* x, long n) {{
  for (long i = 0; i < n; ++i) y[i] = {cexpr};
}}
"""
BINDING = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include "../binding_registry.h"
extern "C" void op_launch(float* y, const float* x, long n);
static torch::Tensor op(torch::Tensor x) {
  auto y = torch::empty_like(x);
  op_launch(y.data_ptr<float>(), x.data_ptr<float>(), x.numel());
  return y;
}
static void reg(pybind11::module_& m) { m.def("op", &op); }
REGISTER_BINDING(op, reg);
"""
MODEL_NEW = """import torch.nn as nn
import cuda_extension
class ModelNew(nn.Module):
    def forward(self, x):
        return cuda_extension.op(x)
"""


class StageMetrics(msgspec.Struct, kw_only=True):
    """One held-out evaluation: a stage (base, rft, ppo) of one seed at one PPO step."""

    stage: str
    seed: int
    ppo_step: int
    n: int
    reward_mean: float
    pass_rate: float
    rewards: dict[str, float]
    seconds: float
    model: str


class SpecTask(msgspec.Struct, kw_only=True):
    """A curriculum task and its known-good kernel expression (the cold start's answer)."""

    family: str
    name: str
    expr: str
    cexpr: str
    heldout: bool


def curriculum(families: list[str], heldout_per_family: int, per_family: int) -> list[SpecTask]:
    """The task list: ``per_family`` constants of each family, the last ``heldout_per_family``
    of them held out."""
    out = []
    for fam in families:
        name_t, expr_t, c_t = FAMILIES[fam]
        for k, (a, b) in enumerate(CONSTS[:per_family]):
            name = name_t.format(a=a, b=b).replace(".", "_")
            out.append(
                SpecTask(
                    family=fam,
                    name=name,
                    expr=expr_t.format(a=a, b=b),
                    cexpr=c_t.format(a=a, b=b),
                    heldout=k >= per_family - heldout_per_family,
                )
            )
    return out


def solve_turn(spec: SpecTask) -> str:
    """The scripted policy's single turn: the kernel, its binding, ModelNew, then Submit."""
    from cuda_agent.agent.toolcalls import format_tool_call

    def w(path: str, content: str) -> str:
        return format_tool_call("Write", {"path": path, "content": content})

    return (
        w("kernels/op.cpp", KERNEL.format(cexpr=spec.cexpr))
        + w("kernels/op_binding.cpp", BINDING)
        + w("model_new.py", MODEL_NEW)
        + format_tool_call("Submit", {})
    )


def seed_list(seeds: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``."""
    return [int(s) for s in seeds.split(",") if s.strip()]


def aggregate(rows: list[StageMetrics]) -> list[dict]:
    """Per (stage, PPO step): the mean, the spread (population std and min-max range) of the
    seeds' held-out mean reward and pass rate; the last evaluation of a (stage, step, seed)
    wins."""
    last: dict[tuple[str, int, int], StageMetrics] = {}
    for r in rows:
        last[(r.stage, r.ppo_step, r.seed)] = r
    groups: dict[tuple[str, int], list[StageMetrics]] = {}
    for (stage, step, _), r in sorted(last.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1])):
        groups.setdefault((stage, step), []).append(r)
    out = []
    for (stage, step), rs in groups.items():
        rew = [r.reward_mean for r in rs]
        pas = [r.pass_rate for r in rs]
        out.append(
            {
                "stage": stage,
                "ppo_step": step,
                "seeds": [r.seed for r in rs],
                "reward_mean": statistics.fmean(rew),
                "reward_std": statistics.pstdev(rew),
                "reward_range": max(rew) - min(rew),
                "reward_per_seed": rew,
                "pass_rate": statistics.fmean(pas),
                "pass_std": statistics.pstdev(pas),
                "pass_per_seed": pas,
            }
        )
    return out


def expand_shared(rows: list[StageMetrics]) -> list[StageMetrics]:
    """A stage evaluated for one seed only (the base model, a shared RFT actor) stands for
    every PPO seed: its row is repeated with each of their seeds."""
    seeds = sorted({r.seed for r in rows if r.stage == "ppo"})
    out = [r for r in rows]
    for stage in ("base", "rft"):
        rs = [r for r in rows if r.stage == stage]
        if rs and len({r.seed for r in rs}) == 1:
            out = [r for r in out if r.stage != stage]
            out += [msgspec.structs.replace(rs[-1], seed=s) for s in seeds or [rs[-1].seed]]
    return out


def _order(stage: str) -> int:
    return {"base": 0, "rft": 1, "ppo": 2}.get(stage, 3)


def acceptance(rows: list[StageMetrics]) -> dict:
    """Issue #29's test: PPO's final held-out mean reward minus its starting checkpoint's (the
    RFT actor), per seed, against the spread of the seeds (the larger std of the two stages)."""
    last: dict[tuple[str, int], StageMetrics] = {}
    for r in rows:
        if r.stage in ("rft", "ppo"):
            key = (r.stage, r.seed)
            if r.stage == "rft" or key not in last or r.ppo_step >= last[key].ppo_step:
                last[key] = r
    seeds = sorted({s for (st, s) in last if st == "ppo" and ("rft", s) in last})
    if not seeds:
        return {"seeds": [], "holds": False}
    start = [last[("rft", s)].reward_mean for s in seeds]
    end = [last[("ppo", s)].reward_mean for s in seeds]
    deltas = [e - b for b, e in zip(start, end, strict=True)]
    spread = max(statistics.pstdev(start), statistics.pstdev(end))
    gain = statistics.fmean(deltas)
    return {
        "seeds": seeds,
        "rft_reward": start,
        "ppo_reward": end,
        "delta_per_seed": deltas,
        "delta_mean": gain,
        "spread": spread,
        "holds": len(seeds) >= 3 and gain > spread,
    }


# ----------------------------------------------------------------------------------- stages
def _log(msg: str) -> None:
    print(f"[learning {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path) -> None:
    """Run a package CLI, its output appended to ``log``; a failure stops the benchmark."""
    _log("$ " + " ".join(cmd))
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}\n{tail}")


def _bin(name: str) -> str:
    """A toolkit CLI next to this interpreter (the environment's scripts), else from PATH."""
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


def _sandbox_config(timing: bool):
    from cuda_agent.sandbox import SandboxConfig

    return SandboxConfig(backend="cpu", timing=timing, guard_policy="strict")


def _episode_config(max_turns: int, max_new_tokens: int, max_context: int):
    from cuda_agent.agent.episode import EpisodeConfig

    return EpisodeConfig(
        mode="multi-turn",
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        max_context_tokens=max_context,
        include_skill=False,
        tools=TOOLS,
    )


def task_paths(work: Path) -> tuple[Path, Path]:
    """The train and held-out task files of a run's work directory."""
    return work / "tasks" / "train.jsonl", work / "tasks" / "heldout.jsonl"


def _write_tasks(work: Path, specs: list[SpecTask]) -> tuple[Path, Path]:
    from cuda_agent.records import RecordWriter, Task

    train, held = task_paths(work)
    d = train.parent
    d.mkdir(parents=True, exist_ok=True)
    if not (train.exists() and held.exists()):
        for path, want in ((train, False), (held, True)):
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            with RecordWriter(tmp) as w:
                for s in specs:
                    if s.heldout == want:
                        w.write(Task.make(s.name, REF.format(expr=s.expr), level=1))
            tmp.rename(path)
        (d / "specs.json").write_bytes(msgspec.json.encode(specs))
    return train, held


def coldstart(work: Path, specs: list[SpecTask], model: str, ecfg, timing: bool) -> Path:
    """Scripted episodes on the train tasks (real sandbox rewards), then ``rft select``."""
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.agent.episode import EpisodeRunner
    from cuda_agent.agent.models import load_tokenizer
    from cuda_agent.agent.policy import ScriptedPolicy
    from cuda_agent.records import RecordWriter, Task

    d = work / "coldstart"
    kept = d / "kept.jsonl"
    if (d / ".done").exists():
        return kept
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0 = time.monotonic()
    tok = load_tokenizer(model)
    trajs = d / "trajectories.jsonl"
    with SandboxEnv(_sandbox_config(timing)) as env, RecordWriter(trajs) as w:
        for k, s in enumerate(x for x in specs if not x.heldout):
            task = Task.make(s.name, REF.format(expr=s.expr), level=1)
            pol = ScriptedPolicy(tok, [solve_turn(s)], name="scripted-coldstart")
            (t,) = EpisodeRunner(pol, env, ecfg, d / "workspaces" / f"{k:03d}").run([(task, 0)])
            _log(f"coldstart {s.name}: {t.stop_reason}, reward {t.reward:+g}")
            w.write(t)
    _run(
        [_bin("rft"), "select", str(trajs), "--dropped", str(d / "dropped.jsonl"), "-o", str(kept)],
        d / "log.txt",
    )
    shutil.rmtree(d / "workspaces", ignore_errors=True)
    (d / "timing.json").write_text(json.dumps({"seconds": time.monotonic() - t0}))
    (d / ".done").touch()
    return kept


def evaluate(
    model_dir: str,
    tasks: Path,
    out: Path,
    *,
    stage: str,
    seed: int,
    ppo_step: int,
    ecfg,
    temperature: float,
    samples: int,
    timing: bool,
    device: str = "cpu",
) -> StageMetrics:
    """Held-out episodes of ``model_dir`` (``samples`` per task, all in one batch), rewarded by
    the sandbox; the trajectories go to ``out.jsonl``, the metrics to ``out.json``. Skipped when
    ``out.json`` exists."""
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.agent.episode import EpisodeRunner
    from cuda_agent.agent.policy import HFPolicy
    from cuda_agent.records import RecordWriter, Task, load_records

    done = out.with_suffix(".json")
    if done.exists():
        return msgspec.json.decode(done.read_bytes(), type=StageMetrics)
    import torch

    torch.set_num_threads(THREADS)
    t0 = time.monotonic()
    task_list = load_records(tasks, Task)
    pol = HFPolicy.load(model_dir, device=device, temperature=temperature, seed=seed)
    ws = out.parent / (out.name + "-workspaces")
    shutil.rmtree(ws, ignore_errors=True)
    jobs = [(t, k) for t in task_list for k in range(samples)]
    with SandboxEnv(_sandbox_config(timing)) as env:
        trajs = EpisodeRunner(pol, env, ecfg, ws).run(jobs)
    shutil.rmtree(ws, ignore_errors=True)
    traj_file = out.with_suffix(".jsonl")
    traj_file.unlink(missing_ok=True)
    with RecordWriter(traj_file) as w:
        for t in trajs:
            w.write(t)
    rewards = {f"{t.task.name}#{t.meta['sample']}": float(t.reward or -1.0) for t in trajs}
    vals = list(rewards.values())
    m = StageMetrics(
        stage=stage,
        seed=seed,
        ppo_step=ppo_step,
        n=len(vals),
        reward_mean=statistics.fmean(vals),
        pass_rate=sum(v > 0 for v in vals) / len(vals),
        rewards=rewards,
        seconds=round(time.monotonic() - t0, 1),
        model=model_dir,
    )
    done.write_bytes(msgspec.json.encode(m))
    with (out.parent.parent / "results.jsonl").open("ab") as f:
        f.write(msgspec.json.encode(m) + b"\n")
    _log(
        f"eval {stage} seed {seed} step {ppo_step}: reward {m.reward_mean:+.3f}, "
        f"pass {m.pass_rate:.2f} ({m.n} episodes, {m.seconds:.0f}s)"
    )
    return m


def ppo_config(
    path: Path,
    *,
    actor: str,
    tasks: Path,
    out: Path,
    seed: int,
    steps: int,
    o: dict,
) -> None:
    """The ``ppo train`` config of one seed (TOML), every value from the benchmark's flags."""

    def q(v: object) -> str:
        return json.dumps(v)

    path.write_text(
        f"""[model]
actor = {q(actor)}

[data]
tasks = {q(str(tasks))}
tasks_per_step = {o["tasks_per_step"]}
samples_per_task = {o["samples_per_task"]}
seed = {seed}

[rollout]
mode = "multi-turn"
max_turns = {o["max_turns"]}
max_new_tokens = {o["max_new_tokens"]}
max_context = {o["max_context"]}
temperature = {o["temperature"]}
include_skill = false
tools = {q(list(TOOLS))}

[sandbox]
backend = "cpu"
guard_policy = "strict"
timing = {str(o["timing"]).lower()}

[ppo]
steps = {steps}
epochs = {o["ppo_epochs"]}
minibatches = {o["minibatches"]}
actor_lr = {o["actor_lr"]}
actor_lr_warmup_steps = {o.get("actor_lr_warmup_steps", 0)}
use_critic = false
critic_free_baseline = {q(o["critic_free_baseline"])}
kl_coef = {o["kl_coef"]}
micro_batch_tokens = {o["micro_batch_tokens"]}

[train]
out = {q(str(out))}
device = {q(o["device"])}
seed = {seed}
tensorboard = false
save_every = 1
keep_checkpoints = 1000
"""
    )


def run_rft(work: Path, seed: int, kept: Path, held: Path, o: dict, ecfg) -> Path:
    """``rft train`` (seed ``seed``) on the kept cold-start trajectories, then its held-out
    evaluation; ``WORK/rft-SEED/final`` is the fine-tuned actor."""
    d = work / f"rft-{seed}"
    d.mkdir(parents=True, exist_ok=True)
    rft = d
    log = d / "log.txt"
    if not (rft / "final" / "config.json").exists():
        _run(
            [
                _bin("rft"),
                "train",
                "--model",
                o["model"],
                "--data",
                str(kept),
                "--out",
                str(rft),
                "--lr",
                str(o["rft_lr"]),
                "--epochs",
                str(o["rft_epochs"]),
                "--batch-tokens",
                str(o["rft_batch_tokens"]),
                "--max-len",
                str(o["max_context"]),
                "--seed",
                str(seed),
                "--device",
                o["device"],
                "--resume",
            ],
            log,
        )
    ev = dict(
        ecfg=ecfg,
        temperature=o["eval_temperature"],
        samples=o["eval_samples"],
        device=o["device"],
    )
    evaluate(
        str(rft / "final"),
        held,
        d / "eval",
        stage="rft",
        seed=seed,
        ppo_step=0,
        **ev,
        timing=o["timing"],
    )
    return rft / "final"


def run_seed(work: Path, seed: int, actor: Path, train: Path, held: Path, o: dict, ecfg) -> None:
    """Multi-turn PPO from ``actor`` in chunks of ``eval_every`` steps, each chunk's checkpoint
    evaluated on the held-out tasks."""
    d = work / f"seed-{seed}"
    d.mkdir(parents=True, exist_ok=True)
    log = d / "log.txt"
    ev = dict(
        ecfg=ecfg,
        temperature=o["eval_temperature"],
        samples=o["eval_samples"],
        device=o["device"],
    )
    ev["timing"] = o["timing"]
    ppo = d / "ppo"
    cfg = d / "ppo.toml"
    t0 = time.monotonic()
    step = 0
    while step < o["ppo_steps"]:
        step = min(step + o["eval_every"], o["ppo_steps"])
        ck = ppo / f"checkpoint-{step}" / "actor"
        if not (d / f"eval-ppo-{step}.json").exists():
            if not (ck / "config.json").exists():
                ppo_config(cfg, actor=str(actor), tasks=train, out=ppo, seed=seed, steps=step, o=o)
                _run([_bin("ppo"), "train", "--config", str(cfg), "--resume"], log)
            evaluate(
                str(ck), held, d / f"eval-ppo-{step}", stage="ppo", seed=seed, ppo_step=step, **ev
            )
        else:
            _log(f"seed {seed}: PPO step {step} evaluated already")
    _log(f"seed {seed} done in {time.monotonic() - t0:.0f}s")


def run_seeds_in_processes(work: Path, starts: dict[int, Path], jobs: int) -> None:
    """Each seed's PPO (``run_seed``) in its own ``seed`` process, ``jobs`` at a time, its output
    in ``WORK/seed-N/run.log``; a seed whose process fails stops the benchmark once the others
    have ended (their finished stages stay done for the next invocation)."""
    pending = list(starts.items())
    running: dict[int, tuple[subprocess.Popen, Path, float]] = {}
    failed: list[str] = []
    while pending or running:
        while pending and len(running) < jobs:
            s, actor = pending.pop(0)
            log = work / f"seed-{s}" / "run.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(Path(__file__).resolve()), "seed", "--work", str(work)]
            cmd += ["--seed", str(s), "--actor", str(actor)]
            with log.open("a") as f:
                running[s] = (
                    subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT),
                    log,
                    time.monotonic(),
                )
            _log(f"seed {s}: started (log {log})")
        time.sleep(1.0)
        for s, (proc, log, t1) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[s]
            _log(f"seed {s}: rc {proc.returncode} after {time.monotonic() - t1:.0f}s")
            if proc.returncode != 0:
                failed.append(f"seed {s} (rc {proc.returncode}, see {log})")
    if failed:
        raise SystemExit("failed: " + "; ".join(failed))


@app.command(hidden=True)
def seed(
    work: Annotated[Path, typer.Option(help="The run's work directory (its args.json).")],
    seed: Annotated[int, typer.Option(help="The seed whose PPO to run.")],
    actor: Annotated[Path, typer.Option(help="The PPO start (an RFT actor).")],
) -> None:
    """One seed's PPO and held-out evaluations, with the options ``run`` saved in args.json
    (what ``run --jobs N`` starts per seed)."""
    import torch

    torch.set_num_threads(THREADS)
    o = json.loads((work / "args.json").read_text())
    train, held = task_paths(work)
    ecfg = _episode_config(o["max_turns"], o["max_new_tokens"], o["max_context"])
    run_seed(work, seed, actor, train, held, o, ecfg)


@app.command()
def run(
    work: Annotated[
        Path, typer.Option(help="Work directory (resumable: done stages are skipped).")
    ] = Path("runs/learning"),
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    model: Annotated[
        str, typer.Option(help="Base model: 'smollm2' or a local HF directory.")
    ] = "smollm2",
    families: Annotated[str, typer.Option(help="Task families (comma-separated).")] = ",".join(
        FAMILIES
    ),
    per_family: Annotated[int, typer.Option(help="Tasks (constants) per family.")] = 5,
    heldout_per_family: Annotated[int, typer.Option(help="Of them, held out.")] = 2,
    max_turns: Annotated[int, typer.Option(help="Turns per episode.")] = 2,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per turn.")] = 448,
    max_context: Annotated[int, typer.Option(help="Context budget of an episode.")] = 2048,
    rft_lr: Annotated[float, typer.Option(help="rft train --lr.")] = 1e-4,
    rft_epochs: Annotated[float, typer.Option(help="rft train --epochs.")] = 1.0,
    rft_batch_tokens: Annotated[int, typer.Option(help="rft train --batch-tokens.")] = 2048,
    ppo_steps: Annotated[int, typer.Option(help="Multi-turn PPO steps per seed.")] = 3,
    eval_every: Annotated[int, typer.Option(help="Held-out evaluation every N PPO steps.")] = 3,
    tasks_per_step: Annotated[int, typer.Option(help="PPO data.tasks_per_step.")] = 2,
    samples_per_task: Annotated[int, typer.Option(help="PPO data.samples_per_task.")] = 4,
    critic_free_baseline: Annotated[
        str, typer.Option(help="PPO ppo.critic_free_baseline: task (GRPO-style groups) or step.")
    ] = "task",
    temperature: Annotated[float, typer.Option(help="PPO rollout temperature.")] = 0.6,
    actor_lr: Annotated[
        float, typer.Option(help="PPO ppo.actor_lr (3e-5 broke the format).")
    ] = 1e-5,
    actor_lr_warmup_steps: Annotated[
        int, typer.Option(help="PPO ppo.actor_lr_warmup_steps (optimizer steps; 0: none).")
    ] = 0,
    ppo_epochs: Annotated[int, typer.Option(help="PPO ppo.epochs.")] = 1,
    minibatches: Annotated[int, typer.Option(help="PPO ppo.minibatches.")] = 2,
    kl_coef: Annotated[float, typer.Option(help="PPO ppo.kl_coef (0: no reference model).")] = 0.05,
    micro_batch_tokens: Annotated[int, typer.Option(help="PPO ppo.micro_batch_tokens.")] = 4096,
    eval_temperature: Annotated[
        float, typer.Option(help="Held-out sampling temperature (0: greedy).")
    ] = 0.6,
    eval_samples: Annotated[int, typer.Option(help="Held-out episodes per task.")] = 2,
    timing: Annotated[
        bool, typer.Option(help="Time candidates (rewards 2 and 3 need it).")
    ] = False,
    shared_rft: Annotated[
        bool,
        typer.Option(
            help="One RFT run (the first seed) is every seed's PPO start; --no-shared-rft: one "
            "RFT run per seed."
        ),
    ] = True,
    skip_base: Annotated[bool, typer.Option(help="Skip the base model's evaluation.")] = False,
    device: Annotated[
        str,
        typer.Option(
            help="Where the model generates and trains: cpu, or cuda (a GPU; the kernels are "
            "still built and rewarded by the cpu sandbox backend, so the rewards are the same)."
        ),
    ] = "cpu",
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Seeds whose PPO runs at once, each in its own process (a GPU has room for "
            "several 135M models; on a 2-core CPU keep 1).",
        ),
    ] = 1,
) -> None:
    """Run (or continue) the benchmark: tasks, cold start, base eval, then RFT and PPO per seed."""
    import torch

    torch.set_num_threads(THREADS)
    o = dict(locals())
    o.pop("torch")
    o["work"] = str(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "args.json").write_text(json.dumps(o, indent=1))
    specs = curriculum(families.split(","), heldout_per_family, per_family)
    train, held = _write_tasks(work, specs)
    ecfg = _episode_config(max_turns, max_new_tokens, max_context)
    t0 = time.monotonic()
    kept = coldstart(work, specs, model, ecfg, timing)
    actors: dict[int, Path] = {}
    for s in seed_list(seeds)[:1] if shared_rft else seed_list(seeds):
        actors[s] = run_rft(work, s, kept, held, o, ecfg)
    starts = {s: actors.get(s, actors[min(actors)]) for s in seed_list(seeds)}
    if jobs > 1 and len(starts) > 1:
        run_seeds_in_processes(work, starts, jobs)
    else:
        for s, actor in starts.items():
            run_seed(work, s, actor, train, held, o, ecfg)
    if not skip_base:
        ev = dict(
            ecfg=ecfg,
            temperature=eval_temperature,
            samples=eval_samples,
            timing=timing,
            device=device,
        )
        base = work / "base"
        base.mkdir(exist_ok=True)
        for s in seed_list(seeds)[:1]:  # one model: one evaluation stands for every seed
            evaluate(model, held, base / f"eval-{s}", stage="base", seed=s, ppo_step=0, **ev)
    _log(f"all done in {time.monotonic() - t0:.0f}s (this invocation)")


def ppo_train_curves(work: Path) -> dict[str, list[dict]]:
    """Per seed, the PPO steps' training-side metrics (the train tasks' sampled episodes):
    reward mean, pass rate and the step's wall times, from ``seed-N/ppo/metrics.jsonl``."""
    keys = ("step", "reward_mean", "pass_rate", "rollout_s", "train_s", "step_s", "clipfrac")
    out = {}
    for f in sorted(work.glob("seed-*/ppo/metrics.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        out[f.parent.parent.name] = [{k: r[k] for k in keys if k in r} for r in rows]
    return out


def load_results(work: Path) -> list[StageMetrics]:
    """Every evaluation's metrics line in ``WORK/results.jsonl``."""
    f = work / "results.jsonl"
    if not f.exists():
        return []
    return [msgspec.json.decode(x, type=StageMetrics) for x in f.read_bytes().splitlines() if x]


@app.command()
def report(
    work: Annotated[Path, typer.Option(help="The run's work directory.")] = Path("runs/learning"),
    out: Annotated[Path | None, typer.Option(help="Where summary.json and the plot go.")] = None,
) -> None:
    """Aggregate the results: per stage and PPO step the mean and spread over seeds, the
    acceptance test, a plot of held-out mean reward per seed."""
    rows = load_results(work)
    out = out or work
    out.mkdir(parents=True, exist_ok=True)
    rows = expand_shared(rows)
    summary = {
        "stages": aggregate(rows),
        "acceptance": acceptance(rows),
        "ppo_train": ppo_train_curves(work),
        "args": json.loads((work / "args.json").read_text())
        if (work / "args.json").exists()
        else {},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if out != work:
        shutil.copy(work / "results.jsonl", out / "results.jsonl")
    for g in summary["stages"]:
        print(
            f"{g['stage']:5s} step {g['ppo_step']:2d}: reward {g['reward_mean']:+.3f} "
            f"(std {g['reward_std']:.3f}, per seed {', '.join(f'{v:+.3f}' for v in g['reward_per_seed'])}), "
            f"pass {g['pass_rate']:.2f}"
        )
    print(json.dumps(summary["acceptance"]))
    _plot(rows, out / "learning.png")


def _plot(rows: list[StageMetrics], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    seeds = sorted({r.seed for r in rows})
    for s in seeds:
        rs = [r for r in rows if r.seed == s]
        pts = []
        for r in rs:
            x = {"base": -1, "rft": 0}.get(r.stage, r.ppo_step)
            pts.append((x, r.reward_mean))
        pts = sorted(dict(pts).items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"seed {s}")
    ax.set_xlabel("stage: -1 = base model, 0 = after RFT, N = after N multi-turn PPO steps")
    ax.set_ylabel("held-out mean reward (-1 fail, 1 correct)")
    ax.set_title("SmolLM2-135M, cpu-backend sandbox rewards, held-out tasks")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    app()
