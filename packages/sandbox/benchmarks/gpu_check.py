"""GPU acceptance run of the sandbox (writes JSON + Markdown into OUT_DIR).

Sections (each guarded by the remaining time budget):
  A  a workdir and a kernelbench candidate of the same fused task: both pass, timed, speed-ups
  B  compile time: ours cold (no PCH / PCH ready / PCH and binding.cpp ready: the issue's cold
     case) and warm (.cu changed), with per-unit and link seconds, vs
     torch.utils.cpp_extension.load of the same sources; load_inline plain vs our cached path
  C  fault suite on cuda in one eval stream: illegal address, never-ending kernel, GPU OOM, valid
  D  throughput on a batch of mixed candidates, time split by stage
Usage: python gpu_check.py OUT_DIR [BUDGET_S]
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIX = HERE.parent / "tests" / "fixtures" / "gpu_fused"
OUT = Path(sys.argv[1])
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 420.0
T0 = time.monotonic()
OUT.mkdir(parents=True, exist_ok=True)
COMPLETE: dict[str, bool] = {}  # run_eval name -> every candidate finished
REPORT: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
TCFG = json.dumps({"time_cap_s": 3.0, "warmup_max_s": 1.0})


def _gpus_used(rows: list[dict]) -> int:
    """The GPUs that ran any of ``rows`` (their device worker labels), at least 1."""
    return max(
        1, len({str(w) for r in rows if (w := (r.get("meta") or {}).get("worker")) is not None})
    )


def left() -> float:
    return BUDGET - (time.monotonic() - T0)


def save() -> None:
    (OUT / "sandbox_gpu.json").write_text(json.dumps(REPORT, indent=1, default=str))


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


from cuda_agent.records import Candidate, Solution, Task  # noqa: E402
from cuda_agent.records.jsonl import encode  # noqa: E402

TASK = Task.make("fused_add_scale_clamp_exp", (FIX / "model.py").read_text(), source="user")
WD_FILES = {
    "model_new.py": (FIX / "model_new.py").read_text(),
    "kernels/fused.cu": (FIX / "kernels" / "fused.cu").read_text(),
    "kernels/fused_binding.cpp": (FIX / "kernels" / "fused_binding.cpp").read_text(),
}
KB_SRC = (FIX / "kb_model_new.py").read_text()


def wd(**changes: str) -> Candidate:
    f = dict(WD_FILES)
    f.update(changes)
    return Candidate(task=TASK, solution=Solution.make("workdir", f))


def kb(src: str) -> Candidate:
    return Candidate(task=TASK, solution=Solution.make("kernelbench", {"model_new.py": src}))


def run_eval(name: str, cands: list[Candidate], extra: list[str], timeout: float) -> list[dict]:
    inp = OUT / f"{name}.cands.jsonl"
    inp.write_bytes(b"".join(encode(c) for c in cands))
    res = OUT / f"{name}.results.jsonl"
    if res.exists():
        res.unlink()
    cmd = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.cli",
        "eval",
        str(inp),
        "-o",
        str(res),
        "--backend",
        "cuda",
        "--gpus",
        "all",
        "--timing-config",
        TCFG,
        *extra,
    ]
    t = time.monotonic()
    err = OUT / f"{name}.stderr.txt"
    with open(err, "w") as fh:
        # own session: on the deadline the whole eval (its workers, their jails) is stopped, and
        # the results it wrote so far are kept (written as each finishes)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True)
        try:
            rc = p.wait(timeout=max(30, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            rc = "deadline"
    log(f"{name}: rc={rc} in {time.monotonic() - t:.1f}s")
    rows = (
        [json.loads(x) for x in res.read_text().splitlines() if x.strip()] if res.exists() else []
    )
    COMPLETE[name] = rc == 0 and len(rows) == len(cands)
    return rows


def brief(r: dict) -> dict:
    tm = r.get("timing") or {}
    return {
        "status": r["status"],
        "message": r["message"][:300],
        "compile_s": (r.get("compile") or {}).get("seconds"),
        "candidate_ms": (tm.get("candidate") or {}).get("median_ms"),
        "eager_ms": (tm.get("eager") or {}).get("median_ms"),
        "compile_ms": (tm.get("compile") or {}).get("median_ms"),
        "speedup_vs_eager": r.get("speedup_vs_eager"),
        "speedup_vs_compile": r.get("speedup_vs_compile"),
        # the reward decides on the interval's lower ends; a wide baseline shows in its IQR
        "speedup_ci": {
            "eager": tm.get("speedup_vs_eager_ci"),
            "compile": tm.get("speedup_vs_compile_ci"),
        },
        "spread_ms": {
            side: {k: (tm.get(side) or {}).get(k) for k in ("min_ms", "iqr_ms", "n")}
            for side in ("candidate", "eager", "compile")
        },
        "protocol": tm.get("protocol_version"),
        "stages_s": (r.get("meta") or {}).get("stages_s"),
        "isolation": (r.get("meta") or {}).get("isolation"),
        "guards": [g["code"] + ":" + g["severity"] for g in r.get("guards", [])],
        "seconds": r.get("seconds"),
        "worker": (r.get("meta") or {}).get("worker"),
        "overlapped": (r.get("meta") or {}).get("overlapped"),
        "rerun_alone": ((r.get("meta") or {}).get("rerun_alone") or {}).get("why"),
    }


def section_a() -> None:
    log("A: workdir + kernelbench candidates of the same task")
    rows = run_eval("A", [wd(), kb(KB_SRC)], [], left() - 60)
    REPORT["A"] = [brief(r) for r in rows]
    if any(r["status"] == "guard_violation" for r in rows):
        rows = run_eval("A_guards_off", [wd(), kb(KB_SRC)], ["--guard-policy", "off"], left() - 60)
        REPORT["A_guards_off"] = [brief(r) for r in rows]
    save()


def _timed(
    cmd: list[str], env: dict | None = None, cwd: str | None = None, timeout: float = 300
) -> tuple[float, int, str]:
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    return time.monotonic() - t, p.returncode, (p.stdout + p.stderr)[-1500:]


def _unit_s(r) -> dict:
    return {u["file"]: ("cached" if u["cached"] else u["seconds"]) for u in r.units}


def _facts(r) -> dict:
    """Wall seconds, outcome and per-unit compile seconds of one build (and its link)."""
    return {
        "seconds": round(r.seconds, 2),
        "ok": r.ok,
        "pch": r.pch,
        "link_s": round(r.link_seconds, 2),
        "link_stubs": r.link_stubs,
        "units": r.units,
        "log": r.log[-800:] if not r.ok else "",
    }


def section_b() -> None:
    log("B: compile times")
    from cuda_agent.sandbox.build import ObjectCache, build_workdir, ensure_pch
    from cuda_agent.sandbox.isolation import Limits
    from cuda_agent.sandbox.toolchain import (
        cuda_home,
        device_capability,
        flags_for,
        torch_arch_list,
    )
    from cuda_agent.sandbox.workspace import materialise

    b: dict = {}
    arch = torch_arch_list(device_capability() or (9, 0))
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=arch, MAX_JOBS=str(os.cpu_count() or 8))
    if "CUDA_HOME" not in env and cuda_home():  # the toolkit ours uses (torch may guess another)
        env["CUDA_HOME"] = str(cuda_home())
    root = Path(tempfile.mkdtemp(prefix="cbench-"))
    os.chmod(root, 0o755)  # our kernelbench cache lives under it: the sandbox's user must reach it
    # warm: an edit of a kernel's body (what an agent's iterations mostly are; a comment alone
    # would change nothing but line markers), and one of the launcher (host code)
    cu0 = WD_FILES["kernels/fused.cu"]
    cu2 = cu0.replace("-3.0f), 3.0f)", "-3.5f), 3.5f)")
    # host code that cudafe++ does not normalise away (redundant parentheses it would)
    cu3 = cu0.replace(
        "blocks > 132 * 16) blocks = 132 * 16", "blocks > 132 * 12) blocks = 132 * 12"
    )
    assert cu2 != cu0 and cu3 != cu0
    REPORT["B"] = b  # saved after every measurement: a section cut at its limit keeps what it has
    if os.environ.get("B_ONLY_INLINE"):
        _b_inline(b, env, root)
        return
    b["linker"] = flags_for("cuda").linker
    log(
        f"  linker for cuda modules: {b['linker']} (CUDA_AGENT_LINKER={os.environ.get('CUDA_AGENT_LINKER')})"
    )
    # first torch.utils.cpp_extension.load of the same sources, cold then warm (.cu changed, same
    # build directory): the baseline every ratio needs
    lw = root / "load_ws"
    c = wd()
    materialise(c.task, c.solution, lw, "cuda")
    bdir = root / "load_build"
    bdir.mkdir()
    # the whole process (interpreter, import torch, load) and, printed by it, the load() call
    # alone (torch already imported: the stricter comparison, as ours is timed in-process)
    code = (
        "import sys, time, torch, torch.utils.cpp_extension as ce\n"
        "t = time.monotonic()\n"
        f"ce.load(name='cuda_extension', sources=['{lw}/binding.cpp', '{lw}/kernels/fused_binding.cpp', '{lw}/kernels/fused.cu'],"
        f" build_directory='{bdir}', extra_include_paths=['{lw}'], verbose=False)\n"
        "print(f'LOAD_CALL_S={time.monotonic() - t:.3f}')\n"
    )

    def load_facts(s: float, rc: int, tail: str) -> dict:
        m = re.search(r"LOAD_CALL_S=([0-9.]+)", tail)
        return {
            "seconds": round(s, 2),
            "load_call_s": float(m.group(1)) if m else None,
            "rc": rc,
            "tail": tail if rc else "",
        }

    b["torch_load_cold"] = load_facts(*_timed([sys.executable, "-c", code], env=env))
    (lw / "kernels" / "fused.cu").chmod(0o644)
    (lw / "kernels" / "fused.cu").write_text(cu2)
    b["torch_load_warm_cu_changed"] = load_facts(*_timed([sys.executable, "-c", code], env=env))
    log(
        f"  torch load cold {b['torch_load_cold']['seconds']}s warm {b['torch_load_warm_cu_changed']['seconds']}s"
    )
    save()
    # ours, fresh object cache, with the (separately timed, once per machine) PCH, then without
    order = (("ours_cold_pch_ready", True), ("ours_cold_no_pch", False))
    for label, pch in order[: 1 if os.environ.get("B_SKIP_NOPCH", "0") == "1" else 2]:
        cache = ObjectCache(root / f"cache_{label}")
        if pch:  # the precompiled prelude is built once per machine: time it on its own
            t = time.monotonic()
            _, note = ensure_pch(cache, flags_for("cuda"), Limits())
            b["pch_build_once"] = {"seconds": round(time.monotonic() - t, 2), "note": note}
        c = wd()
        w = materialise(c.task, c.solution, root / f"w_{label}", "cuda")
        r = build_workdir(w, w / "build", backend="cuda", cache=cache, jobs=8, pch=pch)
        b[label] = _facts(r)
        log(f"  {label}: {r.seconds:.1f}s ok={r.ok} units={_unit_s(r)}")
        if label == "ours_cold_pch_ready":
            # the cold case: infrastructure (prelude + binding.cpp) built once per machine
            # by an earlier candidate, this one brings a new .cu and a new _binding.cpp
            c1 = wd(
                **{
                    # new host and device code: nothing of this .cu is in the cache
                    "kernels/fused.cu": cu0.replace(
                        "blocks > 132 * 16) blocks = 132 * 16", "blocks > 132 * 8) blocks = 132 * 8"
                    ).replace("-3.0f), 3.0f)", "-3.25f), 3.25f)"),
                    "kernels/fused_binding.cpp": WD_FILES["kernels/fused_binding.cpp"]
                    + "\n// cold\n",
                }
            )
            w1 = materialise(c1.task, c1.solution, root / "w_cold_infra", "cuda")
            r1 = build_workdir(w1, w1 / "build", backend="cuda", cache=cache, jobs=8, pch=pch)
            b["ours_cold_infra_ready"] = _facts(r1)
            log(f"  ours_cold_infra_ready: {r1.seconds:.1f}s ok={r1.ok} units={_unit_s(r1)}")
            c2 = wd(**{"kernels/fused.cu": cu2})
            w2 = materialise(c2.task, c2.solution, root / "w_warm", "cuda")
            r2 = build_workdir(w2, w2 / "build", backend="cuda", cache=cache, jobs=8, pch=pch)
            b["ours_warm_cu_changed"] = _facts(r2)
            log(f"  ours_warm_cu_changed: {r2.seconds:.1f}s ok={r2.ok} units={_unit_s(r2)}")
            c3 = wd(**{"kernels/fused.cu": cu3})
            w3 = materialise(c3.task, c3.solution, root / "w_warm_launcher", "cuda")
            r3 = build_workdir(w3, w3 / "build", backend="cuda", cache=cache, jobs=8, pch=pch)
            b["ours_warm_launcher_changed"] = _facts(r3)
            log(f"  ours_warm_launcher_changed: {r3.seconds:.1f}s units={_unit_s(r3)}")
            # the same kernel-body edit with nvcc run whole (before the split of its steps)
            os.environ["CUDA_AGENT_NVCC_SPLIT"] = "0"
            try:
                c4 = wd(**{"kernels/fused.cu": cu0.replace("-3.0f), 3.0f)", "-2.5f), 2.5f)")})
                w4 = materialise(c4.task, c4.solution, root / "w_warm_whole", "cuda")
                r4 = build_workdir(w4, w4 / "build", backend="cuda", cache=cache, jobs=8, pch=pch)
            finally:
                os.environ.pop("CUDA_AGENT_NVCC_SPLIT")
            b["ours_warm_cu_changed_nvcc_whole"] = _facts(r4)
            log(f"  ours_warm_cu_changed_nvcc_whole: {r4.seconds:.1f}s units={_unit_s(r4)}")
        save()
    # the PCH build itself (one-time)
    pch_note = [u for u in (REPORT.get("A_pch") or [])]
    b["pch_build_note"] = pch_note
    ratios = {}
    for ours, theirs in (
        ("ours_cold_infra_ready", "torch_load_cold"),
        ("ours_cold_pch_ready", "torch_load_cold"),
        ("ours_warm_cu_changed", "torch_load_warm_cu_changed"),
        ("ours_warm_launcher_changed", "torch_load_warm_cu_changed"),
        ("ours_warm_cu_changed_nvcc_whole", "torch_load_warm_cu_changed"),
        ("ours_warm_cu_changed", "ours_warm_cu_changed_nvcc_whole"),
        ("ours_warm_cu_changed", "torch_load_cold"),
    ):
        a, t = b.get(ours) or {}, b.get(theirs) or {}
        if a.get("ok") and (t.get("rc") == 0 or t.get("ok")) and a.get("seconds"):
            ratios[f"{theirs}/{ours}"] = round(t["seconds"] / a["seconds"], 2)
            if t.get("load_call_s"):  # load() alone, torch already imported
                ratios[f"{theirs}[load call]/{ours}"] = round(t["load_call_s"] / a["seconds"], 2)
    b["speedups"] = ratios
    log(f"  speed-ups: {ratios}")
    save()
    if left() < 150 or os.environ.get("B_NO_INLINE"):
        REPORT["B"] = b
        return
    _b_inline(b, env, root)


def _kb_diagnosis(p) -> dict:
    """What the compile stage left behind when it saw no build: its files, report, the module it
    imported, and the same op run again unconfined (as this process's user)."""
    d: dict = {}
    root = Path(p.root)
    d["files"] = sorted(str(x.relative_to(root)) for x in root.rglob("*"))[:80]
    for rel in ("tmp_compile/compile.report.json", "compile.spec.json"):
        f = root / rel
        d[rel] = f.read_text()[:3000] if f.exists() else None
    mn = Path(p.work) / "model_new.py"
    d["model_new_head"] = mn.read_text()[:400] if mn.exists() else None
    spec = root / "compile.spec.json"
    if spec.exists():
        sp = json.loads(spec.read_text())
        sp["report"] = str(root / "diag.report.json")
        (root / "diag.spec.json").write_text(json.dumps(sp))
        r = subprocess.run(
            [sys.executable, "-m", "cuda_agent.sandbox.runner", str(root / "diag.spec.json")],
            cwd=p.work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        d["unconfined_rc"] = r.returncode
        d["unconfined_stderr"] = r.stderr[-2000:]
        rep = root / "diag.report.json"
        d["unconfined_report"] = rep.read_text()[:3000] if rep.exists() else None
    return d


def _b_inline(b: dict, env: dict, root: Path) -> None:
    """load_inline: plain (fresh TORCH_EXTENSIONS_DIR) vs ours (content-keyed cache), cold and
    warm; each of ours says which builds its compile stage saw (an empty list: no build ran there).
    B_INLINE_ROUNDS=N (default 1) adds cold pairs of new sources, the order alternating per round
    (round 0 plain first), so neither side always gets the warmer page cache."""
    from cuda_agent.sandbox.config import SandboxConfig
    from cuda_agent.sandbox.evaluate import prepare

    cfg = SandboxConfig(backend="cuda", cache_dir=str(root / "kbcache"), guard_policy="off")

    def plain(src: str, tag: str, key: str) -> None:
        (root / f"kb_{tag}.py").write_text(src)
        ext_env = dict(env, TORCH_EXTENSIONS_DIR=str(root / f"torch_ext_{tag}"))
        runner = f"import runpy; runpy.run_path('{root}/kb_{tag}.py')"
        s, rc, tail = _timed([sys.executable, "-c", runner], env=ext_env)
        b[key] = {"seconds": round(s, 2), "rc": rc, "tail": tail if rc else ""}

    def ours(src: str, key: str):
        p1 = prepare(kb(src), cfg, backend="cuda")
        b[key] = {
            "seconds": round(p1.stages.get("compile", -1), 2),
            "ok": bool(p1.compile and p1.compile.ok),
            "log": (p1.compile.log_tail if p1.compile else "")[-800:],
            "builds": p1.meta.get("build"),
            "stages": p1.stages,
            "result": p1.result.message if p1.result else None,
        }
        if not (p1.meta.get("build") or {}).get("kernelbench") and p1.root:
            b[key]["diagnosis"] = _kb_diagnosis(p1)
        return p1

    kb2 = KB_SRC.replace("kb_fused_ext", "kb_fused_ext_bench")
    plain(kb2, "0", "load_inline_plain_cold")
    plain(kb2, "0", "load_inline_plain_warm_same_dir")  # same file and directory: ninja's no-op
    p1 = ours(kb2, "ours_kb_cold")
    p2 = prepare(kb(kb2), cfg, backend="cuda")
    b["ours_kb_warm"] = {
        "seconds": round(p2.stages.get("compile", -1), 2),
        "ok": bool(p2.compile and p2.compile.ok),
        "cached": bool(p2.compile and p2.compile.cached),
        "builds": p2.meta.get("build"),
    }
    for p in (p1, p2):
        if p.root:
            shutil.rmtree(p.root, ignore_errors=True)
    log(
        f"  load_inline plain {b['load_inline_plain_cold']['seconds']}s, ours cold {b['ours_kb_cold']['seconds']}s warm {b['ours_kb_warm']['seconds']}s"
    )
    save()
    pairs = [(b["load_inline_plain_cold"]["seconds"], b["ours_kb_cold"]["seconds"])]
    for r in range(1, int(os.environ.get("B_INLINE_ROUNDS", "1"))):
        if left() < 120:
            log(f"  round {r}: skipped ({left():.0f}s left)")
            break
        src = KB_SRC.replace("kb_fused_ext", f"kb_fused_ext_r{r}")
        for side in ("plain", "ours") if r % 2 == 0 else ("ours", "plain"):
            if side == "plain":
                plain(src, str(r), f"r{r}_plain_cold")
            else:
                pr = ours(src, f"r{r}_ours_cold")
                if pr.root:
                    shutil.rmtree(pr.root, ignore_errors=True)
        pairs.append((b[f"r{r}_plain_cold"]["seconds"], b[f"r{r}_ours_cold"]["seconds"]))
        log(
            f"  round {r} ({'plain' if r % 2 == 0 else 'ours'} first): plain {pairs[-1][0]}s ours {pairs[-1][1]}s"
        )
        save()
    b["inline_cold_pairs"] = [
        {"plain_s": a, "ours_s": o, "ratio": round(a / o, 2)} for a, o in pairs
    ]
    REPORT["B"] = b
    save()


def section_c() -> None:
    log("C: cuda fault suite in one stream")
    head = WD_FILES["kernels/fused.cu"]
    illegal = head.replace("out[i] = o;", "out[i + (1L << 36)] = o;")
    hang = head.replace(
        "  for (long i = blockIdx.x",
        "  long long t0 = clock64(); while (clock64() - t0 >= 0) {}\n  for (long i = blockIdx.x",
        1,
    )
    oom = (
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, scale):\n        super().__init__()\n        self.scale = scale\n"
        "    def forward(self, x, y):\n        hog = [torch.empty(16 << 30, dtype=torch.uint8, device='cuda') for _ in range(64)]\n"
        "        return x\n"
    )
    cands = [
        wd(**{"kernels/fused.cu": illegal}),
        wd(**{"kernels/fused.cu": hang}),
        kb(oom),
        wd(**{"kernels/fused.cu": head + "\n// after faults\n"}),
    ]
    want = ["runtime_error", "timeout", "runtime_error", "ok"]
    if os.environ.get("C_ONLY_HANG"):
        cands, want = [cands[1], cands[3]], ["timeout", "ok"]
    rows = run_eval(
        "C",
        cands,
        ["--guard-policy", "off", "--verify-timeout", "30", "--no-baselines"],
        left() - 20,
    )
    REPORT["C"] = [dict(brief(r), expected=w) for r, w in zip(rows, want, strict=False)]
    save()


def _phase_medians(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Median seconds of each reported phase of each process stage (reference, verify)."""
    import statistics

    acc: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        for stage, ph in ((r.get("meta") or {}).get("phases_s") or {}).items():
            for k, v in ph.items():
                acc.setdefault(stage, {}).setdefault(k, []).append(float(v))
    return {st: {k: round(statistics.median(v), 3) for k, v in d.items()} for st, d in acc.items()}


def section_d() -> None:
    log("D: throughput batch")
    cands = []
    for i in range(int(os.environ.get("D_N", "16"))):
        k = i % 4
        if k == 0:
            cands.append(wd(**{"kernels/fused.cu": WD_FILES["kernels/fused.cu"] + f"\n// v{i}\n"}))
        elif k == 1:
            cands.append(
                wd(
                    **{
                        "kernels/fused.cu": WD_FILES["kernels/fused.cu"].replace("- 1.0f", "- 1.5f")
                        + f"\n// v{i}\n"
                    }
                )
            )
        elif k == 2:
            cands.append(
                wd(**{"kernels/fused.cu": WD_FILES["kernels/fused.cu"] + f"\n#error broken {i}\n"})
            )
        else:
            cands.append(kb(KB_SRC + f"\n# v{i}\n"))  # same extension source: cached build
    t = time.monotonic()
    tag = os.environ.get("D_TAG", "D")
    wpg = int(os.environ.get("D_WPG", "2"))  # device workers per GPU
    extra = ["--compile-jobs", "4", "--workers-per-gpu", str(wpg)]
    if os.environ.get("D_GPUS"):  # e.g. "all" or "0,1": D_WPG device workers per GPU
        extra += ["--gpus", os.environ["D_GPUS"]]
    warm = os.environ.get("D_WARM", "3")  # runner processes started ahead, per environment
    extra += ["--warm-processes", warm]
    fork = os.environ.get("D_FORK", "1") != "0"  # phases forked from a fork server (else D_WARM)
    extra += ["--fork-server" if fork else "--no-fork-server"]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = run_eval(tag, cands, extra, left() - 10)
    wall = time.monotonic() - t
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    stages: dict[str, float] = {}
    for r in rows:
        for k, v in ((r.get("meta") or {}).get("stages_s") or {}).items():
            stages[k] = stages.get(k, 0.0) + v
    gpus_used = _gpus_used(rows)
    REPORT[tag] = {
        "gpus": os.environ.get("D_GPUS") or "default (first visible)",
        "workers_per_gpu": wpg,
        "warm_processes": int(warm),
        "fork_server": fork,
        # CPU seconds of the whole eval (every process it waited for, its fork servers' too)
        "cpu_s": round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 1),
        "warm_phases": sum(len((r.get("meta") or {}).get("warm_phases") or []) for r in rows),
        "overlapped": sum(1 for r in rows if (r.get("meta") or {}).get("overlapped")),
        "rerun_alone": [
            (r.get("meta") or {})["rerun_alone"]["why"]
            for r in rows
            if (r.get("meta") or {}).get("rerun_alone")
        ],
        "verdicts": [r["status"] for r in rows],
        "workers": sorted({str((r.get("meta") or {}).get("worker")) for r in rows}),
        "n": len(rows),
        "of": len(cands),
        "complete": COMPLETE.get(tag, False),
        "wall_s": round(wall, 1),
        # one device worker label per GPU: candidates per hour over the GPUs that worked (a
        # compile error or static reject has no worker and is no GPU)
        "gpus_used": gpus_used,
        "per_hour": round(len(rows) / wall * 3600, 1) if rows else 0,
        "per_gpu_hour": (
            round(
                len(rows) / wall * 3600 / gpus_used,
                1,
            )
            if rows
            else 0
        ),
        "statuses": {
            s: sum(1 for r in rows if r["status"] == s) for s in {r["status"] for r in rows}
        },
        "stage_seconds_sum": {k: round(v, 1) for k, v in stages.items()},
        "phases_s_median": _phase_medians(rows),
    }
    save()


if __name__ == "__main__":
    from cuda_agent.sandbox.isolation import caps

    REPORT["caps"] = caps().__dict__
    save()
    only = os.environ.get("SECTIONS", "A,C,B,D").split(",")
    for name, fn, need in (
        ("A", section_a, 120),
        ("C", section_c, 60),
        ("B", section_b, 60),
        ("D", section_d, 90),
    ):
        if name not in only:
            continue
        if left() < need:
            REPORT[f"{name}_skipped"] = f"{left():.0f}s left"
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            import traceback

            REPORT[f"{name}_error"] = traceback.format_exc()[-3000:]
            log(f"{name} failed: {e}")
        save()
    REPORT["total_s"] = round(time.monotonic() - T0, 1)
    save()
    print(json.dumps(REPORT, indent=1, default=str)[-6000:])
