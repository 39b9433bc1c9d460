"""``opsynth``: crawl seed operators, compose fused tasks, filter, dedup, import Ops-6K.

Every command writes Task records as JSONL on stdout (or ``-o FILE``); messages go to stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import (
    ClaimOpt,
    InputArg,
    OnErrorOpt,
    OutputOpt,
    ResumeOpt,
    ShardOpt,
    StreamFlags,
    bundle_options,
    fail,
    log,
)
from cuda_agent.records.cli_helpers import OnError as OnErrorT

app = typer.Typer(
    help="Synthesise fused PyTorch operator tasks (a CUDA-Agent-Ops-6K-class training set).\n\n"
    "Example: opsynth compose --n 100 --seed 0 | opsynth filter --backend cpu | "
    "opsynth dedup --kernelbench ~/KernelBench > tasks.jsonl",
    no_args_is_help=True,
    add_completion=False,
)

SizeOpt = Annotated[
    str,
    typer.Option(
        "--size",
        help="Size preset of shapes: gpu (KernelBench level-2 sizes), cpu, tiny (tests).",
    ),
]
RejectedOpt = Annotated[
    Path | None,
    typer.Option("--rejected", "--dropped", help="Append every dropped task (with reason) here."),
]
CategoryOpt = Annotated[
    list[str] | None,
    typer.Option("--category", "-c", help="Only seeds of this category (repeatable)."),
]


def _check_size(size: str) -> None:
    from .builder import SIZE_PRESETS

    if size not in SIZE_PRESETS:
        raise fail(f"--size must be one of {', '.join(SIZE_PRESETS)}, got {size!r}")


def _check_categories(categories: list[str] | None) -> None:
    from .catalog import CATEGORIES

    for c in categories or []:
        if c not in CATEGORIES:
            raise fail(f"unknown category {c!r}; known: {', '.join(CATEGORIES)}")


def _parse_lengths(spec: str | None) -> dict[int, float] | None:
    if not spec:
        return None
    out: dict[int, float] = {}
    try:
        for part in spec.split(","):
            k, v = part.split(":")
            out[int(k)] = float(v)
    except ValueError:
        raise typer.BadParameter(f"--lengths must look like 2:0.3,3:0.4, got {spec!r}") from None
    return out


@app.command()
def crawl(
    output: OutputOpt = None,
    size: SizeOpt = "gpu",
    category: CategoryOpt = None,
    probe: Annotated[
        bool, typer.Option("--probe/--no-probe", help="Run each seed on the CPU (RNG probe).")
    ] = True,
    coverage: Annotated[
        bool,
        typer.Option("--coverage", help="Print which torch nn modules / F functions are covered."),
    ] = False,
) -> None:
    """One single-operator Task per seed in the catalogue that exists in the installed torch.

    Example: opsynth crawl --size gpu > seeds.jsonl
    """
    _check_size(size)
    _check_categories(category)
    from cuda_agent.records.jsonl import RecordWriter

    from .crawl import coverage as cov
    from .crawl import crawl as do_crawl

    if coverage:
        c = cov()
        log(f"covered ops: {len(c['covered'])}")
        log(f"nn modules not covered ({len(c['nn_not_covered'])}): {' '.join(c['nn_not_covered'])}")
        log(f"F functions not covered ({len(c['F_not_covered'])}): {' '.join(c['F_not_covered'])}")
    counts: dict[str, int] = {}
    n_stoch = 0
    with RecordWriter(output) as w:
        for t in do_crawl(size=size, categories=category, probe=probe, log=log):
            w.write(t)
            cat = t.meta["categories"][0]
            counts[cat] = counts.get(cat, 0) + 1
            n_stoch += bool(t.meta.get("stochastic"))
    log(
        f"crawl: {sum(counts.values())} seeds ({n_stoch} stochastic): "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )


@app.command()
def compose(
    n: Annotated[int, typer.Option("--n", help="Number of distinct tasks to write.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="Random seed (same seed, same tasks).")] = 0,
    max_ops: Annotated[int, typer.Option("--max-ops", help="Longest chain (1-5).")] = 5,
    lengths: Annotated[
        str | None,
        typer.Option(
            "--lengths",
            help="Length weights, e.g. '1:0.05,2:0.25,3:0.35,4:0.25,5:0.1' (the default).",
        ),
    ] = None,
    heavy_first: Annotated[
        float, typer.Option("--heavy-first", help="P(chain starts with GEMM/conv/attention).")
    ] = 0.75,
    second_heavy: Annotated[
        float, typer.Option("--second-heavy", help="P(a later position is another heavy op).")
    ] = 0.15,
    size: SizeOpt = "gpu",
    category: CategoryOpt = None,
    allow_stochastic: Annotated[
        bool,
        typer.Option("--allow-stochastic", help="Also draw stochastic seeds (dropout, noise)."),
    ] = False,
    seeds: Annotated[
        Path | None,
        typer.Option(
            "--seeds",
            help="Seed tasks from `opsynth crawl` ('-' = stdin): draw only these, and leave out "
            "those the crawl measured as stochastic (unless --allow-stochastic).",
        ),
    ] = None,
    llm: Annotated[
        str | None,
        typer.Option(
            "--llm",
            help="OpenAI-compatible base URL: the model writes each composition (validated, "
            "falls back to the programmatic one). Key from $OPENAI_API_KEY if set.",
        ),
    ] = None,
    llm_model: Annotated[
        str, typer.Option("--llm-model", help="Model name for --llm.")
    ] = "default",
    output: OutputOpt = None,
    resume: ResumeOpt = False,
) -> None:
    """Chain 1..max-ops seeds into fused tasks whose shapes agree (KernelBench level-2 style).

    Example: opsynth compose --n 500 --max-ops 5 --seed 0 --size gpu -o composed.jsonl
    """
    _check_size(size)
    _check_categories(category)
    if not 1 <= max_ops <= 5:
        raise fail("--max-ops must be in 1..5")
    from cuda_agent.records.jsonl import RecordWriter, done_keys

    from .compose import DEFAULT_LENGTH_WEIGHTS, ComposeConfig, ComposeError
    from .compose import compose as do_compose

    if resume and output is None:
        raise fail("--resume needs -o FILE")
    cfg = ComposeConfig(
        max_ops=max_ops,
        length_weights=_parse_lengths(lengths) or dict(DEFAULT_LENGTH_WEIGHTS),
        heavy_first=heavy_first,
        second_heavy=second_heavy,
        size=size,
        include_stochastic=allow_stochastic,
        categories=category,
    )
    if seeds is not None:
        from cuda_agent.records.jsonl import load_records
        from cuda_agent.records.types import Task

        src = "/dev/stdin" if str(seeds) == "-" else seeds
        names = set()
        for t in load_records(src):
            if isinstance(t, Task) and t.meta.get("seeds"):
                if t.meta.get("stochastic") and not allow_stochastic:
                    continue
                names.add(t.meta["seeds"][0])
        if not names:
            raise fail(f"compose: no seed tasks in {seeds}")
        cfg.seed_names = names
        log(f"compose: {len(names)} seeds from {seeds}")
    if llm:
        from .llm import LLMConfig

        cfg.llm = LLMConfig(url=llm, model=llm_model)
    done = done_keys(output) if resume and output is not None else set()
    hist: dict[int, int] = {}
    written = 0
    try:
        with RecordWriter(output) as w:
            for t in do_compose(n, seed, cfg):
                hist[t.meta["n_ops"]] = hist.get(t.meta["n_ops"], 0) + 1
                if t.id in done:
                    continue
                w.write(t)
                written += 1
    except (ComposeError, ValueError) as e:
        raise fail(f"compose: {e}") from None
    skipped = f", {len(done)} already in {output}" if done else ""
    log(
        f"compose: {written} tasks written{skipped}; lengths "
        + ", ".join(f"{k}:{v}" for k, v in sorted(hist.items()))
    )


@app.command("filter")
@bundle_options("stream", StreamFlags)
def filter_cmd(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnErrorT.stop,
    shard: ShardOpt = None,
    claim: ClaimOpt = None,
    backend: Annotated[str, typer.Option("--backend", help="cpu or cuda.")] = "cpu",
    min_ms: Annotated[
        float | None,
        typer.Option("--min-ms", help="Lower end of the eager window (cuda 1, cpu 1)."),
    ] = None,
    max_ms: Annotated[
        float | None,
        typer.Option("--max-ms", help="Upper end of the eager window (cuda 100, cpu 1000)."),
    ] = None,
    compile_check: Annotated[
        bool,
        typer.Option("--compile/--no-compile", help="Also run under torch.compile and compare."),
    ] = True,
    compile_backend: Annotated[
        str,
        typer.Option(
            "--compile-backend", help="inductor (real codegen) or aot_eager (graph capture only)."
        ),
    ] = "inductor",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds per task (SIGKILL).")
    ] = 180.0,
    mem_gb: Annotated[
        float, typer.Option("--mem-gb", help="Address-space cap per task (GiB).")
    ] = 16.0,
    isolation: Annotated[
        str, typer.Option("--isolation", help="fork (zygote, fast) or spawn (new interpreter).")
    ] = "fork",
    rescale: Annotated[
        bool,
        typer.Option("--rescale/--no-rescale", help="Rescale batch_size to enter the window."),
    ] = True,
    mode: Annotated[str, typer.Option("--mode", help="Model mode for output checks.")] = "eval",
    threads: Annotated[int, typer.Option("--threads", help="torch CPU threads per task.")] = 1,
    shrink: Annotated[
        int | None,
        typer.Option(
            "--shrink",
            help="Check a shrunk copy: halve module-level size constants until the inputs hold "
            "<= N elements (CPU studies of GPU-sized sets; the kept task is the original).",
        ),
    ] = None,
    time_budget: Annotated[
        float, typer.Option("--time-budget", help="Seconds of eager timing per task.")
    ] = 2.0,
    rejected: RejectedOpt = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Filter processes sharing one task queue (needs an input file and -o); on cuda "
            "they share this process's GPU, timings serialised.",
        ),
    ] = 1,
    *,
    stream: StreamFlags,
) -> None:
    """Keep tasks that run in eager and compiled mode, are deterministic, depend on their inputs,
    give finite non-constant outputs and whose eager time is inside the backend's window.

    Every task runs in a fresh process with a timeout; each drop has a reason (counted on stderr,
    records with meta.rejected in --rejected FILE).

    Example: opsynth compose --n 50 --size cpu | opsynth filter --backend cpu --no-compile
    --rejected dropped.jsonl > kept.jsonl

    Parallel workers: ``--workers 12 composed.jsonl -o kept.jsonl --rejected dropped.jsonl``
    (one queue, outputs merged; a stopped run resumes with ``--resume``), or start processes
    yourself with the same ``--claim DIR`` and their own ``-o`` / ``--rejected`` files.
    """
    if workers > 1:
        from .workers import run_workers

        if input is None or str(input) == "-" or output is None:
            raise fail("--workers needs an input file and -o FILE")
        if claim is not None:
            raise fail("--workers makes its own queue: drop --claim")
        child = [str(input), "--backend", backend, "--on-error", on_error.value]
        child += ["--compile" if compile_check else "--no-compile"]
        child += ["--compile-backend", compile_backend, "--timeout", str(timeout)]
        child += ["--mem-gb", str(mem_gb), "--isolation", isolation, "--mode", mode]
        child += ["--rescale" if rescale else "--no-rescale", "--threads", str(threads)]
        child += ["--time-budget", str(time_budget)]
        for flag, value in (
            ("--min-ms", min_ms),
            ("--max-ms", max_ms),
            ("--shrink", shrink),
            ("--shard", shard),
        ):
            if value is not None:
                child += [flag, str(value)]
        code = run_workers(workers, child, output, rejected, resume)
        if code:
            raise typer.Exit(code)
        return
    from cuda_agent.records.jsonl import RecordWriter, load_records, repair_tail
    from cuda_agent.records.types import Task

    from .filter import WINDOWS_MS, FilterConfig, TaskFilter, input_id

    if backend not in WINDOWS_MS:
        raise fail(f"--backend must be cpu or cuda, got {backend!r}")
    if isolation not in ("fork", "spawn"):
        raise fail("--isolation must be fork or spawn")
    if mode not in ("eval", "train"):
        raise fail("--mode must be eval or train")
    lo, hi = WINDOWS_MS[backend]
    window = (lo if min_ms is None else min_ms, hi if max_ms is None else max_ms)
    if window[0] > window[1]:
        raise fail(f"empty window {window}")
    cfg = FilterConfig(
        backend=backend,
        window_ms=window,
        compile=compile_check,
        compile_backend=compile_backend,
        mode=mode,
        timeout_s=timeout,
        mem_gb=mem_gb or None,
        rescale=rescale,
        isolation=isolation,
        threads=threads,
        time_budget_s=time_budget,
        shrink_numel=shrink,
    )
    already: set[str] = set()
    if resume:
        for path in (output, rejected):
            if path is not None and path.exists():
                repair_tail(path)  # a worker stopped mid-write leaves half a line
                for t in load_records(path):
                    if isinstance(t, Task):
                        already.add(input_id(t.meta, t.id))
    tf = TaskFilter(cfg)
    rej = RecordWriter(rejected) if rejected is not None else None

    def process(task: Task):
        if task.id in already:
            return
        v = tf.check(task)
        if v.passed:
            yield v.task
        else:
            log(f"drop {task.name} [{task.id}]: {v.reason}: {v.detail[:200]}")
            if rej is not None:
                rej.write(v.task)

    try:
        stream.run(process, expect=(Task,), desc="filter")
    finally:
        tf.close()
        if rej is not None:
            rej.close()
        log(tf.summary())


SigMode = Annotated[str, typer.Option(help="full (ops + hyper-parameters), ops, or off.")]


@app.command()
@bundle_options("stream", StreamFlags)
def dedup(
    input: InputArg = None,
    output: OutputOpt = None,
    resume: ResumeOpt = False,
    on_error: OnErrorOpt = OnErrorT.stop,
    kernelbench: Annotated[
        list[Path] | None,
        typer.Option(
            "--kernelbench",
            "--against",
            help="Reference set: a KernelBench checkout (level*/*.py) or a JSONL task file "
            "(repeatable).",
        ),
    ] = None,
    ref_threshold: Annotated[
        float, typer.Option("--ref-threshold", help="Drop if Jaccard to a reference >= this.")
    ] = 0.8,
    self_threshold: Annotated[
        float, typer.Option("--self-threshold", help="Drop if Jaccard to a kept task >= this.")
    ] = 0.9,
    ref_signature: SigMode = "full",
    self_signature: SigMode = "full",
    ngram: Annotated[int, typer.Option("--ngram", help="Token n-gram length.")] = 5,
    rejected: RejectedOpt = None,
    *,
    stream: StreamFlags,
) -> None:
    """Drop tasks too similar to a reference set (decontamination) or to each other.

    Similarity: operator signature (ordered ops + non-shape hyper-parameters) and MinHash/LSH over
    normalised __init__/forward token n-grams, confirmed by exact Jaccard. The nearest match is
    recorded in meta.dedup (kept) or meta.rejected (dropped).

    Example: opsynth dedup filtered.jsonl --kernelbench ~/KernelBench --rejected dup.jsonl > tasks.jsonl
    """
    from cuda_agent.records.jsonl import RecordWriter, load_records
    from cuda_agent.records.types import Task

    from .dedup import DedupConfig, Deduplicator, reference_sources

    for mode in (ref_signature, self_signature):
        if mode not in ("full", "ops", "off"):
            raise fail(f"signature mode must be full, ops or off, got {mode!r}")
    dd = Deduplicator(
        DedupConfig(
            ref_threshold=ref_threshold,
            self_threshold=self_threshold,
            ref_signature=ref_signature,
            self_signature=self_signature,
            ngram=ngram,
        )
    )
    for ref in kernelbench or []:
        try:
            n0 = len(dd.ref.docs)
            for key, name, src in reference_sources(ref):
                try:
                    dd.add_reference(key, name, src)
                except SyntaxError as e:
                    log(f"dedup: reference {name} does not parse ({e}); ignored")
            log(f"dedup: {len(dd.ref.docs) - n0} references from {ref}")
        except FileNotFoundError as e:
            raise fail(f"dedup: {e}") from None
    if not kernelbench:
        log("dedup: no --kernelbench reference given; only within-set duplicates are removed")
    done_rejected: set[str] = set()
    if resume and output is not None and output.exists():
        for t in load_records(output):
            if isinstance(t, Task):
                dd.add_kept(t.id, t.name, t.ref_code)
    if resume and rejected is not None and rejected.exists():
        done_rejected = {t.id for t in load_records(rejected) if isinstance(t, Task)}
    rej = RecordWriter(rejected) if rejected is not None else None

    def process(task: Task):
        import msgspec

        if task.id in done_rejected:
            return
        try:
            reason, info = dd.check(task.id, task.name, task.ref_code)
        except SyntaxError as e:
            reason, info = "syntax_error", {"detail": str(e)}
            dd.reasons[reason] += 1
        if reason is None:
            yield msgspec.structs.replace(task, meta={**task.meta, "dedup": info})
        elif rej is not None:
            rej.write(
                msgspec.structs.replace(
                    task, meta={**task.meta, "rejected": {"reason": reason, **info}}
                )
            )

    try:
        stream.run(process, expect=(Task,), desc="dedup")
    finally:
        if rej is not None:
            rej.close()
        log(dd.summary())


@app.command("import-ops6k")
def import_ops6k(
    path: Annotated[
        Path, typer.Argument(help="CUDA-Agent-Ops-6K parquet (ops, data_source, code).")
    ],
    output: OutputOpt = None,
    sample: Annotated[
        int | None, typer.Option("--sample", help="Only a random sample of N rows.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of --sample.")] = 0,
    kernelbench: Annotated[
        list[Path] | None,
        typer.Option("--kernelbench", help="Also flag rows similar to this KernelBench tree."),
    ] = None,
    ref_threshold: Annotated[float, typer.Option("--ref-threshold")] = 0.8,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write the findings as JSON here.")
    ] = None,
) -> None:
    """Read the released Ops-6K parquet into Task records (source "ops6k") and report its
    problems: op-count distribution, randomness in forward, op labels the code does not use,
    contract breaks, LLM resize notes, within-set duplicates, rows similar to KernelBench.

    Example: opsynth import-ops6k ops6k.parquet --kernelbench ~/KernelBench --report ops6k.json > ops6k.jsonl
    """
    import random as _random

    import msgspec

    from cuda_agent.records.jsonl import RecordWriter

    from .dedup import DedupConfig, Deduplicator, reference_sources
    from .ops6k import import_parquet

    if not path.exists():
        raise fail(f"import-ops6k: {path} does not exist")
    try:
        tasks = list(import_parquet(path))
    except (ValueError, OSError) as e:
        raise fail(f"import-ops6k: {e}") from None
    n_all = len(tasks)
    if sample is not None and sample < n_all:
        tasks = _random.Random(seed).sample(tasks, sample)
    dd = Deduplicator(DedupConfig(ref_threshold=ref_threshold))
    for ref in kernelbench or []:
        for key, name, src in reference_sources(ref):
            dd.add_reference(key, name, src)
    issues: dict[str, int] = {}
    kinds: dict[str, int] = {}
    examples: dict[str, list[int]] = {}
    lengths: dict[int, int] = {}
    sources: dict[str, int] = {}
    with RecordWriter(output) as w:
        for t in tasks:
            meta = dict(t.meta)
            iss = dict(meta["issues"])
            try:
                reason, info = dd.check(t.id, t.name, t.ref_code)
                if reason in ("ref_signature", "ref_similar"):
                    iss["kernelbench_" + reason[4:]] = info.get("match")
                elif reason in ("dup_signature", "near_duplicate"):
                    iss[reason] = info.get("match_key")
            except SyntaxError:
                pass
            meta["issues"] = iss
            w.write(msgspec.structs.replace(t, meta=meta))
            lengths[meta["n_ops"]] = lengths.get(meta["n_ops"], 0) + 1
            ds = str(meta.get("data_source"))
            sources[ds] = sources.get(ds, 0) + 1
            for k in iss:
                issues[k] = issues.get(k, 0) + 1
                examples.setdefault(k, [])
                if len(examples[k]) < 5:
                    examples[k].append(meta["row"])
            for r in iss.get("random_forward", []):
                kinds[r] = kinds.get(r, 0) + 1
    n = len(tasks)
    findings = {
        "file": str(path),
        "rows": n_all,
        "imported": n,
        "ops_count": dict(sorted(lengths.items())),
        "data_source": dict(sorted(sources.items(), key=lambda kv: -kv[1])),
        "issues": issues,
        "random_forward_kinds": kinds,
        "example_rows": examples,
        "kernelbench_references": len(dd.ref.docs),
    }
    log(f"import-ops6k: {n} of {n_all} rows imported")
    log(
        "  ops per task: "
        + ", ".join(f"{k}: {v} ({100 * v / n:.1f}%)" for k, v in sorted(lengths.items()))
    )
    for k, v in sorted(issues.items(), key=lambda kv: -kv[1]):
        log(f"  {k}: {v} rows ({100 * v / n:.1f}%), e.g. rows {examples[k]}")
    if kinds:
        log("  randomness kinds: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    if report is not None:
        report.write_text(json.dumps(findings, indent=2))


@app.command()
def export(
    input: InputArg = None,
    parquet: Annotated[Path, typer.Option("--parquet", help="Output parquet file.")] = Path(
        "tasks.parquet"
    ),
) -> None:
    """Write a Task stream in the Ops-6K layout (columns ops, data_source, code).

    Example: opsynth export tasks.jsonl --parquet tasks.parquet
    """
    from cuda_agent.records.jsonl import DecodeError, read_records
    from cuda_agent.records.types import Task

    from .ops6k import export_parquet

    def tasks():
        for n, rec in read_records(input):
            if isinstance(rec, DecodeError):
                raise fail(str(rec))
            if isinstance(rec, Task):
                yield rec
            else:
                log(f"export: line {n} is not a task; skipped")

    rows = export_parquet(tasks(), parquet)
    log(f"export: {rows} rows -> {parquet}")


@app.command()
def stats(
    files: Annotated[list[Path], typer.Argument(help="Task JSONL or Ops-6K parquet files.")],
    json_out: Annotated[
        bool, typer.Option("--json", help="JSON instead of a markdown table.")
    ] = False,
    rejected: Annotated[
        list[Path] | None,
        typer.Option(
            "--rejected",
            help="Rejected-task files of a filter/dedup run: also report pass rate and reasons "
            "(kept tasks = the first FILE).",
        ),
    ] = None,
) -> None:
    """Compare task sets side by side: ops per task, categories, heavy-op share, vocabulary.

    Prints a markdown table (or JSON) on stdout; this command writes no records.

    Example: opsynth stats tasks.jsonl ops6k.parquet
    """
    from cuda_agent.records.jsonl import load_records
    from cuda_agent.records.types import Task

    from .ops6k import import_parquet
    from .stats import describe, markdown_compare

    named = {}
    for f in files:
        if not f.exists():
            raise fail(f"stats: {f} does not exist")
        if f.suffix == ".parquet":
            ts = list(import_parquet(f))
        else:
            ts = [t for t in load_records(f) if isinstance(t, Task)]
        named[f.name] = describe(ts)
    report = None
    if rejected:
        from .stats import filter_report

        rej = [t for f in rejected for t in load_records(f) if isinstance(t, Task)]
        kept = [t for t in load_records(files[0]) if isinstance(t, Task)]
        report = filter_report(kept, rej)
    if json_out:
        print(json.dumps({"sets": named, "filter": report}, indent=2))
        return
    print(markdown_compare(named))
    if report is not None:
        print(f"\npassed {report['passed']}/{report['tasks']} ({100 * report['pass_rate']:.1f}%)")
        for r, n in report["reasons"].items():
            print(f"- {r}: {n}")
        print("eager time: " + ", ".join(f"{k}: {v}" for k, v in report["eager_ms_hist"].items()))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":
    app()
