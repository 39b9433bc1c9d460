"""The positive corpus (corpus/positive): it validates, it is as large and as varied as the issue
asks, the static guards give every solution exactly its expected verdict under `strict` and
`kernelbench`, and `kernelbench-eval solutions` imports every solution. The GPU test evaluates a
few of them through the real sandbox."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections import Counter

import pytest

from cuda_agent.kernelbench_eval.corpus import (
    DEFAULT_ROOT,
    STYLES,
    CorpusError,
    Entry,
    load_corpus,
    read_expected,
)

CLI = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli"]
POLICIES = ("strict", "kernelbench")


def _entries() -> list[Entry]:
    """The whole corpus's entries; while it does not validate (test_corpus_validates says why),
    those of each level that does on its own."""
    try:
        return load_corpus().entries
    except CorpusError:
        out: list[Entry] = []
        for level in (1, 2, 3):
            with contextlib.suppress(CorpusError):
                out += load_corpus(levels={level}).entries
        return out


ENTRIES = _entries()


def test_corpus_validates():
    corpus = load_corpus()
    assert corpus.entries
    assert all(e.candidate.task.source == "kernelbench" for e in corpus.entries)


def test_validation_catches_bad_tables(tmp_path):
    import shutil

    root = tmp_path / "positive"
    shutil.copytree(DEFAULT_ROOT, root)
    f = root / "expected" / "level1.toml"
    good = f.read_text()
    bad = {
        "unknown key": good.replace('note = "', 'notes = "x"\nnote = "', 1),
        "unknown style": good.replace('styles = ["', 'styles = ["hand-tuned", "', 1),
        "bad status": good.replace('strict = "ok"', 'strict = "rejected"', 1),
        "missing path": good.replace("_sample_0_kernel.py", "_sample_7_kernel.py", 1),
    }
    load_corpus(root, levels={1})
    for what, text in bad.items():
        f.write_text(text)
        with pytest.raises(CorpusError):
            load_corpus(root, levels={1})
            pytest.fail(f"{what}: validated")
        f.write_text(good)
    # a solution on disk without a table is an error too
    (root / "solutions" / "level_1_problem_12_sample_9_kernel.py").write_text(
        (root / "solutions" / "level_1_problem_12_sample_0_kernel.py").read_text() + "\n# copy\n"
    )
    with pytest.raises(CorpusError, match="without a table"):
        load_corpus(root, levels={1})


def test_corpus_size_levels_and_styles():
    # fails until the level-2/3 half of the corpus is in (the issue asks for >= 40 over 1-3)
    expected, errors = read_expected(DEFAULT_ROOT)
    assert not errors
    assert len(expected) >= 40, f"{len(expected)} solutions"
    assert {s.level for s in expected} >= {1, 2, 3}
    seen = Counter(st for s in expected for st in s.styles)
    assert set(STYLES) <= set(seen), f"styles never used: {sorted(set(STYLES) - set(seen))}"
    # the style that broke graph timing, on short programs too
    assert seen["default-stream"] >= 6
    assert any({"default-stream", "sub-50us"} <= set(s.styles) for s in expected)
    assert seen["workdir"] >= 3


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.expected.path.removeprefix("solutions/"))
def test_static_guards_give_the_expected_verdict(entry: Entry, policy: str):
    from cuda_agent.guards.api import static_checks

    status, code = entry.expected.expected(policy)
    # as the sandbox calls them (cuda_agent.sandbox.evaluate._static_guards)
    findings = static_checks(entry.candidate, policy, own_modules=("cuda_extension",))
    rejects = {g.code for g in findings if g.severity == "reject"}
    # an expected guard_violation may come from the runtime checks instead: statically, nothing
    # but that code may reject
    allowed = {code} if status == "guard_violation" else set()
    assert rejects <= allowed, [
        (g.code, g.message) for g in findings if g.severity == "reject" and g.code not in allowed
    ]


def test_solutions_cli_imports_every_solution():
    root = str(DEFAULT_ROOT)
    tasks = subprocess.run(
        [*CLI, "tasks", "--root", root, "--strict"], capture_output=True, timeout=300
    )
    assert tasks.returncode == 0, tasks.stderr.decode()[-2000:]
    cands = subprocess.run(
        [*CLI, "solutions", "--dir", f"{root}/solutions"],
        input=tasks.stdout,
        capture_output=True,
        timeout=300,
    )
    assert cands.returncode == 0, cands.stderr.decode()[-2000:]
    err = cands.stderr.decode()
    assert "unreadable" not in err and "no such task" not in err and "no solution" not in err, err
    got = [json.loads(x) for x in cands.stdout.splitlines()]
    corpus = load_corpus()
    by_id = {c["solution"]["id"]: c for c in got}
    assert len(got) == len(corpus.entries)
    for e in corpus.entries:
        c = by_id[e.candidate.solution.id]
        assert (c["task"]["level"], c["task"]["problem_id"]) == (
            e.expected.level,
            e.expected.problem,
        )
        assert c["solution"]["format"] == (
            "workdir" if "workdir" in e.expected.styles else "kernelbench"
        )


# A diag(A) @ B row scaling on the default stream (a ~50 us program), the tanh-GELU on the default
# stream without error checks (~0.14 ms), and a CUDA-Agent workdir calling cuBLAS.
GPU_SUBSET = (
    "solutions/level_1_problem_12_sample_0_kernel.py",
    "solutions/level_1_problem_88_sample_0_kernel.py",
    "solutions/level1/2_Standard_matrix_multiplication_",
)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", GPU_SUBSET)
def test_gpu_sandbox_gives_the_expected_status(path: str):
    from cuda_agent.sandbox import SandboxConfig, evaluate

    entry = {e.expected.path: e for e in load_corpus().entries}[path]
    status, code = entry.expected.expected("strict")
    r = evaluate(entry.candidate, SandboxConfig(backend="cuda", guard_policy="strict"))
    rejects = [(g.code, g.message[:200]) for g in r.guards if g.severity == "reject"]
    assert str(r.status) == status, (r.status, r.message[:500], rejects)
    if status == "ok":
        assert not rejects
        assert r.speedup_vs_eager is not None and r.speedup_vs_eager > 0
    else:
        assert code in {c for c, _ in rejects}


def _checker():
    import importlib.util

    path = DEFAULT_ROOT.parents[1] / "benchmarks" / "positive_corpus.py"
    spec = importlib.util.spec_from_file_location("kb_positive_corpus_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _expected_result(e: Entry, policy: str, speedup: float, meta: dict):
    """The result `kernelbench-eval run` writes when ``e`` gets its expected verdict under
    ``policy`` (its expected rejection, else ok at ``speedup``)."""
    from cuda_agent.records import EvalResult, GuardViolation

    status, code = e.expected.expected(policy)
    return EvalResult(
        task_id=e.candidate.task.id,
        solution_id=e.candidate.solution.id,
        backend="cuda",
        device="NVIDIA H200",
        status=status,
        guards=[GuardViolation(code=code, severity="reject", message="x")] if code else [],
        speedup_vs_eager=None if code else speedup,
        meta=meta,
    )


def test_gpu_checker_on_synthetic_results(tmp_path, capsys):
    """benchmarks/positive_corpus.py check: table, false rejections and the 3% rule, on
    results written as `kernelbench-eval run` writes them (level 1 of the corpus)."""
    from cuda_agent.records import GuardViolation, RecordWriter

    bench = _checker()
    corpus = load_corpus(levels={1})

    def write(name, tweak=lambda e, r: r, policy="strict"):
        p = tmp_path / name
        w = RecordWriter(p)
        for i, e in enumerate(corpus.entries):
            r = _expected_result(e, policy, 1.0 + i / 10, {"guard_policy": policy})
            w.write(tweak(e, r))
        w.close()
        return p

    L1 = ["--levels", "1"]
    first = write("r1.jsonl")
    assert bench.main(["check", str(first), *L1]) == 0
    out = capsys.readouterr().out
    assert "0 false rejections" in out and out.count("\n| ") == len(corpus.entries)
    # within 3% between two runs: fine; 5%: unstable (exit 3)
    import msgspec

    def scaled(f):
        return lambda e, r: msgspec.structs.replace(
            r, speedup_vs_eager=r.speedup_vs_eager and r.speedup_vs_eager * f
        )

    assert bench.main(["check", str(first), str(write("r2.jsonl", scaled(1.02))), *L1]) == 0
    assert bench.main(["check", str(first), str(write("r3.jsonl", scaled(1.05))), *L1]) == 3
    assert "UNSTABLE" in capsys.readouterr().out
    # an unstable row says which side moved and where each run was timed
    from cuda_agent.records import TimingDetail, TimingStats

    def timed(ms, gpu):
        def tweak(e, r):
            st = TimingStats(median_ms=ms, n=10, sm_clock_mhz=1980.0, gpu_uuid=gpu)
            eager = TimingStats(median_ms=2.0, n=10, sm_clock_mhz=1980.0, gpu_uuid=gpu)
            t = TimingDetail(protocol_version="x", candidate=st, eager=eager)
            sp = r.speedup_vs_eager and 2.0 / ms
            return msgspec.structs.replace(r, timing=t, speedup_vs_eager=sp)

        return tweak

    a, b = write("t1.jsonl", timed(1.0, "GPU-a")), write("t2.jsonl", timed(1.1, "GPU-b"))
    js = tmp_path / "check.json"
    assert bench.main(["check", str(a), str(b), *L1, "--json", str(js)]) == 3
    rows = [r for r in json.loads(js.read_text())["rows"] if r["verdict"] == "UNSTABLE"]
    assert rows and "candidate 1 -> 1.1 ms, SM 1980 -> 1980 MHz, another GPU" in rows[0]["message"]
    assert "eager 2 -> 2 ms" in rows[0]["message"]
    # the diag solution rejected by G-SOL: a false rejection (exit 1)
    diag = "solutions/level_1_problem_12_sample_0_kernel.py"

    def reject(e, r):
        if e.expected.path != diag:
            return r
        g = [GuardViolation(code="G-SOL", severity="reject", message="below speed of light")]
        return msgspec.structs.replace(r, status="guard_violation", guards=g)

    js = tmp_path / "rows.json"
    assert bench.main(["check", str(write("r4.jsonl", reject)), "--json", str(js), *L1]) == 1
    rows = {r["path"]: r for r in json.loads(js.read_text())["rows"]}
    assert rows[diag.removeprefix("solutions/")]["verdict"] == "FALSE-REJECTION"

    # the expected strict rejection (G-TORCH-COMPUTE) that comes out ok: a mismatch (exit 3)
    def accept(e, r):
        if e.expected.strict == "ok":
            return r
        return msgspec.structs.replace(r, status="ok", guards=[], speedup_vs_eager=2.0)

    assert bench.main(["check", str(write("r5.jsonl", accept)), *L1]) == 3

    # a missing result: exit 3
    def drop(e, r):
        return r if e.expected.problem != 5 else msgspec.structs.replace(r, solution_id="x")

    assert bench.main(["check", str(write("r6.jsonl", drop)), *L1]) == 3

    # two separate runs under the two policies: each judged under its own, the 3% check between
    # them (a solution strict rejects has a speed-up only under kernelbench: no ratio)
    kb = write("kb.jsonl", scaled(1.01), policy="kernelbench")
    assert any(e.expected.strict != e.expected.kernelbench for e in corpus.entries)
    assert bench.main(["check", str(first), str(kb), "--json", str(js), *L1]) == 0
    doc = json.loads(js.read_text())
    assert doc["policy"] == "strict / kernelbench"
    # strict's expectation applied to the kernelbench run is a mismatch
    with pytest.raises(SystemExit, match="not --policy strict"):
        bench.main(["check", str(first), str(kb), "--policy", "strict", *L1])


def test_gpu_checker_summarises_the_robust_setting(tmp_path, capsys):
    """On results of the robust setting (stress trials, shape check) `check` says how many
    solutions expected ok kept passing, why the others did not, and which stress variants the
    reference's instability skipped; on plain results it says nothing of it."""
    import msgspec

    from cuda_agent.records import RecordWriter

    bench = _checker()
    corpus = load_corpus(levels={1})
    honest = [e for e in corpus.entries if e.expected.expected("strict")[0] == "ok"]
    stress_fail, shape_fail = honest[0].candidate.solution.id, honest[1].candidate.solution.id
    ran = {"variants": ["nan_inf", "denormal", "near_max", "offset"], "failed": []}

    def write(name, robust: bool):
        p = tmp_path / name
        with RecordWriter(p) as w:
            for e in corpus.entries:
                meta: dict = {"guard_policy": "strict"}
                if robust:
                    meta["stress_trials"] = {
                        **ran,
                        "reference_unstable": [
                            {"trial": 5, "variant": "near_max", "reason": "inf"}
                        ],
                    }
                    meta["shape_check"] = {"passed": True}
                r = _expected_result(e, "strict", 1.5, meta)
                if robust and r.solution_id == stress_fail:
                    failed = [{"trial": 6, "variant": "denormal", "message": "mismatch"}]
                    r = msgspec.structs.replace(
                        r,
                        status="incorrect",
                        meta={**meta, "stress_trials": {**ran, "failed": failed}},
                    )
                if robust and r.solution_id == shape_fail:
                    r = msgspec.structs.replace(
                        r, status="incorrect", meta={**meta, "shape_check": {"passed": False}}
                    )
                w.write(r)
        return p

    assert bench.main(["check", str(write("plain.jsonl", False)), "--levels", "1"]) == 0
    assert "Robust setting" not in capsys.readouterr().out
    assert bench.main(["check", str(write("robust.jsonl", True)), "--levels", "1"]) == 3
    out = capsys.readouterr().out
    n = len(honest)
    assert f"Robust setting: {n - 2} of {n} solutions expected `ok` under `strict` passed" in out
    assert "| stress trial `denormal` | 1 |" in out and "| shape check | 1 |" in out
    assert f"the reference unstable under them: `near_max` {n - 1}" in out


def test_gpu_checker_refuses_a_compile_mode_without_a_compile_baseline(tmp_path):
    bench = _checker()
    with pytest.raises(SystemExit, match="needs --compile-baseline"):
        bench.main(["run", "--out", str(tmp_path), "--baseline-compile-mode", "max-autotune"])
    assert not any(tmp_path.iterdir())  # refused before anything ran
