"""GPU acceptance run of the agent (issue #8); writes JSON into OUT_DIR (default ./gpu-out/agent).

Sections (in the order tiny, scripted; each guarded by the remaining time budget; partial
results are saved after each):
  scripted  the ScriptedPolicy solves a fixture task through the real sandbox: reads, writes a
            kernel + binding + ModelNew in the workdir format, compiles, verifies (PROFILE=1:
            profiles), submits; then a fresh ``sandbox.evaluate`` and the reward. cuda: the sandbox's
            ``gpu_fused`` fixture (fused add-scale-clamp-exp, 8192x8192); cpu: a C++ ReLU.
  tiny      a random-weight tiny Llama (``make_tiny_model``) on the GPU runs EPISODES episodes
            through ``EpisodeRunner`` (lock-step: one batched ``generate`` per turn for all live
            episodes; tools and the final evaluations run one after another) on the
            kernelbench-eval fixture tasks with real sandbox evaluation: episodes per hour,
            where the time goes (generate / tools / eval), peak GPU memory.

  concurrent  WARMUP (1) episode that pays the task's one-off costs (its baselines), then
            CONCURRENT (32) scripted episodes at once (one EpisodeRunner: tools of different
            episodes in parallel, final evaluations through one pool), then SERIAL (4) run one
            at a time with tool_workers=1, in the same call: episodes per hour of both, warm,
            and the ratio (issue #29's goal: 5x). Only when SECTIONS names it.

Usage: python gpu_check.py [OUT_DIR] [BUDGET_S]
Env: BACKEND=cuda|cpu (default cuda), SECTIONS=scripted,tiny, EPISODES (8), MAX_TURNS (4),
MAX_NEW_TOKENS (256), CONCURRENT (32), SERIAL (4), WORKERS_PER_GPU (16: the episodes' pool),
TOOL_WORKERS (CONCURRENT: threads for the concurrent run's tool calls), WARMUP (1: episodes run
first and counted in neither rate), DEVICE (cuda when BACKEND=cuda, else cpu), PROFILE=1 (the
scripted episode also runs utils/profile.py).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PKGS = HERE.parent.parent
GPU_FIX = PKGS / "sandbox" / "tests" / "fixtures" / "gpu_fused"
KB_FIX = PKGS / "kernelbench-eval" / "tests" / "fixtures"
OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-out/agent")
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 180.0
BACKEND = os.environ.get("BACKEND", "cuda")
DEVICE = os.environ.get("DEVICE", "cuda" if BACKEND == "cuda" else "cpu")
SECTIONS = os.environ.get("SECTIONS", "scripted,tiny").split(",")
EPISODES = int(os.environ.get("EPISODES", "8"))
MAX_TURNS = int(os.environ.get("MAX_TURNS", "4"))
MAX_NEW = int(os.environ.get("MAX_NEW_TOKENS", "256"))
PROFILE = os.environ.get("PROFILE", "0") == "1"  # also run utils/profile.py (adds a timing pass)
T0 = time.monotonic()
T0_WALL = int(time.time())
OUT.mkdir(parents=True, exist_ok=True)
REPORT: dict = {
    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    "backend": BACKEND,
    "device": DEVICE,
    "budget_s": BUDGET,
}
TIMING = {"time_cap_s": 3.0, "warmup_max_s": 1.0}


def left() -> float:
    return BUDGET - (time.monotonic() - T0)


def save() -> None:
    REPORT["elapsed_s"] = round(time.monotonic() - T0, 1)
    (OUT / "agent_gpu.json").write_text(json.dumps(REPORT, indent=1, default=str))


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- fixtures
CPU_KERNEL = """extern "C" int relu_launch(float* out, const float* x, long n) {
  for (long i = 0; i < n; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
"""


def scripted_task_and_files():
    """(task, {path: content}) of the fixture the scripted policy solves on BACKEND."""
    from cuda_agent.records import Task

    if BACKEND == "cuda":
        task = Task.make("fused_add_scale_clamp_exp", (GPU_FIX / "model.py").read_text())
        files = {
            "kernels/fused.cu": (GPU_FIX / "kernels" / "fused.cu").read_text(),
            "kernels/fused_binding.cpp": (GPU_FIX / "kernels" / "fused_binding.cpp").read_text(),
            "model_new.py": (GPU_FIX / "model_new.py").read_text(),
        }
        return task, files
    sol = KB_FIX / "solutions" / "level1" / "1_ReLU"
    task = Task.make("ReLU", (KB_FIX / "KernelBench" / "level1" / "1_ReLU.py").read_text(), level=1)
    files = {
        "kernels/relu.cpp": (sol / "kernels" / "relu.cpp").read_text(),
        "kernels/relu_binding.cpp": (sol / "kernels" / "relu_binding.cpp").read_text(),
        "model_new.py": (sol / "model_new.py").read_text(),
    }
    return task, files


def script(files: dict[str, str]) -> list[str]:
    """The scripted assistant turns: look, write, compile, verify, (profile,) submit."""
    from cuda_agent.agent.toolcalls import format_tool_call as fc

    writes = "".join(fc("Write", {"path": p, "content": c}) for p, c in files.items())
    return [
        "I read the skill file and the example kernels first.\n"
        + fc("Read", {"path": "SKILL.md", "limit": 40})
        + fc("Glob", {"pattern": "kernels/*"}),
        "A single fused pass; writing the kernel, its binding and ModelNew.\n" + writes,
        fc("Bash", {"command": "python utils/compile.py"}),
        fc("Bash", {"command": "python utils/verify.py"}),
        *([fc("Bash", {"command": "python utils/profile.py"})] if PROFILE else []),
        "Compiled and verified. " + fc("Submit", {"summary": "one fused kernel"}),
    ]


def tiny_tasks():
    """The kernelbench-eval fixture problems (levels 1-2, valid contracts)."""
    from cuda_agent.records import Task

    out = []
    for rel in (
        "level1/1_ReLU.py",
        "level1/2_Softmax.py",
        "level2/1_Gemm_ReLU.py",
        "level2/2_Scale_Add_Tanh.py",
    ):
        p = KB_FIX / "KernelBench" / rel
        lv = int(rel[5])
        pid = int(p.stem.split("_")[0])
        out.append(Task.make(p.stem, p.read_text(), level=lv, problem_id=pid))
    return out


def env_for(root: Path, workers_per_gpu: int | None = None):
    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.sandbox import SandboxConfig

    more = {} if workers_per_gpu is None else {"workers_per_gpu": workers_per_gpu}
    return SandboxEnv(
        SandboxConfig(backend=BACKEND, timing=True, timing_config=TIMING, tmp_root=None, **more)
    )


def brief_eval(r) -> dict | None:
    if r is None:
        return None
    tm = r.timing
    return {
        "status": str(r.status),
        "message": (r.message or "")[:400],
        "speedup_vs_eager": r.speedup_vs_eager,
        "speedup_vs_compile": r.speedup_vs_compile,
        "candidate_ms": tm.candidate.median_ms if tm and tm.candidate else None,
        "eager_ms": tm.eager.median_ms if tm and tm.eager else None,
        "compile_ms": tm.compile.median_ms if tm and tm.compile else None,
        "stages_s": r.meta.get("stages_s"),
        "guards": [f"{g.code}:{g.severity}" for g in r.guards],
        "device": r.device,
        "seconds": r.seconds,
    }


# ----------------------------------------------------------------------------- sections
def section_scripted(tok) -> None:
    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
    from cuda_agent.agent.policy import ScriptedPolicy
    from cuda_agent.records import encode

    log(f"scripted: ScriptedPolicy on the {BACKEND} backend")
    task, files = scripted_task_and_files()
    ws = Path(tempfile.mkdtemp(prefix="agent-scripted-"))
    ws.chmod(0o755)  # mkdtemp's 0700: agent commands run as another uid under root
    runner = EpisodeRunner(
        ScriptedPolicy(tok, script(files)),
        env_for(ws),
        EpisodeConfig(max_turns=10, bash_timeout=max(60.0, min(300.0, left() - 30))),
        ws,
    )
    t = time.monotonic()
    (tr,) = runner.run([(task, 0)])
    wall = time.monotonic() - t
    (OUT / "scripted.trajectory.jsonl").write_bytes(encode(tr))
    bash = [
        {
            "command": c.arguments.get("command"),
            "ok": c.ok,
            "seconds": c.seconds,
            "tail": c.result[-600:],
        }
        for c in tr.tool_calls
        if c.name == "Bash"
    ]
    REPORT["scripted"] = {
        "task": task.name,
        "stop_reason": tr.stop_reason,
        "turns": tr.counters.get("turns"),
        "tool_calls": tr.counters.get("tool_calls"),
        "tool_failures": tr.counters.get("tool_failures", 0),
        "reward": tr.reward,
        "reward_reason": tr.reward_reason,
        "eval": brief_eval(tr.eval_result),
        "seconds": tr.meta.get("seconds"),
        "wall_s": round(wall, 2),
        "bash": bash,
        "solved": bool(tr.reward is not None and tr.reward >= 1.0),
    }
    ev = REPORT["scripted"]["eval"] or {}
    log(
        f"scripted: stop={tr.stop_reason} status={ev.get('status')} reward={tr.reward} "
        f"x_eager={ev.get('speedup_vs_eager')} x_compile={ev.get('speedup_vs_compile')} "
        f"in {wall:.1f}s"
    )
    save()


def time_split(trs: list) -> dict:
    """Where the episodes' time went: per Bash command and for the final evaluation, the sum
    and median over episodes (s), and the evaluations' stage medians (``meta.stages_s``)."""
    import statistics

    per: dict[str, list[float]] = {}
    for t in trs:
        for c in t.tool_calls:
            if c.name == "Bash":
                per.setdefault(str(c.arguments.get("command")), []).append(c.seconds)
        for k, v in (t.meta.get("seconds") or {}).items():  # generate_s, tool_<Name>_s, eval_s
            if isinstance(v, int | float):
                per.setdefault(k, []).append(float(v))
    out = {
        k: {"sum": round(sum(v), 1), "median": round(statistics.median(v), 2)}
        for k, v in per.items()
    }
    stages: dict[str, list[float]] = {}
    for t in trs:
        meta = t.eval_result.meta if t.eval_result else {}
        # the wait for a device worker is not a stage: the pool records it as meta.queued_s
        st = {**(meta.get("stages_s") or {}), "device_queue": meta.get("queued_s")}
        for k, v in st.items():
            if isinstance(v, int | float):
                stages.setdefault(k, []).append(float(v))
    out["eval_stages_median"] = {k: round(statistics.median(v), 2) for k, v in stages.items()}
    return out


class CountingEnv:
    """``env`` (a ``SandboxEnv``) with its final evaluations counted: how many were submitted
    and finished, and when (seconds from ``t0``)."""

    def __init__(self, env, t0: float):
        self._env, self._t0 = env, t0
        self._submitted: list[float] = []
        self._finished: list[float] = []

    def __getattr__(self, name: str):
        return getattr(self._env, name)

    def submit(self, candidate):
        self._submitted.append(time.monotonic() - self._t0)
        fut = self._env.submit(candidate)
        fut.add_done_callback(lambda f: self._finished.append(time.monotonic() - self._t0))
        return fut

    def progress(self) -> dict:
        sub, fin = list(self._submitted), sorted(self._finished)
        return {
            "evaluations_submitted": len(sub),
            "first_submitted_s": round(min(sub), 1) if sub else None,
            "evaluations_finished": len(fin),
            "finished_at_s": [round(x, 1) for x in fin],
        }


class UniqueSourcesScript:
    """The scripted turns, with each episode's C++/CUDA sources made unique by a comment (as
    different episodes' kernels are in training), so that no episode's compile is a cache hit."""

    def __init__(self, tokenizer, files: dict[str, str], run: str):
        self.tokenizer, self.name, self.files, self.run = tokenizer, "scripted", files, run
        self._by_key: dict = {}
        self._last_turn: float | None = None

    def last_turn_s(self, t0: float) -> float | None:
        """Seconds from ``t0`` to the last turn generated (None: none yet)."""
        return None if self._last_turn is None else round(self._last_turn - t0, 1)

    def generate(self, contexts, max_new_tokens, keys=None):
        from cuda_agent.agent.policy import ScriptedPolicy

        self._last_turn = time.monotonic()
        out = []
        for i, ctx in enumerate(contexts):
            key = keys[i] if keys is not None else i
            if key not in self._by_key:
                # the process and its start in the mark too: a cache kept from an earlier
                # check on the same machine holds no build of these sources either
                mark = f"\n// episode {self.run}-{key} of {os.getpid()}@{T0_WALL}\n"
                files = {
                    p: t + mark if p.endswith((".cu", ".cpp")) else t for p, t in self.files.items()
                }
                self._by_key[key] = ScriptedPolicy(self.tokenizer, script(files))
            out += self._by_key[key].generate([ctx], max_new_tokens, keys=[0])
        return out


def section_concurrent(tok) -> None:
    """CONCURRENT (32) scripted episodes in one ``EpisodeRunner`` (tools of different episodes
    in parallel, final evaluations through one pool) against SERIAL (4) episodes run one at a
    time with ``tool_workers=1`` (the serial path), in the same call: episodes per hour each."""
    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner

    n = int(os.environ.get("CONCURRENT", "32"))
    n_serial = int(os.environ.get("SERIAL", "4"))
    # device workers of the episodes' shared pool: the final evaluations of a batch's episodes
    # are submitted together, so the pool's default (2 per GPU) would evaluate 32 two at a time
    wpg = int(os.environ.get("WORKERS_PER_GPU", "16"))
    n_warmup = int(os.environ.get("WARMUP", "1"))
    tool_workers = int(os.environ.get("TOOL_WORKERS", str(n)))
    task, files = scripted_task_and_files()
    out: dict = {
        "task": task.name,
        "backend": BACKEND,
        "unique_sources": True,
        "workers_per_gpu": wpg,
        "tool_workers": tool_workers,
        "warmup": n_warmup,
    }
    REPORT["concurrent"] = out

    def episodes(jobs: list, tool_workers: int, run: str) -> tuple[list | None, float]:
        """The episodes of ``jobs`` in one runner; (None, wall) when the budget ends first, with
        how far they got in ``out[run]`` (turns, evaluations submitted and done, when)."""
        ws = Path(tempfile.mkdtemp(prefix="agent-concurrent-"))
        ws.chmod(0o755)
        cfg = EpisodeConfig(max_turns=10, tool_workers=tool_workers, bash_timeout=300.0)
        policy = UniqueSourcesScript(tok, files, run)
        t = time.monotonic()
        done: list = []
        sandbox_env = env_for(ws, wpg)
        env = CountingEnv(sandbox_env, t)
        th = threading.Thread(
            target=lambda: done.append(EpisodeRunner(policy, env, cfg, ws).run(jobs)),
            daemon=True,
        )
        th.start()
        th.join(timeout=max(1.0, left() - 10))
        if th.is_alive():  # a cut run still says where its time went; main() exits at once
            out[run] = {
                "unfinished": True,
                "episodes": len(jobs),
                "elapsed_s": round(time.monotonic() - t, 1),
                "last_turn_s": policy.last_turn_s(t),
                **env.progress(),
            }
            REPORT["unfinished"] = True
            log(f"concurrent: {run} unfinished: {out[run]}")
            save()
            return None, time.monotonic() - t
        sandbox_env.close()
        return done[0], time.monotonic() - t

    def summary(trs: list, wall: float) -> dict:
        return {
            "episodes": len(trs),
            "wall_s": round(wall, 1),
            "episodes_per_hour": round(3600 * len(trs) / wall, 1),
            "solved": sum(bool(t.reward is not None and t.reward >= 1.0) for t in trs),
            "statuses": sorted(
                {str(t.eval_result.status if t.eval_result else t.stop_reason) for t in trs}
            ),
            "time_split_s": time_split(trs),
        }

    # a warm-up episode first, counted in neither rate: it pays what a training run pays once per
    # task (the task's baselines, the trusted cache's precompiled prelude), so both runs below
    # are measured warm, as an RL step after a task's first visit is
    if n_warmup:
        trs, wall = episodes([(task, 1000 + k) for k in range(n_warmup)], 1, "warmup")
        if trs is None:
            return
        out["warmup_run"] = summary(trs, wall)
        log(f"concurrent: warm-up {out['warmup_run']}")
        save()
    trs, wall = episodes([(task, k) for k in range(n)], tool_workers, "concurrent")
    if trs is None:
        return
    out["concurrent"] = summary(trs, wall)
    log(f"concurrent: {out['concurrent']}")
    save()
    serial_trs, serial_wall = [], 0.0
    for k in range(n_serial):
        if left() < 60:
            break
        trs, wall = episodes([(task, k)], 1, f"serial{k}")
        if trs is None:
            break
        serial_trs += trs
        serial_wall += wall
    if serial_trs:
        out["serial"] = summary(serial_trs, serial_wall)
        out["ratio"] = round(
            out["concurrent"]["episodes_per_hour"] / out["serial"]["episodes_per_hour"], 2
        )
    log(f"concurrent: serial {out.get('serial')}, ratio {out.get('ratio')}")
    save()


class MemSampler:
    """Peak device memory in use (all processes, NVML) sampled every 50 ms."""

    def __init__(self):
        self.peak_mib = 0.0
        self.ok = False
        self._stop = threading.Event()
        from cuda_agent.profiler.nvml import Sampler

        self._gpu = Sampler(0)
        used = self._gpu.memory_bytes("used")
        self.ok = used is not None  # no NVML (the cpu run): report nothing
        self.base_mib = (used or 0) / 2**20

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            used = (self._gpu.memory_bytes("used") or 0) / 2**20
            self.peak_mib = max(self.peak_mib, used)

    def __enter__(self):
        if self.ok:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        if self.ok:
            self._t.join()


def section_tiny() -> None:
    import torch

    from cuda_agent.agent.episode import EpisodeConfig, EpisodeRunner
    from cuda_agent.agent.models import make_tiny_model
    from cuda_agent.agent.policy import HFPolicy
    from cuda_agent.records import encode

    log(f"tiny: {EPISODES} episodes of a random-weight tiny Llama on {DEVICE}")
    mdir = make_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-")), seed=0, max_positions=32768)
    policy = HFPolicy.load(str(mdir), device=DEVICE, temperature=1.0, seed=0)
    policy.name = "hf:tiny-random"
    if DEVICE.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    tasks = tiny_tasks()
    jobs = [(tasks[k % len(tasks)], k // len(tasks)) for k in range(EPISODES)]
    ws = Path(tempfile.mkdtemp(prefix="agent-tiny-"))
    ws.chmod(0o755)  # mkdtemp's 0700: agent commands run as another uid under root
    cfg = EpisodeConfig(
        max_turns=MAX_TURNS,
        max_new_tokens=MAX_NEW,
        max_context_tokens=32768,
        bash_timeout=60.0,
    )
    runner = EpisodeRunner(policy, env_for(ws), cfg, ws)
    t = time.monotonic()
    with MemSampler() as mem:
        trs = runner.run(jobs)
    wall = time.monotonic() - t
    (OUT / "tiny.trajectories.jsonl").write_bytes(b"".join(encode(x) for x in trs))
    split: dict[str, float] = {}
    for x in trs:
        for k, v in (x.meta.get("seconds") or {}).items():
            key = "tools_s" if k.startswith("tool_") else k
            split[key] = split.get(key, 0.0) + float(v)
    eval_stages: dict[str, float] = {}
    for x in trs:
        for k, v in ((x.eval_result.meta.get("stages_s") if x.eval_result else None) or {}).items():
            eval_stages[k] = round(eval_stages.get(k, 0.0) + float(v), 3)
    statuses: dict[str, int] = {}
    for x in trs:
        s = str(x.eval_result.status) if x.eval_result else "not_evaluated"
        statuses[s] = statuses.get(s, 0) + 1
    rollout_s = split.get("generate_s", 0.0) + split.get("tools_s", 0.0)
    REPORT["tiny"] = {
        "episodes": len(trs),
        "concurrency": (
            "lock-step: one batched HF generate per turn over all live episodes; "
            "tool calls run one after another inside a turn; final sandbox evaluations run "
            "sequentially after all episodes stop"
        ),
        "model": {
            "kind": "random-weight Llama (make_tiny_model)",
            "params": sum(p.numel() for p in policy.model.parameters()),
            "dtype": str(next(policy.model.parameters()).dtype),
        },
        "config": {"max_turns": MAX_TURNS, "max_new_tokens": MAX_NEW, "tasks": len(tasks)},
        "wall_s": round(wall, 2),
        "episodes_per_hour": round(len(trs) / wall * 3600, 1) if wall > 0 else None,
        "episodes_per_hour_without_eval": (
            round(len(trs) / (wall - split.get("eval_s", 0.0)) * 3600, 1)
            if wall > split.get("eval_s", 0.0)
            else None
        ),
        "time_split_s": {k: round(v, 2) for k, v in sorted(split.items())},
        "time_split_note": (
            "generate_s: each batched generate's wall time shared equally among the episodes "
            "in it (sum = generate wall time); tools_s: sum of tool calls; eval_s: sum of the "
            "final sandbox evaluations (sequential)"
        ),
        "rollout_s": round(rollout_s, 2),
        "eval_stages_s": eval_stages,
        "stop_reasons": {
            r: sum(1 for x in trs if x.stop_reason == r) for r in {x.stop_reason for x in trs}
        },
        "eval_status": statuses,
        "rewards": [x.reward for x in trs],
        "turns": [x.counters.get("turns", 0) for x in trs],
        "policy_tokens": sum(x.counters.get("policy_tokens", 0) for x in trs),
        "prompt_tokens": [x.counters.get("prompt_tokens", 0) for x in trs],
        "schema_violations": sum(x.counters.get("schema_violations", 0) for x in trs),
        "tool_calls": sum(x.counters.get("tool_calls", 0) for x in trs),
        "peak_gpu_mem_mib": {
            "policy_torch_max_allocated": (
                round(torch.cuda.max_memory_allocated() / 2**20, 1)
                if DEVICE.startswith("cuda")
                else None
            ),
            "device_used_peak_nvml": round(mem.peak_mib, 1) if mem.ok else None,
            "device_used_before_nvml": round(mem.base_mib, 1) if mem.ok else None,
        },
    }
    gen_tok_s = (
        REPORT["tiny"]["policy_tokens"] / split["generate_s"] if split.get("generate_s") else None
    )
    REPORT["tiny"]["generated_tokens_per_s"] = round(gen_tok_s, 1) if gen_tok_s else None
    log(
        f"tiny: {len(trs)} episodes in {wall:.1f}s ({REPORT['tiny']['episodes_per_hour']}/h); "
        f"split {REPORT['tiny']['time_split_s']}; status {statuses}"
    )
    save()


def main() -> None:
    from cuda_agent.agent.models import load_tokenizer, make_tiny_model

    save()
    tok = load_tokenizer(make_tiny_model(Path(tempfile.mkdtemp(prefix="tok-")), seed=0))
    # tiny first: short and predictable; the scripted episode (cold nvcc build, torch.compile
    # baseline) then has the rest of the budget
    plan = [("tiny", section_tiny, 30), ("scripted", lambda: section_scripted(tok), 60)]
    plan.append(("concurrent", lambda: section_concurrent(tok), 120))
    for name, fn, need in plan:
        if name not in SECTIONS:
            continue
        if left() < need:
            REPORT.setdefault("skipped", []).append(f"{name}: {left():.0f}s left < {need}s")
            log(f"skip {name}: {left():.0f}s left")
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - record and go on to the next section
            REPORT[name] = {
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(),
            }
            log(f"{name} failed: {type(e).__name__}: {e}")
        save()
    save()
    log(f"done in {time.monotonic() - T0:.1f}s -> {OUT / 'agent_gpu.json'}")
    if REPORT.get("unfinished"):  # episodes still running: do not wait for their pool at exit
        sys.stdout.flush()
        os._exit(3)


if __name__ == "__main__":
    main()
