"""The evaluator throughput benchmark's fixed batch (issue 28): Candidate records for real
KernelBench work, from files in this repository only.

Sources, all of them every time:
- the positive corpus (``corpus/positive``: honest solutions for real KernelBench problems at
  today's sizes, with expected verdicts in ``expected/level*.toml``), whatever it holds;
- the CUDA hack candidates of the guards' adversarial corpus
  (``packages/guards/tests/adversarial/corpus.py``), built against the real KernelBench L1/19
  ReLU (the positive corpus's verbatim copy) where their kernel computes a ReLU;
- ``data/cuda_l1_subset.jsonl``: a fixed subset of CUDA-L1's released H100 solutions (MIT,
  ``data/LICENSE-CUDA-L1``), each with the v0 reference it was written for (``extract-cuda-l1``
  made it; the rule is in :func:`select_cuda_l1`).

Each candidate's ``meta["bench"]`` says where it came from (``id``, ``source``, ``honest``,
``expected``), the bytes its inputs take (``input_mb``, from ``get_inputs()`` on the meta device)
and whether it belongs to the subset that KernelBench's own harness also runs (``kb_subset``).
The order is a fixed shuffle (sha256 of the ids), so a run cut short by its time budget has
evaluated a mixed prefix; ids and order depend only on the files.

Usage:
  python throughput_batch.py build -o batch.jsonl          # prints count, subset size, sha256
  python throughput_batch.py extract-cuda-l1 --src ../shared/corpora/cuda-l1/h100_even_tasks.jsonl \
      --kernelbench ../shared/kernelbench/KernelBench      # (re)writes data/cuda_l1_subset.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from cuda_agent.guards.checks import CHECKS
from cuda_agent.kernelbench_eval.corpus import CorpusError, load_corpus
from cuda_agent.kernelbench_eval.tree import kernelbench_task
from cuda_agent.records import Candidate, Solution, Task
from cuda_agent.records.jsonl import encode

HERE = Path(__file__).resolve().parent
PKG = HERE.parent
REPO = PKG.parent.parent
POSITIVE = PKG / "corpus" / "positive"
GUARDS_CORPUS = REPO / "packages" / "guards" / "tests" / "adversarial" / "corpus.py"
CUDA_L1 = HERE / "data" / "cuda_l1_subset.jsonl"

MIN_BATCH = 100
KB_SUBSET_MIN = 20
# KernelBench's harness runs a subset: small and medium problems only (it takes tens of seconds
# per candidate, most of it a load_inline build; inputs of GBs add more per trial on its CPU)
KB_MAX_INPUT_MB = 600.0
KB_POSITIVE = 12
KB_CUDA_L1_KERNEL = 5
KB_HACKS = ("x_side_stream",)
KB_CUDA_L1_PLAIN = ("cudal1/L2/80", "cudal1/L2/96")  # cached zeros; 368x claimed (CUDA graphs)

CUSTOM_KERNEL = re.compile(r"load_inline|cuda_sources|__global__|@triton\.jit")
TRITON = re.compile(r"^\s*(import triton|from triton)", re.M)


# ----------------------------------------------------------------------------- helpers


def input_mb(ref_code: str) -> float | None:
    """MB that one ``get_inputs()`` call of the reference returns, drawn on torch's meta device
    (no memory, no time); None when the reference cannot build its inputs there."""
    import torch

    g: dict[str, Any] = {"__name__": "kb_ref"}
    try:
        with torch.device("meta"):
            exec(compile(ref_code, "<ref>", "exec"), g)
            ins = g["get_inputs"]()
    except Exception:
        return None
    n = sum(t.numel() * t.element_size() for t in ins if isinstance(t, torch.Tensor))
    return round(n / 2**20, 1)


def _order_key(bench_id: str) -> str:
    return hashlib.sha256(bench_id.encode()).hexdigest()


def _cand(task: Task, sol: Solution, bench: dict[str, Any], meta: dict[str, Any]) -> Candidate:
    return Candidate(task=task, solution=sol, meta={**meta, "bench": bench})


def _load_guards_corpus():
    spec = importlib.util.spec_from_file_location("guards_adversarial_corpus", GUARDS_CORPUS)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- sources


def positive_candidates(root: Path = POSITIVE) -> list[Candidate]:
    """Every solution of the positive corpus with its (verbatim) KernelBench problem and expected
    verdict under guard policy ``kernelbench`` (what ``kernelbench-eval run`` applies by default).
    Raises ``CorpusError`` when the corpus does not validate (``load_corpus``)."""
    out = []
    for e in load_corpus(root).entries:
        c, exp = e.candidate, e.expected
        kind = "wd" if c.solution.format == "workdir" else f"s{c.meta['sample']}"
        bench = {
            "id": f"pos/L{c.task.level}/{c.task.problem_id}/{kind}",
            "source": "positive",
            "path": exp.path,
            "honest": True,
            "expected": exp.kernelbench,
            "expected_strict": exp.strict,
            "styles": list(exp.styles),
        }
        out.append(_cand(c.task, c.solution, bench, c.meta))
    return out


def hack_candidates(root: Path = POSITIVE) -> list[Candidate]:
    """The guards' CUDA hacks. Those whose kernel is a ReLU run on KernelBench L1/19 (today's
    size); the others keep their own small reference (said in ``bench.ref``)."""
    corpus = _load_guards_corpus()
    relu_path = root / "KernelBench" / "level1" / "19_ReLU.py"
    kb_relu = relu_path.read_text() if relu_path.is_file() else None
    out = []
    for h in corpus.HACKS:
        if h.backend != "cuda":
            continue
        files = dict(h.files)
        fmt = "workdir" if any(k.startswith("kernels/") for k in files) else "kernelbench"
        on_kb = kb_relu is not None and h.ref == corpus.REF_RELU
        if on_kb:
            task = Task.make("ReLU", kb_relu, source="kernelbench", level=1, problem_id=19)
            meta: dict[str, Any] = {"level": 1, "problem_id": 19, "sample": 0}
        else:
            task = Task.make(h.name, h.ref, source="user")
            meta = {}
        codes = sorted(set(h.static_rejects) | set(h.runtime_rejects))
        # under `kernelbench` (the batch's policy) some of these codes only flag (half precision,
        # torch compute beside a kernel: KernelBench's leaderboard allows both)
        kb_rejects = [c for c in codes if CHECKS[c].severity("kernelbench") == "reject"]
        bench = {
            "id": f"hack/{h.name}",
            "source": "guards-hack",
            "honest": False,
            "expected": "guard_violation" if kb_rejects else "ok",
            "expected_strict": "guard_violation",
            "expected_codes": codes,
            "hack": h.hack,
            "ref": "KernelBench L1/19_ReLU" if on_kb else "guards corpus reference",
        }
        sol = Solution.make(fmt, files, origin=f"guards:{h.name}")
        out.append(_cand(task, sol, bench, meta))
    return out


def cuda_l1_candidates(path: Path = CUDA_L1) -> list[Candidate]:
    """The committed CUDA-L1 lines, each against its own v0 reference."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        lv, pid = int(r["level"]), int(r["problem_id"])
        task = kernelbench_task(
            r["name"], r["ref_code"], lv, pid, meta={"reference": "KernelBench v0 (CUDA-L1's)"}
        )
        sol = Solution.make("kernelbench", {"model_new.py": r["code"]}, f"cuda-l1:L{lv}/{pid}")
        bench = {
            "id": f"cudal1/L{lv}/{pid}",
            "source": "cuda-l1",
            "honest": None,
            "expected": None,
            "custom_kernel": bool(CUSTOM_KERNEL.search(r["code"])),
            "claimed_speedup": r.get("claimed_speedup_vs_eager_h100"),
        }
        out.append(_cand(task, sol, bench, {"level": lv, "problem_id": pid, "sample": 0}))
    return out


# ----------------------------------------------------------------------------- the batch


def _kb_ok(c: Candidate) -> bool:
    """KernelBench's harness takes one model_new.py with load_inline (or plain PyTorch)."""
    b = c.meta["bench"]
    code = c.solution.files.get("model_new.py", "")
    mb = b.get("input_mb")
    return (
        c.solution.format == "kernelbench"
        and not TRITON.search(code)
        and mb is not None
        and mb <= KB_MAX_INPUT_MB
    )


def choose_kb_subset(cands: list[Candidate]) -> list[str]:
    """Bench ids of the KernelBench-harness subset (>= 20 when the sources allow): up to 12 of the
    positive corpus's smallest problems (the smallest of each level in turn, one solution each:
    the candidates our evaluator takes through the device), CUDA-L1's smallest custom-kernel lines
    (5, more when the corpus has fewer), two plain-PyTorch CUDA-L1 hacks (L2/80's cached zeros,
    L2/96's claimed 368x) and the guards' side-stream hack (on the 6 GB L1/19: last, the
    costliest for KernelBench's harness). Only single-file candidates of inputs <= 600 MB."""
    by_src: dict[str, list[Candidate]] = {}
    for c in cands:
        by_src.setdefault(c.meta["bench"]["source"], []).append(c)

    def small(cs: list[Candidate]) -> list[Candidate]:
        return sorted(
            (c for c in cs if _kb_ok(c)),
            key=lambda c: (c.meta["bench"]["input_mb"], c.meta["bench"]["id"]),
        )

    # the smallest problem of each level in turn (one solution per problem)
    per_level: dict[int, list[Candidate]] = {}
    seen: set[tuple[int, int]] = set()
    for c in small(by_src.get("positive", [])):
        if (c.task.level, c.task.problem_id) not in seen:
            seen.add((c.task.level, c.task.problem_id))
            per_level.setdefault(int(c.task.level or 0), []).append(c)
    pos: list[Candidate] = []
    while len(pos) < KB_POSITIVE and any(per_level.values()):
        for lv in sorted(per_level):
            if per_level[lv] and len(pos) < KB_POSITIVE:
                pos.append(per_level[lv].pop(0))
    l1 = by_src.get("cuda-l1", [])
    kern = small([c for c in l1 if c.meta["bench"]["custom_kernel"]])
    plain = small([c for c in l1 if not c.meta["bench"]["custom_kernel"]])
    plain_pick = [c for c in plain if c.meta["bench"]["id"] in KB_CUDA_L1_PLAIN]
    n_kern = KB_CUDA_L1_KERNEL + max(0, KB_POSITIVE - len(pos))  # fill when the corpus is short
    hacks = [
        c for c in by_src.get("guards-hack", []) if c.meta["bench"]["id"].split("/")[1] in KB_HACKS
    ]
    pick = pos + kern[:n_kern] + plain_pick + hacks
    return [c.meta["bench"]["id"] for c in pick]


def build_batch(positive: Path = POSITIVE) -> list[Candidate]:
    """The whole batch in its fixed order, ``kb_subset`` and ``input_mb`` filled in."""
    cands = positive_candidates(positive) + hack_candidates(positive) + cuda_l1_candidates()
    sizes: dict[str, float | None] = {}
    for c in cands:
        tid = c.task.id
        if tid not in sizes:
            sizes[tid] = input_mb(c.task.ref_code)
        c.meta["bench"]["input_mb"] = sizes[tid]
    ids = [c.meta["bench"]["id"] for c in cands]
    dup = {i for i in ids if ids.count(i) > 1}
    keys = [c.key for c in cands]
    if dup or len(set(keys)) != len(keys):
        raise SystemExit(f"throughput_batch: duplicate ids or candidate keys: {sorted(dup)}")
    subset = set(choose_kb_subset(cands))
    for c in cands:
        c.meta["bench"]["kb_subset"] = c.meta["bench"]["id"] in subset
    # subset members stay in their subset order among themselves (the costliest last), the
    # batch as a whole in the fixed shuffle
    return sorted(cands, key=lambda c: _order_key(c.meta["bench"]["id"]))


def subset_in_order(cands: list[Candidate]) -> list[Candidate]:
    """The KernelBench-harness subset in :func:`choose_kb_subset`'s order."""
    order = {i: n for n, i in enumerate(choose_kb_subset(cands))}
    sub = [c for c in cands if c.meta["bench"]["id"] in order]
    return sorted(sub, key=lambda c: order[c.meta["bench"]["id"]])


def device_tasks(cands: list[Candidate]) -> list[Task]:
    """The batch's tasks whose candidates can reach the device, once each in batch order: every
    source but CUDA-L1's lines (the default guard policy rejects all of them statically). Their
    baselines, measured once beforehand (``kb_references.py run --tasks``), are what a user's
    later runs reuse."""
    seen: dict[str, Task] = {}
    for c in cands:
        if c.meta["bench"]["source"] != "cuda-l1":
            seen.setdefault(c.task.id, c.task)
    return list(seen.values())


def batch_sha256(cands: list[Candidate]) -> str:
    h = hashlib.sha256()
    for c in cands:
        h.update(encode(c))
    return h.hexdigest()


# ----------------------------------------------------------------------------- CUDA-L1 subset


def select_cuda_l1(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fixed rule: every line with a custom kernel (load_inline / cuda_sources / __global__)
    and every plain-PyTorch line claiming >= 2x over eager on H100 (where cached outputs,
    skipped work and CUDA-graph tricks are); lines without code ('None') are left out."""
    keep = []
    for r in rows:
        code = r.get("code") or ""
        if code.strip() in ("", "None"):
            continue
        if CUSTOM_KERNEL.search(code) or (r.get("claimed_speedup_vs_eager_h100") or 0) >= 2:
            keep.append(r)
    return sorted(keep, key=lambda r: (int(r["level"]), int(r["problem_id"])))


def extract_cuda_l1(src: Path, kernelbench: Path | None, dest: Path = CUDA_L1) -> int:
    rows = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    out = []
    for r in select_cuda_l1(rows):
        name = f"L{r['level']}_{r['problem_id']}"
        if kernelbench is not None:
            hits = sorted((kernelbench / f"level{r['level']}").glob(f"{r['problem_id']}_*.py"))
            if hits:
                name = hits[0].stem.split("_", 1)[1]
        out.append(
            {
                "level": int(r["level"]),
                "problem_id": int(r["problem_id"]),
                "name": name,
                "claimed_speedup_vs_eager_h100": r.get("claimed_speedup_vs_eager_h100"),
                "ref_code": r["ref_code"],
                "code": r["code"],
            }
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps(o, sort_keys=True) + "\n" for o in out))
    return len(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the batch (JSONL Candidate records)")
    b.add_argument("-o", "--output", type=Path, required=True)
    b.add_argument("--subset-output", type=Path, help="also the KernelBench-harness subset")
    b.add_argument("--positive", type=Path, default=POSITIVE, help="positive corpus root")
    b.add_argument("--min", type=int, default=MIN_BATCH, help="exit 3 when fewer (default 100)")
    b.add_argument(
        "--tasks-output",
        type=Path,
        help="also the tasks that can reach the device (Task JSONL, for kb_references.py)",
    )
    e = sub.add_parser("extract-cuda-l1", help="(re)write data/cuda_l1_subset.jsonl")
    e.add_argument("--src", type=Path, required=True)
    e.add_argument("--kernelbench", type=Path, help="KernelBench/ folder (problem names)")
    a = ap.parse_args(argv)
    if a.cmd == "extract-cuda-l1":
        n = extract_cuda_l1(a.src, a.kernelbench)
        print(f"{n} CUDA-L1 lines -> {CUDA_L1}", file=sys.stderr)
        return 0
    try:
        cands = build_batch(a.positive)
    except CorpusError as e:
        print(f"throughput_batch: the positive corpus does not validate: {e}", file=sys.stderr)
        return 2
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_bytes(b"".join(encode(c) for c in cands))
    subset = subset_in_order(cands)
    if a.subset_output:
        a.subset_output.write_bytes(b"".join(encode(c) for c in subset))
    if a.tasks_output:
        a.tasks_output.write_bytes(b"".join(encode(t) for t in device_tasks(cands)))
    count: dict[str, int] = {}
    for c in cands:
        count[c.meta["bench"]["source"]] = count.get(c.meta["bench"]["source"], 0) + 1
    info = {
        "candidates": len(cands),
        "by_source": count,
        "kb_subset": len(subset),
        "sha256": batch_sha256(cands),
    }
    print(json.dumps(info))
    if len(cands) < a.min:
        print(f"throughput_batch: only {len(cands)} candidates (< {a.min})", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
