"""GRPO with TRL on kernel tasks: the sandbox's verdicts as the reward.

    # a few steps with a tiny random-weight model on the cpu backend (minutes on 2 cores)
    uv sync --extra trl
    uv run python packages/adapters/examples/trl_grpo.py --model tiny --backend cpu
    # multi-turn: the model works in agent workspaces through tools (TRL's environment_factory)
    uv run python packages/adapters/examples/trl_grpo.py --model tiny --backend cpu --mode multi-turn
    # any local Hugging Face checkpoint directory, your tasks, on a GPU
    uv run python packages/adapters/examples/trl_grpo.py --model /models/qwen2.5-coder-7b \\
        --tasks tasks.jsonl --backend cuda --steps 50 --num-generations 8 --max-completion-length 4096
    # evaluation by a running `kernel-service serve` (token in $CUDA_AGENT_SERVICE_TOKEN)
    uv run python packages/adapters/examples/trl_grpo.py --model tiny --service http://127.0.0.1:8470

Writes ``OUT/results.jsonl`` (one ``eval_result`` record per evaluated completion, reward filled)
and prints the reward of each step. A random-weight model writes no working kernel: with
``--model tiny`` every reward is the failure reward and the run shows the plumbing, not learning.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from cuda_agent.records import Task

RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a local checkpoint dir")
    ap.add_argument("--tasks", help="tasks JSONL (default: one ReLU task)")
    ap.add_argument("--mode", choices=["single-turn", "multi-turn"], default="single-turn")
    ap.add_argument("--backend", default="auto", help="cuda | cpu | auto")
    ap.add_argument("--service", help="URL of a kernel-service (default: a local sandbox pool)")
    ap.add_argument("--guard-policy", default="strict", choices=["strict", "kernelbench", "off"])
    ap.add_argument("--no-skill", action="store_true", help="a short system prompt, no SKILL.md")
    ap.add_argument("--no-timing", action="store_true", help="correctness only (reward <= 1)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=256)
    ap.add_argument("--max-tool-calls", type=int, default=8, help="multi-turn: tool rounds")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto")
    ap.add_argument("--out", default="runs/trl_grpo")
    return ap.parse_args(argv)


def _model(spec: str, out: Path, mode: str):
    """(model, tokenizer) for ``spec``; the tiny model gets Qwen2.5's chat template (shipped with
    TRL) in multi-turn mode, since TRL needs a template it can parse tool calls of."""
    from cuda_agent.agent.models import load_causal_lm, load_tokenizer, make_tiny_model

    if spec == "tiny":
        path = out / "tiny-model"
        if not (path / "config.json").exists():
            make_tiny_model(path, seed=0)
        if mode == "multi-turn":
            import trl

            tok = load_tokenizer(str(path))
            template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
            tok.chat_template = template.read_text()
            tok.save_pretrained(path)
        spec = str(path)
    tok = load_tokenizer(spec)
    tok.padding_side = "left"
    return load_causal_lm(spec), tok


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from cuda_agent.adapters.trl import (
        KernelReward,
        ServiceEvaluator,
        WorkspaceEnvFactory,
        build_dataset,
    )
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.sandbox import SandboxConfig, SandboxPool
    from cuda_agent.sandbox.config import resolve_backend

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = a.tasks or [Task.make("relu", RELU)]
    cfg = SandboxConfig(backend=a.backend, guard_policy=a.guard_policy, timing=not a.no_timing)
    pool = env = service = None
    if a.service:
        service = ServiceEvaluator(a.service)
        backend = service.backend
    else:
        backend = resolve_backend(a.backend)
        pool = SandboxPool(cfg.with_(backend=backend))
        env = SandboxEnv(pool.config, pool=pool)
    dataset = build_dataset(
        tasks,
        mode=a.mode,
        backend=backend,
        guard_policy=a.guard_policy,
        include_skill=not a.no_skill,
    )
    model, tok = _model(a.model, out, a.mode)
    results = out / "results.jsonl"
    extra = {}
    if a.mode == "single-turn":
        reward = KernelReward(service or pool, results_path=results)
    else:
        # local workspaces go where the sandbox's unprivileged uids can reach them
        workdir = Path(tempfile.mkdtemp(prefix="trl-ws-", dir=tempfile.gettempdir()))
        workdir.chmod(0o711)
        envs = (
            WorkspaceEnvFactory.over_service(service)
            if service
            else WorkspaceEnvFactory.local(env, workdir)
        )
        reward = envs.reward(results_path=results)
        extra["environment_factory"] = envs
    use_cpu = a.device == "cpu" or (a.device == "auto" and not _cuda())
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=a.steps,
        per_device_train_batch_size=a.num_generations,
        num_generations=a.num_generations,
        max_completion_length=a.max_completion_length,
        max_tool_calling_iterations=a.max_tool_calls,
        temperature=a.temperature,
        learning_rate=a.lr,
        use_cpu=use_cpu,
        bf16=not use_cpu,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        **extra,
    )
    try:
        trainer.train()
    finally:
        reward.close()
        if "environment_factory" in extra:
            extra["environment_factory"].close()
        if pool is not None:
            pool.close()
        if service is not None:
            service.close()
    name = reward.__name__
    for rec in trainer.state.log_history:
        if f"rewards/{name}/mean" in rec:
            print(
                f"step {rec['step']}: reward {rec[f'rewards/{name}/mean']:+.3f} "
                f"(std {rec[f'rewards/{name}/std']:.3f}), evaluated {rec[f'{name}/evaluated']:.0%}, "
                f"ok {rec[f'{name}/ok']:.0%}"
            )
    print(f"results: {results}", file=sys.stderr)
    return 0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    raise SystemExit(main())
