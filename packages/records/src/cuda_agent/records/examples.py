"""Small valid records of every kind, for tests and examples (used by several packages' tests)."""

from cuda_agent.records import (
    Baseline,
    Candidate,
    CompileDetail,
    CorrectnessDetail,
    EvalResult,
    GuardViolation,
    Message,
    Solution,
    Status,
    Task,
    TimingDetail,
    TimingStats,
    ToolCall,
    Trajectory,
    TrialDetail,
)

REF = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4, 4)]

def get_init_inputs():
    return []
"""


def task(i: int = 0) -> Task:
    return Task.make(
        f"ReLU_{i}",
        REF + f"# variant {i}\n",
        source="user",
        level=1,
        ops=["relu"],
        baseline=Baseline(
            device="NVIDIA H200",
            torch_version="2.11.0",
            protocol_version="t1",
            eager=TimingStats(median_ms=1.0, n=30, iqr_ms=0.01),
            compile=TimingStats(median_ms=0.9, n=30),
        ),
    )


def solution(i: int = 0) -> Solution:
    return Solution.make("workdir", {"model_new.py": f"# {i}\n", "kernels/relu.cu": "//"})


def candidate(i: int = 0) -> Candidate:
    return Candidate(task=task(i), solution=solution(i))


def result(i: int = 0, status: Status = Status.OK) -> EvalResult:
    c = candidate(i)
    return EvalResult(
        task_id=c.task.id,
        solution_id=c.solution.id,
        backend="cuda",
        device="NVIDIA H200",
        status=status,
        compile=CompileDetail(ok=True, seconds=1.5),
        correctness=CorrectnessDetail(
            passed=True, atol=1e-2, rtol=1e-2, trials=[TrialDetail(variant="base", passed=True)]
        ),
        guards=[GuardViolation(code="G-TEST", severity="flag", message="m")],
        timing=TimingDetail(
            protocol_version="t1",
            candidate=TimingStats(median_ms=0.5, n=20),
            speedup_vs_eager_ci=(1.9, 2.1),
        ),
        speedup_vs_eager=2.0,
        speedup_vs_compile=1.8,
    )


def trajectory(i: int = 0) -> Trajectory:
    return Trajectory(
        id=f"traj-{i}",
        task=task(i),
        messages=[Message(role="user", content="hi"), Message(role="assistant", content="ok")],
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.1],
        tool_calls=[ToolCall(turn=1, name="Bash", arguments={"command": "ls"}, result="x")],
        solution=solution(i),
        eval_result=result(i),
        stop_reason="submit",
        counters={"turns": 2},
    )
