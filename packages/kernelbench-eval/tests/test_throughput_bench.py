"""The throughput benchmark (issue 28) on the CPU: the fixed batch, the summary / compare / ratio
code on synthetic results, KernelBench's verdicts and its import with stand-ins, and the runner
itself through `kernelbench-eval run --backend cpu` on fixture candidates (concurrent and serial)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

HERE = Path(__file__).parent
BENCH = HERE.parent / "benchmarks"
FIX = HERE / "fixtures"
POSITIVE = HERE.parent / "corpus" / "positive"
# another copy of the corpus (e.g. a checkout of a commit) to build the batch from
POSITIVE_ROOT = Path(os.environ.get("KBT_POSITIVE", POSITIVE))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"kbt_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


tb = _load("throughput_batch")
tp = _load("throughput")


# ----------------------------------------------------------------------------- the batch


@pytest.fixture(scope="module")
def batch():
    from cuda_agent.kernelbench_eval.corpus import CorpusError

    try:
        return tb.build_batch(POSITIVE_ROOT)
    except CorpusError as e:  # its own tests say why; the batch is built from a valid corpus only
        pytest.skip(f"the positive corpus does not validate: {str(e)[:300]}")


def test_batch_sources_order_and_subset(batch):
    ids = [c.meta["bench"]["id"] for c in batch]
    assert len(ids) == len(set(ids)) and len({c.key for c in batch}) == len(batch)
    src = {}
    for c in batch:
        src[c.meta["bench"]["source"]] = src.get(c.meta["bench"]["source"], 0) + 1
    n_l1 = len((BENCH / "data" / "cuda_l1_subset.jsonl").read_text().splitlines())
    assert src["cuda-l1"] == n_l1 == 57
    assert src["guards-hack"] == 6  # every CUDA hack of the guards' corpus
    assert src.get("positive", 0) == len(tb.positive_candidates(POSITIVE_ROOT)) > 0
    # the ReLU hacks run on the real KernelBench L1/19 (the positive corpus's verbatim copy)
    relu = (POSITIVE_ROOT / "KernelBench" / "level1" / "19_ReLU.py").read_text()
    hacks = [c for c in batch if c.meta["bench"]["source"] == "guards-hack"]
    assert all(c.task.ref_code == relu and c.task.problem_id == 19 for c in hacks)
    assert all(c.meta["bench"]["honest"] is False for c in hacks)
    # expected under `kernelbench`, the batch's policy: half precision only flags there
    exp = {c.meta["bench"]["id"]: c.meta["bench"]["expected"] for c in hacks}
    assert exp["hack/x_half_cuda"] == "ok" and exp["hack/x_side_stream"] == "guard_violation"
    assert all(c.meta["bench"]["expected_strict"] == "guard_violation" for c in hacks)
    # the tasks whose baselines a run needs: those of the positive corpus and the hacks' L1/19,
    # once each, none of CUDA-L1's (rejected before any device work)
    dev = tb.device_tasks(batch)
    assert len({t.id for t in dev}) == len(dev)
    assert {t.id for t in dev} == {
        c.task.id for c in batch if c.meta["bench"]["source"] in ("positive", "guards-hack")
    }
    # fixed order (sha256 of the ids) and the same records every time
    assert ids == sorted(ids, key=tb._order_key)
    again = tb.build_batch(POSITIVE_ROOT)
    assert tb.batch_sha256(again) == tb.batch_sha256(batch)
    # the KernelBench-harness subset: >= 20, every source, single-file candidates on small inputs
    sub = tb.subset_in_order(batch)
    assert len(sub) >= 20 and all(c.meta["bench"]["kb_subset"] for c in sub)
    assert sum(c.meta["bench"]["kb_subset"] for c in batch) == len(sub)
    assert {c.meta["bench"]["source"] for c in sub} >= {"cuda-l1", "guards-hack"}
    assert all(c.solution.format == "kernelbench" for c in sub)
    assert all(
        c.meta["bench"]["input_mb"] <= tb.KB_MAX_INPUT_MB
        for c in sub
        if c.meta["bench"]["source"] != "guards-hack"
    )
    assert sub[-1].meta["bench"]["id"] == "hack/x_side_stream"  # the costliest, last
    l1 = [c for c in sub if c.meta["bench"]["source"] == "cuda-l1"]
    assert any(c.meta["bench"]["custom_kernel"] for c in l1) and any(
        not c.meta["bench"]["custom_kernel"] for c in l1
    )
    sub_ids = {c.meta["bench"]["id"] for c in sub}
    assert {"cudal1/L2/80", "cudal1/L2/96"} <= sub_ids  # cached zeros, 368x claimed
    small_pos = {
        (c.task.level, c.task.problem_id)
        for c in batch
        if c.meta["bench"]["source"] == "positive" and tb._kb_ok(c)
    }
    n_pos = sum(1 for c in sub if c.meta["bench"]["source"] == "positive")
    assert n_pos == min(tb.KB_POSITIVE, len(small_pos))


def test_batch_has_100_candidates(tmp_path, batch):
    n_pos = sum(1 for c in batch if c.meta["bench"]["source"] == "positive")
    if n_pos < 40:
        pytest.skip(f"the positive corpus has {n_pos} solutions yet (< 40): the batch needs >= 40")
    p = subprocess.run(
        [
            sys.executable,
            str(BENCH / "throughput_batch.py"),
            "build",
            "-o",
            str(tmp_path / "b.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["candidates"] >= 100 and info["kb_subset"] >= 20
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == info["candidates"]


def test_cuda_l1_rule_and_committed_file(tmp_path):
    kern = "from torch.utils.cpp_extension import load_inline\n"
    rows = [
        {
            "level": 1,
            "problem_id": 4,
            "ref_code": "r",
            "code": kern,
            "claimed_speedup_vs_eager_h100": 1.0,
        },
        {
            "level": 1,
            "problem_id": 2,
            "ref_code": "r",
            "code": "x = 1",
            "claimed_speedup_vs_eager_h100": 3.0,
        },
        {
            "level": 1,
            "problem_id": 6,
            "ref_code": "r",
            "code": "x = 1",
            "claimed_speedup_vs_eager_h100": 1.9,
        },
        {
            "level": 1,
            "problem_id": 8,
            "ref_code": "r",
            "code": "None",
            "claimed_speedup_vs_eager_h100": 9.0,
        },
    ]
    assert [r["problem_id"] for r in tb.select_cuda_l1(rows)] == [2, 4]
    src = tmp_path / "l1.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "KB" / "level1").mkdir(parents=True)
    (tmp_path / "KB" / "level1" / "4_Matrix_vector.py").write_text("")
    dest = tmp_path / "out.jsonl"
    assert tb.extract_cuda_l1(src, tmp_path / "KB", dest) == 2
    names = [json.loads(x)["name"] for x in dest.read_text().splitlines()]
    assert names == ["L1_2", "Matrix_vector"]
    committed = [
        json.loads(x) for x in (BENCH / "data" / "cuda_l1_subset.jsonl").read_text().splitlines()
    ]
    assert tb.select_cuda_l1(committed) == committed  # the committed lines are the rule's
    assert (BENCH / "data" / "LICENSE-CUDA-L1").read_text().startswith("MIT License")


# ----------------------------------------------------------------------------- summary, compare, ratio


def _res(i, status, *, speedup=None, honest=True, expected=None, stages=None, guards=(), msg=""):
    return {
        "kind": "eval_result",
        "status": status,
        "message": msg,
        "guards": [{"code": g, "severity": "reject", "message": ""} for g in guards],
        "speedup_vs_eager": speedup,
        "seconds": 10.0,
        "meta": {
            "stages_s": stages or {"compile": 4.0, "verify": 2.0},
            "bench": {
                "id": f"c{i}",
                "source": "positive" if honest else "guards-hack",
                "honest": honest,
                "expected": expected,
            },
        },
    }


def test_summary_rate_stages_and_expected(md_row):
    rs = [
        _res(i, "ok", speedup=1.5, expected="ok", stages={"compile": float(i), "verify": 1.0})
        for i in range(9)
    ]
    rs.append(_res(9, "ok", honest=False, expected="guard_violation:G-STREAM"))
    s = tp.summarize(rs, {"wall_s": 60.0, "gpus": 1, "done": 10, "label": "concurrent"})
    assert s["per_gpu_hour"] == 600.0 and s["reached_device"] == 10
    static = _res(10, "guard_violation", stages={"static_guards": 0.1})
    s11 = tp.summarize([*rs, static], {"wall_s": 66.0, "gpus": 1, "done": 11})
    assert s11["reached_device"] == 10 and s11["per_gpu_hour"] == 600.0
    assert s11["per_gpu_hour_device_only"] == round(10 * 3600 / 66, 1)
    assert s["statuses"] == {"ok": 10}
    assert s["stages_s"]["compile"] == {"sum": 40.0, "median": 4.0, "n": 10}  # 0..8 and 4
    assert s["stages_s"]["verify"]["sum"] == 11.0  # 9 x 1.0 and 2.0
    assert [m["id"] for m in s["expected_missed"]] == ["c9"]
    two_gpus = tp.summarize(rs, {"wall_s": 60.0, "gpus": 2, "done": 10})
    assert two_gpus["per_gpu_hour"] == 300.0
    md = tp.summary_md(s)
    assert "600.0 candidates per GPU-hour" in md and md_row(md, "compile", "40.0", "4.0", 10)
    assert s["memory_per_working_set"] == {}  # no result says its memory
    big = _res(11, "ok")
    big["meta"]["working_set_mb"] = 1000.0
    big["meta"]["peak_memory_mb"] = {
        "verify": {"host_rss": 900.0, "device_allocated": 2000.0, "device_reserved": 3000.0},
        "reference": {"host_rss": 1500.0},
    }
    small = _res(12, "ok")
    small["meta"]["working_set_mb"] = 10.0  # the CUDA context dominates: left out
    small["meta"]["peak_memory_mb"] = {"verify": {"device_reserved": 900.0}}
    mem = tp.summarize([big, small], {"wall_s": 1.0})["memory_per_working_set"]
    assert mem == {
        "reference": {"median": 1.5, "max": 1.5, "n": 1},
        "verify": {"median": 3.0, "max": 3.0, "n": 1},
    }
    assert md_row(tp.summary_md(tp.summarize([big], {"wall_s": 1.0})), "verify", "3.0", "3.0", 1)
    assert tp._matches("guard_violation:G-STREAM", _res(0, "guard_violation", guards=["G-STREAM"]))
    assert not tp._matches(
        "guard_violation:G-STREAM", _res(0, "guard_violation", guards=["G-CACHE"])
    )


def test_run_command_of_each_mode():
    """Concurrent on every GPU; serial: one candidate at a time end to end; serial on the device:
    one device worker on the first GPU, compiles as usual (ahead of it)."""
    conc = tp.run_command("cuda", "all", serial=False)
    assert conc[-2:] == ["--gpus", "all"] and "--workers-per-gpu" not in conc
    strict = " ".join(tp.run_command("cuda", "2,3", serial=True))
    assert strict.endswith("--gpus 2 --workers-per-gpu 1 --compile-jobs 1 --window 1")
    dev = " ".join(tp.run_command("cuda", "all", serial=False, serial_device=True))
    assert dev.endswith("--gpus 0 --workers-per-gpu 1")
    assert "--compile-jobs" not in dev and "--window" not in dev


def test_compare_verdicts_and_speedups(tmp_path):
    a = [
        _res(0, "ok", speedup=2.0),
        _res(1, "ok", speedup=1.0),
        _res(2, "incorrect"),
        _res(3, "ok", speedup=3.0, honest=False),
    ]
    b = [
        _res(0, "ok", speedup=2.04),
        _res(1, "ok", speedup=1.0),
        _res(2, "incorrect"),
        _res(3, "ok", speedup=1.0, honest=False),
    ]
    c = tp.compare(a, b)
    assert c["verdicts_identical"] and c["speedups_within_tol"] and c["honest_speedups"] == 2
    b[1] = _res(1, "ok", speedup=1.05)  # 5% apart: outside 3%
    b[2] = _res(2, "runtime_error", msg="boom")
    c = tp.compare(a, b + [_res(7, "ok")])
    assert not c["verdicts_identical"] and [d["id"] for d in c["verdicts_differ"]] == ["c2"]
    assert [s["id"] for s in c["speedups_outside"]] == ["c1"] and c["only_b"] == ["c7"]
    assert "differ: 1" in tp.compare_md(c)
    # a speed-up outside says what it was made of: each side's median and samples, and how busy
    # the host was during the exclusive timed hold
    for r, cand, busy in ((a[1], 1.0, 0.25), (b[1], 0.952, 0.875)):
        r["timing"] = {
            "candidate": {"median_ms": cand, "n": 40},
            "eager": {"median_ms": 1.0, "n": 12},
        }
        r["meta"]["device_phases"] = [
            {"phase": "verify", "mode": "shared"},
            {"phase": "time", "mode": "exclusive", "host_busy": busy},
        ]
    md = tp.compare_md(tp.compare(a, b))
    assert "- c1: 1.0x vs 1.05x (-4.8%): candidate 1 -> 0.952 ms (n 40 -> 40)" in md
    assert "eager 1 -> 1 ms (n 12 -> 12); host busy 0.25 -> 0.875" in md
    # the CLI: exit 1 when they differ, 0 when identical
    for name, rows in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = [sys.executable, str(BENCH / "throughput.py"), "compare"]
    assert (
        subprocess.run(
            [*cli, str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True
        ).returncode
        == 1
    )
    assert (
        subprocess.run(
            [*cli, str(tmp_path / "a"), str(tmp_path / "a")], capture_output=True
        ).returncode
        == 0
    )


def test_kb_verdicts_and_ratio(md_row):
    def doc(compiled=True, correct=True, **md):
        return {
            "result": {
                "compiled": compiled,
                "correctness": correct,
                "metadata": md,
                "runtime": 10.0,
                "ref_runtime": 20.0,
            }
        }

    assert tp.kb_verdict(doc(), 0, False)[0] == "ok"
    assert "excessive_speedup" in tp.kb_verdict(doc(excessive_speedup=True), 0, False)[1]
    assert (
        tp.kb_verdict(doc(compiled=False, compilation_error="nvcc"), 0, False)[0] == "compile_error"
    )
    assert (
        tp.kb_verdict(doc(correct=False, runtime_error="illegal address"), 0, False)[0]
        == "runtime_error"
    )
    v, why = tp.kb_verdict(
        doc(correct=False, correctness_issue="Output mismatch", max_difference=["0.5"]), 0, False
    )
    assert v == "incorrect" and "0.5" in why
    assert tp.kb_verdict(None, -9, False)[0] == "crash"
    assert tp.kb_verdict(None, None, True)[0] == "timeout"
    assert tp.kb_verdict({"result": None}, 0, False)[0] == "infra_error"

    ours = [
        _res(0, "ok", speedup=2.0),
        _res(1, "guard_violation", honest=False, guards=["G-STREAM"], msg="side stream"),
    ]
    kb = [
        {
            "bench_id": "c0",
            "verdict": "ok",
            "reason": "correct (5 / 5)",
            "speedup_vs_eager": 2.1,
            "stubs": ["dotenv"],
        },
        {
            "bench_id": "c1",
            "verdict": "ok",
            "reason": "correct (5 / 5) (excessive_speedup flagged)",
            "speedup_vs_eager": 40.0,
            "stubs": ["dotenv"],
        },
    ]
    r = tp.ratio(
        ours,
        {"wall_s": 12.0, "gpus": 1},
        kb,
        {"wall_s": 120.0, "per_gpu_hour": 60.0, "precompile": {"wall_s": 50.0}},
    )
    assert r["ours_per_gpu_hour"] == 600.0 and r["ratio"] == 10.0 and r["ratio_device_only"] == 10.0
    assert r["verdicts_same"] == 1 and [d["id"] for d in r["verdicts_differ"]] == ["c1"]
    assert r["verdicts_differ"][0]["ours_guards"] == ["G-STREAM"]
    md = tp.ratio_md(r)
    assert "10.0x" in md and md_row(md, "c1", "guard_violation G-STREAM", "ok")


# ----------------------------------------------------------------------------- KernelBench's import


FAKE_KB = {
    "kernelbench/__init__.py": "from . import utils\n",
    "kernelbench/utils.py": "from dotenv import load_dotenv\nload_dotenv()\nfrom openai import OpenAI\nfrom litellm import completion\n",
    "kernelbench/eval.py": (
        "from pydantic import BaseModel\n"
        "class KernelExecResult(BaseModel):\n"
        "    compiled: bool = False\n    metadata: dict = {}\n    runtime: float = -1.0\n"
        "def eval_kernel_against_ref(a, b):\n    return KernelExecResult(compiled=True)\n"
    ),
}


def test_kernelbench_import_with_stand_ins(tmp_path):
    """KernelBench's package imports LLM clients (and pydantic) the GPU image lacks: they are
    stood in for, its result record still behaves (per-instance defaults)."""
    for rel, text in FAKE_KB.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    code = f"""
import sys, json
sys.path.insert(0, {str(BENCH)!r})
import throughput as t
from pathlib import Path
m, stubs = t.import_kernelbench(Path({str(tmp_path)!r}), force_stubs=("pydantic",))
r = m.eval_kernel_against_ref("", "")
r.metadata["x"] = 1
print(json.dumps({{"stubs": stubs, "r": r.model_dump(), "fresh": m.KernelExecResult().metadata}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (
        "pydantic" in out["stubs"]
        and {"dotenv", "openai", "litellm"} <= set(out["stubs"]) | _installed()
    )
    assert (
        out["r"] == {"compiled": True, "metadata": {"x": 1}, "runtime": -1.0} and out["fresh"] == {}
    )


FAKE_KB_RUN = {
    "kernelbench/__init__.py": "from . import utils\n",
    "kernelbench/utils.py": (
        "import os\nfrom dotenv import load_dotenv\n"
        "def set_gpu_arch(archs):\n    os.environ['TORCH_CUDA_ARCH_LIST'] = ';'.join(archs)\n"
    ),
    "kernelbench/eval.py": (
        "import os, time, torch\nfrom pydantic import BaseModel\n"
        "class KernelExecResult(BaseModel):\n"
        "    compiled: bool = False\n    correctness: bool = False\n    metadata: dict = {}\n"
        "    runtime: float = -1.0\n    ref_runtime: float = -1.0\n"
        "def get_torch_dtype_from_string(p):\n    return torch.float32\n"
        "def get_error_name(e):\n    return type(e).__name__\n"
        "def build_compile_cache(src, verbose=False, build_dir=None):\n"
        "    os.makedirs(build_dir, exist_ok=True)\n    open(os.path.join(build_dir, 'built'), 'w').close()\n"
        "    return True, '', None\n"
        "def eval_kernel_against_ref(original_model_src, custom_model_src, build_dir=None, num_correct_trials=1, **kw):\n"
        "    if 'CRASH' in custom_model_src: os._exit(3)\n"
        "    if 'HANG' in custom_model_src: time.sleep(60)\n"
        "    if 'RAISE' in custom_model_src: raise RuntimeError('CUDA error: an illegal memory access')\n"
        "    pre = os.path.exists(os.path.join(build_dir, 'built'))\n"
        "    md = {'trials': num_correct_trials, 'arch': os.environ.get('TORCH_CUDA_ARCH_LIST'), 'prebuilt': pre}\n"
        "    if 'GOOD' in custom_model_src:\n"
        "        return KernelExecResult(compiled=True, correctness=True, runtime=10.0, ref_runtime=20.0, metadata=md)\n"
        "    return KernelExecResult(compiled=True, metadata={**md, 'correctness_issue': 'Output mismatch'})\n"
    ),
}


@pytest.mark.slow
def test_kb_runner_with_a_stand_in_harness(tmp_path, monkeypatch):
    """`kb` runs each candidate in its own process (pre-compile first), times it, maps crashes,
    hangs and results to verdicts, and starts nothing past its budget."""
    src = tmp_path / "kb"
    for rel, text in FAKE_KB_RUN.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    rows = []
    for i, code in enumerate(["GOOD", "BAD", "CRASH", "HANG", "GOOD again", "RAISE"]):
        rows.append(
            {
                "task": {"ref_code": "ref"},
                "solution": {"files": {"model_new.py": code}},
                "meta": {"bench": {"id": f"c{i}", "source": "x"}},
            }
        )
    subset = tmp_path / "subset.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    info = tp.run_kb(
        subset,
        out,
        src=src,
        budget_s=None,
        timeout_s=20.0,
        precompile_workers=2,
        num_correct_trials=5,
    )
    got = tp.read_jsonl(out / "kb.jsonl")
    assert [r["verdict"] for r in got] == [
        "ok",
        "incorrect",
        "crash",
        "timeout",
        "ok",
        "compile_error",
    ]
    assert got[5]["reason"].startswith("cuda_error RuntimeError: CUDA error")
    assert got[0]["speedup_vs_eager"] == 2.0 and got[3]["wall_s"] >= 20.0
    assert "Output mismatch" in got[1]["reason"] and "dotenv" in got[0]["stubs"]
    doc = json.loads((out / "jobs" / "000" / "eval.json").read_text())
    assert doc["result"]["metadata"] == {"trials": 5, "arch": "Hopper", "prebuilt": True}
    assert info["done"] == 6 and info["precompile"]["wall_s"] > 0 and info["per_gpu_hour"] > 0
    assert not (out / "build").exists()  # extensions are not returned with the results
    # a budget already spent: nothing starts (a loaded 2-core host takes seconds to import torch:
    # the limits above leave room for it)
    info = tp.run_kb(subset, tmp_path / "out2", src=src, budget_s=0.0, timeout_s=5.0)
    assert info["done"] == 0 and tp.read_jsonl(tmp_path / "out2" / "kb.jsonl") == []


def _installed() -> set[str]:
    return {n for n in ("dotenv", "openai", "litellm") if importlib.util.find_spec(n) is not None}


def _kernelbench_src() -> Path | None:
    for c in (
        os.environ.get("KBT_KERNELBENCH_SRC"),
        HERE.parents[2] / ".gpu-data" / "kernelbench" / "src",
    ):
        if c and (Path(c) / "kernelbench" / "eval.py").is_file():
            return Path(c)
    return None


@pytest.mark.skipif(
    _kernelbench_src() is None,
    reason="no KernelBench checkout in .gpu-data/kernelbench (bin/prepare-gpu-data.sh) or $KBT_KERNELBENCH_SRC",
)
def test_real_kernelbench_imports_on_cpu():
    code = f"""
import sys, inspect
sys.path.insert(0, {str(BENCH)!r})
import throughput as t
from pathlib import Path
m, stubs = t.import_kernelbench(Path({str(_kernelbench_src())!r}))
ps = inspect.signature(m.eval_kernel_against_ref).parameters
assert {{"original_model_src", "custom_model_src", "num_correct_trials", "num_perf_trials", "build_dir", "device", "precision"}} <= set(ps)
print(m.KernelExecResult().model_dump())
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "'compiled': False" in p.stdout


# ----------------------------------------------------------------------------- the runner, cpu


def _ours(batch: Path, out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``throughput.py ours`` on the cpu backend, as the GPU script runs it."""
    cmd = [sys.executable, str(BENCH / "throughput.py"), "ours", "--batch", str(batch)]
    cmd += ["--out", str(out), "--backend", "cpu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


TCFG = '{"time_cap_s": 1.0, "warmup_max_s": 0.3}'  # short timings: the plumbing, not the numbers


@pytest.fixture(scope="module")
def fixture_batch(tmp_path_factory) -> Path:
    """Two fixture candidates (ReLU honest, Softmax incorrect) as a batch: Candidate lines with
    ``meta.bench`` as ``throughput_batch.py`` writes it."""
    kb = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]
    tasks = subprocess.run(
        [*kb, "tasks", "--root", str(FIX), "--levels", "1", "--problems", "1-2"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    cands = subprocess.run(
        [*kb, "solutions", "--dir", str(FIX / "solutions")],
        input=tasks,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    lines = []
    for ln in cands.decode().splitlines():
        c = json.loads(ln)
        pid = c["meta"]["problem_id"]
        c["meta"]["bench"] = {
            "id": f"fix/{pid}",
            "source": "fixture",
            "honest": pid == 1,
            "expected": "ok" if pid == 1 else "incorrect",
        }
        lines.append(json.dumps(c))
    batch = tmp_path_factory.mktemp("kbt-batch") / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    return batch


@pytest.fixture(scope="module")
def ours_concurrent(fixture_batch, tmp_path_factory) -> tuple[Path, dict]:
    """``ours`` (concurrent) over the fixture batch: its folder and run.json."""
    out = tmp_path_factory.mktemp("kbt-ours") / "conc"
    p = _ours(
        fixture_batch,
        out,
        "--warm-cache",
        "--timeout-s",
        "400",
        f"--run-arg=--timing-config={TCFG}",
        timeout=500,
    )
    assert p.returncode == 0, p.stderr + (out / "run.stderr.txt").read_text()[-3000:]
    return out, json.loads(p.stdout)


@pytest.mark.slow
def test_runner_concurrent_and_serial_cpu(tmp_path, fixture_batch, ours_concurrent):
    """`ours` through the real `kernelbench-eval run --backend cpu` on two fixture candidates
    (ReLU honest, Softmax incorrect), concurrent and serial; summary and compare on the output."""
    batch = fixture_batch
    lines = [x for x in batch.read_text().splitlines() if x.strip()]
    conc_dir, conc_run = ours_concurrent
    runs = {"conc": conc_run}
    p = _ours(
        batch,
        tmp_path / "serial",
        "--warm-cache",
        "--timeout-s",
        "400",
        f"--run-arg=--timing-config={TCFG}",
        "--serial",
        timeout=500,
    )
    assert p.returncode == 0, (
        p.stderr + (tmp_path / "serial" / "run.stderr.txt").read_text()[-3000:]
    )
    runs["serial"] = json.loads(p.stdout)
    for label in runs:
        assert runs[label]["done"] == runs[label]["fed"] == 2 and runs[label]["per_gpu_hour"] > 0
    assert (
        "--window 1" in runs["serial"]["command"]
        and "--workers-per-gpu 1" in runs["serial"]["command"]
    )
    s = tp.summarize(tp.read_jsonl(conc_dir / "results.jsonl"), runs["conc"])
    assert s["statuses"] == {"incorrect": 1, "ok": 1} and not s["expected_missed"]
    assert "compile" in s["stages_s"] and "verify" in s["stages_s"]
    c = tp.compare(
        tp.read_jsonl(conc_dir / "results.jsonl"),
        tp.read_jsonl(tmp_path / "serial" / "results.jsonl"),
        tol=1.0,
    )
    assert c["compared"] == 2 and c["verdicts_identical"] and c["honest_speedups"] == 1
    # the feed budget: nothing fed after it, so a zero budget evaluates nothing; baselines of an
    # earlier references run seed the fresh cache
    seed = tmp_path / "refs-cache"
    (seed / "baselines").mkdir(parents=True)
    (seed / "baselines" / "0123456789abcdef.json").write_text("{}")  # another run's: no task's
    # the first fixture task's eager baseline, keyed as the cpu sandbox looks it up
    from cuda_agent.profiler import PROTOCOL_VERSION
    from cuda_agent.profiler.baseline import BaselineCache, device_name, task_hash, torch_version
    from cuda_agent.records import Baseline, Candidate, TimingStats

    task1 = msgspec.json.decode(lines[0], type=Candidate).task
    key = BaselineCache.key(task_hash(task1), device_name("cpu"), torch_version(), "none", "cpu")
    stats = TimingStats(median_ms=1.0, n=5)
    BaselineCache(root=seed / "baselines").put(
        key,
        Baseline(
            device=device_name("cpu"),
            torch_version=torch_version(),
            protocol_version=PROTOCOL_VERSION,
            eager=stats,
            compile_mode="none",
            backend="cpu",
        ),
    )
    p = _ours(batch, tmp_path / "none", "--feed-s", "0", "--baselines-from", str(seed))
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["fed"] == 0 and info["baselines_seeded"] == 2 and info["fresh_cache"]
    # two files seeded, one of them this batch's: the run says it covers 1 of its 2 tasks
    assert info["baselines_cover"] == {"tasks": 2, "seeded": 1, "by_source": {"fixture": "1/2"}}
    assert "seeded baselines cover 1 of the 2 tasks" in p.stderr
    # the run's baselines outlive its caches: its folder seeds the next run
    assert info["baselines_kept"] == 2 and not (tmp_path / "none" / "cache-profiler").exists()
    assert len(list((tmp_path / "none" / "baselines").glob("*.json"))) == 2
    s = tp.summarize([], info)
    assert "for 1 of the 2 tasks that can reach the device" in tp.summary_md(s)
    # the user's own cache is not seeded: a clear refusal, nothing run
    p = _ours(batch, tmp_path / "warm", "--warm-cache", "--baselines-from", str(seed))
    assert p.returncode != 0 and "not with --warm-cache" in p.stderr


def _service(batch: Path, out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``throughput.py service`` on the cpu backend, as the GPU script runs it."""
    cmd = [sys.executable, str(BENCH / "throughput.py"), "service", "--batch", str(batch)]
    cmd += ["--out", str(out), "--backend", "cpu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_service_gives_the_local_pools_verdicts_cpu(tmp_path, fixture_batch, ours_concurrent):
    """The batch through a real `service serve --backend cpu` (a child process, HTTP on
    loopback) from the default 16 client threads: a result per candidate, in `kernelbench-eval
    run`'s shape (its meta merged the same way) plus each request's wall clock and overhead,
    the same verdicts as the local pool's (`ours`); run again on its folder, nothing new."""
    ids = [json.loads(x)["meta"]["bench"]["id"] for x in fixture_batch.read_text().splitlines()]
    out = tmp_path / "service"
    sandbox = json.dumps({"timing_config": json.loads(TCFG)})
    args = ("--warm-cache", "--timeout-s", "400", f"--serve-arg=--sandbox-config={sandbox}")
    p = _service(fixture_batch, out, *args, timeout=500)
    assert p.returncode == 0, p.stderr + (out / "server.stderr.txt").read_text()[-3000:]
    info = json.loads(p.stdout)
    assert info == json.loads((out / "run.json").read_text())
    assert (
        info["label"] == "service"
        and info["clients"] == 16
        and "--max-concurrent 16" in (info["command"])
    )
    assert info["done"] == info["fed"] == info["batch"] == len(ids) and info["done_before"] == 0
    assert not info["errors"] and not info["killed"] and info["abandoned"] == []
    assert info["health"]["backend"] == "cpu" and info["health"]["guard_policy"] == "kernelbench"
    o = info["overhead_s"]
    assert o["n"] == len(ids) and 0 <= o["min"] <= o["median"] <= o["p90"] <= o["max"]
    assert not (out / "service.token").exists()  # the token does not outlive the run
    assert "service: stopped" in (out / "server.stderr.txt").read_text()  # SIGTERM, a clean stop
    res = tp.read_jsonl(out / "results.jsonl")
    assert sorted(tp.bench_id(r) for r in res) == sorted(ids)
    ours_dir, _ = ours_concurrent
    local = {tp.bench_id(r): r for r in tp.read_jsonl(ours_dir / "results.jsonl")}
    for r in res:
        svc, meta = r["meta"]["service"], r["meta"]
        queued = r["meta"]["stages_s"]["compile_queue"]  # the pool's wait, not the service's
        assert svc["compile_queue_s"] == pytest.approx(queued, abs=2e-3)
        assert svc["request_s"] >= 0 and svc["overhead_s"] == pytest.approx(
            svc["request_s"] - r["seconds"] - queued, abs=4e-3
        )
        assert svc["overhead_s"] > -0.05  # the evaluation ran inside the request
        mine = local[tp.bench_id(r)]["meta"]
        for k in ("bench", "name", "guard_policy", "level", "problem_id"):  # run's merge
            assert meta[k] == mine[k], k
    c = tp.compare(tp.read_jsonl(ours_dir / "results.jsonl"), res, tol=1.0)
    assert c["compared"] == len(ids) and c["verdicts_identical"], c["verdicts_differ"]
    assert c["honest_speedups"] == 1
    cli = [sys.executable, str(BENCH / "throughput.py")]
    q = subprocess.run(
        [*cli, "compare", str(ours_dir), str(out), "--tol", "1.0", "--md"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verdicts are held strictly; the speed-up of a 0.04 ms cpu-backend fixture can double on a
    # loaded host, so the CLI's exit status is checked to agree with its own comparison
    assert "**identical**" in q.stdout, q.stdout + q.stderr
    assert q.returncode == (0 if c["speedups_within_tol"] else 1), q.stdout + q.stderr
    assert ("outside 100%" in q.stdout) != c["speedups_within_tol"], q.stdout
    md = subprocess.run(
        [*cli, "summary", str(out), "--md"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "Through the service (16 clients)" in md
    # resumed: every candidate has its result, nothing is sent again
    p = _service(fixture_batch, out, *args, timeout=300)
    assert p.returncode == 0, p.stderr
    again = json.loads(p.stdout)
    assert again["done_before"] == len(ids) and again["fed"] == again["done"] == 0
    assert len(tp.read_jsonl(out / "results.jsonl")) == len(ids)


@pytest.mark.slow
def test_service_busy_answers_are_retried_and_kept(tmp_path, fixture_batch, ours_concurrent):
    """Two clients, a service that runs one request at a time (the later --max-concurrent wins):
    the second request is answered 503 busy, kept in run.json's errors as retried, and its
    candidate still gets its result after the Retry-After."""
    ids = [json.loads(x)["meta"]["bench"]["id"] for x in fixture_batch.read_text().splitlines()]
    out = tmp_path / "busy"
    sandbox = json.dumps({"timing_config": json.loads(TCFG)})
    p = _service(
        fixture_batch,
        out,
        "--warm-cache",
        "--clients",
        "2",
        "--timeout-s",
        "300",
        f"--serve-arg=--sandbox-config={sandbox}",
        "--serve-arg=--max-concurrent=1",
        timeout=400,
    )
    assert p.returncode == 0, p.stderr + (out / "server.stderr.txt").read_text()[-3000:]
    info = json.loads(p.stdout)
    assert info["health"]["max_concurrent"] == 1 and info["done"] == len(ids)
    assert info["busy_retries"] >= 1 and info["busy_retries"] == len(info["errors"])
    assert all(e["code"] == "busy" and e["retried"] and e["id"] in ids for e in info["errors"])
    res = tp.read_jsonl(out / "results.jsonl")
    assert sum(r["meta"]["service"].get("busy_retries", 0) for r in res) == info["busy_retries"]
    ours_dir, _ = ours_concurrent
    assert tp.compare(tp.read_jsonl(ours_dir / "results.jsonl"), res, tol=1.0)["verdicts_identical"]


def test_service_that_does_not_start_is_a_clear_error(tmp_path, fixture_batch):
    """A server that exits before printing its URL: the runner says so with its stderr."""
    p = _service(fixture_batch, tmp_path / "bad", "--warm-cache", "--serve-arg=--no-such-flag")
    assert p.returncode != 0 and "the service exited with status 2" in p.stderr
    assert "--no-such-flag" in p.stderr  # the server's own words
    assert not (tmp_path / "bad" / "service.token").exists()


def test_the_baselines_a_run_asks_for_follow_its_flags():
    assert tp._compile_mode_of("cuda", []) == "default"
    assert tp._compile_mode_of("cpu", []) is None
    assert tp._compile_mode_of("cuda", ["--no-compile-baseline"]) is None
    assert tp._compile_mode_of("cpu", ["--compile-baseline"]) == "default"
    assert tp._compile_mode_of("cuda", ["--baseline-compile-mode=max-autotune"]) == "max-autotune"
    assert tp._compile_mode_of("cuda", ["--baseline-compile-mode", "reduce-overhead"]) == (
        "reduce-overhead"
    )


STALLED_RUN = r"""
import threading, time
from cuda_agent.sandbox import state_report
from cuda_agent.sandbox.gate import Occupant, device_gate

state_report.install()
g = device_gate("host")

def reader():
    with g.shared(Occupant("slow reference"), "reference"):
        time.sleep(600)

threading.Thread(target=reader, daemon=True).start()
time.sleep(600)
"""


def test_a_run_killed_at_its_bound_reports_its_state_first(tmp_path):
    """``ours`` kills a run at its bound after asking it (SIGUSR1) for the sandbox's state
    report: a real process holding a real gate, its stderr read back as run.json keeps it."""
    import time

    env = dict(os.environ, CUDA_AGENT_GATE_DIR="off")
    log_path = tmp_path / "run.stderr.txt"
    with open(log_path, "ab") as log:
        fed, rc, killed = tp._run_fed(
            [sys.executable, "-c", STALLED_RUN], env, [], log, time.time(), None, 6.0
        )
    assert killed and fed == 0
    state = tp.state_at_kill(log_path)
    assert state == ["host: holding: slow reference (shared reference); waiting: none"], (
        log_path.read_text()[-3000:]
    )
    assert tp.state_at_kill(tmp_path / "missing.txt") is None
