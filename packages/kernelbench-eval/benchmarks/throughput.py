"""The evaluator throughput benchmark (issue 28): our evaluator on the fixed batch of
``throughput_batch.py``, and KernelBench's own harness on a subset of it, side by side.

Subcommands (run on the GPU machine from the repo root; ``bin/gpu-check.sh`` sections
``kb-throughput`` (its parts ``batch``, ``service``, ``subset``, ``kb``) and
``kb-throughput-serial`` call them):
  ours     the batch through ``kernelbench-eval run --backend cuda`` as a user runs it
           (concurrent: ``--gpus all``; ``--serial``: one candidate at a time, one device worker;
           ``--serial-device``: one at a time on the device while later ones compile),
           fresh caches of its own, wall clock timed; writes results.jsonl and run.json
  service  the batch through the kernel service (``python -m cuda_agent.service serve``, same
           fresh caches and seeded baselines) from ``--clients`` threads, one request each at a
           time: results.jsonl as ``ours`` writes it plus each request's wall clock and overhead
           (``meta.service``), run.json with the overhead's median / p90 / max and the service's
           errors; ``compare`` against an ``ours`` folder says whether the verdicts are the same
  kb       KernelBench's ``eval_kernel_against_ref`` on the subset, as its eval_from_generations
           script runs it: optionally its CPU pre-compile (build_compile_cache, parallel), then one
           candidate after another, each in a fresh interpreter with a timeout; kb.jsonl, run.json
  kb-one   (internal) one candidate in KernelBench's harness: the child process of ``kb``
  summary  candidates per GPU-hour, the time split by stage (sum and median of each result's
           ``meta.stages_s``), verdict counts, verdicts against the expected ones
  compare  two result files of the same batch (concurrent vs serial): verdicts identical?
           honest candidates' speed-ups within 3%?  exit 1 when not
  ratio    ours vs KernelBench's harness on the subset: both rates, the ratio, and each
           candidate whose verdicts differ with both sides' reasons

Every command prints JSON on stdout (``--md`` on summary/compare/ratio: Markdown).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEEDUP_TOL = 0.03
# KernelBench's eval_from_generations defaults (EvalConfig)
KB_CORRECT_TRIALS = 5
KB_PERF_TRIALS = 100
KB_TIMEOUT_S = 180.0


# ----------------------------------------------------------------------------- small helpers


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return out


def bench_id(r: dict[str, Any]) -> str:
    return str(((r.get("meta") or {}).get("bench") or {}).get("id") or r.get("bench_id") or "?")


def count_gpus(spec: str) -> int:
    """GPUs that ``--gpus spec`` names on this machine."""
    if spec != "all":
        return len([g for g in spec.split(",") if g.strip()])
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([g for g in env.split(",") if g.strip()])
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        n = sum(1 for x in p.stdout.splitlines() if x.startswith("GPU "))
        return max(n, 1)
    except (OSError, subprocess.TimeoutExpired):
        return 1


def per_gpu_hour(n: int, wall_s: float, gpus: int) -> float | None:
    return None if wall_s <= 0 else round(n * 3600.0 / (wall_s * max(gpus, 1)), 1)


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


# ----------------------------------------------------------------------------- ours


def _run_fed(
    cmd: list[str],
    env: dict[str, str],
    lines: list[bytes],
    log: Any,
    t0: float,
    feed_s: float | None,
    timeout_s: float | None,
) -> tuple[int, int | None, bool]:
    """Run ``cmd`` with ``lines`` fed on its stdin until ``feed_s`` after ``t0`` (it reads them
    as its window frees up), killed (its whole process group) at ``timeout_s``, after a SIGUSR1
    asked it for its state report (sandbox ``state_report``, in its stderr). Returns lines
    fed, exit status and whether it was killed."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=log, env=env, start_new_session=True)
    fed = 0

    def feed() -> None:
        nonlocal fed
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            for ln in lines:
                if feed_s is not None and time.time() - t0 > feed_s:
                    break
                proc.stdin.write(ln)
                proc.stdin.flush()
                fed += 1
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()

    th = threading.Thread(target=feed, daemon=True)
    th.start()
    killed = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = True
        # what it was doing (its stderr, the sandbox's state report), then stop it
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(3)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    th.join(timeout=5)
    return fed, proc.returncode, killed


CACHE_DIRS = ("cache-sandbox", "cache-profiler", "cache-inductor", "cache-triton")


def bench_env(
    out_dir: Path,
    lines: list[bytes],
    backend: str,
    extra: list[str],
    fresh_cache: bool,
    baselines_from: Path | None,
) -> tuple[dict[str, str], int, dict[str, Any] | None]:
    """The environment of a benchmark's evaluating child process (``kernelbench-eval run`` for
    ``ours``, the service for ``service``): fresh caches of its own under ``out_dir`` unless
    ``fresh_cache`` is off, the profiler's seeded with ``baselines_from``'s ``baselines/``.
    Returns the environment, the files seeded and what they cover of the batch's ``lines``
    (``baseline_cover``, with the run flags ``extra``; None when nothing was seeded)."""
    env = dict(os.environ)
    out_dir = out_dir.resolve()  # the sandbox builds and runs in folders of its own
    if fresh_cache:
        env["CUDA_AGENT_SANDBOX_CACHE"] = str(out_dir / "cache-sandbox")
        env["CUDA_AGENT_CACHE"] = str(out_dir / "cache-profiler")
        # torch.compile's own on-disk caches too: a later run of the same tasks (the subset after
        # the batch) would otherwise get its compile baselines from the earlier one's
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out_dir / "cache-inductor")
        env["TRITON_CACHE_DIR"] = str(out_dir / "cache-triton")
    seeded = 0
    if baselines_from is not None:
        src = baselines_from / "baselines"
        if not src.is_dir():
            raise SystemExit(f"throughput: no baselines/ folder in {baselines_from}")
        if not fresh_cache:  # the user's own cache is not this benchmark's to fill
            raise SystemExit(
                "throughput: --baselines-from seeds the fresh caches: not with --warm-cache"
            )
        dst = Path(env["CUDA_AGENT_CACHE"]) / "baselines"
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.json"):
            shutil.copy2(f, dst / f.name)
            seeded += 1
    cover = baseline_cover(lines, Path(env["CUDA_AGENT_CACHE"]), backend, extra) if seeded else None
    if cover and cover["seeded"] < cover["tasks"]:
        print(
            f"throughput: the seeded baselines cover {cover['seeded']} of the "
            f"{cover['tasks']} tasks that can reach the device (by source: {cover['by_source']}); "
            "the others' baselines are measured in the run, holding a device worker each",
            file=sys.stderr,
        )
    return env, seeded, cover


def drop_caches(out_dir: Path, env: dict[str, str], fresh_cache: bool, info: dict) -> None:
    """After a run with fresh caches: keep its baselines (small JSON files, in
    ``out_dir/baselines``: ``--baselines-from OUT`` seeds a rerun; ``info["baselines_kept"]``)
    and remove the caches (GBs) unless ``$KBT_KEEP_CACHE`` is 1."""
    if not fresh_cache:
        return
    src = Path(env["CUDA_AGENT_CACHE"]) / "baselines"
    info["baselines_kept"] = keep_baselines(src, out_dir / "baselines")
    if os.environ.get("KBT_KEEP_CACHE") != "1":
        for d in CACHE_DIRS:
            shutil.rmtree(out_dir / d, ignore_errors=True)


def run_command(backend: str, gpus: str, serial: bool, serial_device: bool = False) -> list[str]:
    """The ``kernelbench-eval run`` command line of a run: concurrent on ``gpus``; ``serial``: one
    candidate at a time from its compile to its verdict (one compile job, one device worker,
    window 1); ``serial_device``: one candidate at a time on the device (one device worker on
    the first GPU) while later ones compile, which gives the device-side verdicts of a serial
    run at about the device time alone."""
    cmd = [sys.executable, "-m", "cuda_agent.kernelbench_eval.cli", "run", "--backend", backend]
    if not (serial or serial_device):
        return cmd + ["--gpus", gpus]
    cmd += ["--gpus", "0" if gpus == "all" else gpus.split(",")[0], "--workers-per-gpu", "1"]
    return cmd + (["--compile-jobs", "1", "--window", "1"] if serial else [])


def run_ours(
    batch: Path,
    out_dir: Path,
    *,
    serial: bool,
    serial_device: bool = False,
    gpus: str,
    feed_s: float | None,
    timeout_s: float | None,
    extra: list[str],
    fresh_cache: bool = True,
    backend: str = "cuda",
    baselines_from: Path | None = None,
) -> dict[str, Any]:
    """The batch through ``kernelbench-eval run`` (a child process, as a user runs it): candidates
    are fed on its stdin until ``feed_s`` has passed (then stdin closes and what is in flight
    finishes), ``timeout_s`` kills it. Caches are fresh ones under ``out_dir`` unless
    ``fresh_cache`` is off. ``baselines_from`` (a profiler cache folder, e.g. the one
    ``kb_references.py`` filled) seeds the fresh profiler cache with its ``baselines/``: eager
    and ``torch.compile`` times measured once per task and device, as a user reuses them across
    runs; compile and everything else stay cold. Returns (and writes to run.json) the wall clock
    and counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    before = len(read_jsonl(results))
    cmd = run_command(backend, gpus, serial, serial_device) + [
        "-o",
        str(results),
        "--resume",
        *extra,
    ]
    lines = [x for x in batch.read_bytes().splitlines(keepends=True) if x.strip()]
    env, seeded, cover = bench_env(out_dir, lines, backend, extra, fresh_cache, baselines_from)
    t0 = time.time()
    with open(out_dir / "run.stderr.txt", "ab") as log:
        fed, rc, killed = _run_fed(cmd, env, lines, log, t0, feed_s, timeout_s)
    wall = time.time() - t0
    n_gpus = 1 if serial or serial_device else count_gpus(gpus)
    done = len(read_jsonl(results)) - before
    info = {
        "label": "serial" if serial else "serial-device" if serial_device else "concurrent",
        "command": " ".join(cmd),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "wall_s": round(wall, 1),
        "gpus": n_gpus,
        "batch": len(lines),
        "fed": fed,
        "done_before": before,
        "done": done,
        "rc": rc,
        "killed": killed,
        "fresh_cache": fresh_cache,
        "baselines_seeded": seeded,
        "baselines_cover": cover,
        "baselines_from": str(baselines_from) if baselines_from else None,
        "per_gpu_hour": per_gpu_hour(done, wall, n_gpus),
    }
    if killed:
        info["state_at_kill"] = state_at_kill(out_dir / "run.stderr.txt")
    drop_caches(out_dir, env, fresh_cache, info)
    _write_json(out_dir / "run.json", info)
    return info


def state_at_kill(stderr_path: Path) -> list[str] | None:
    """The last sandbox state report in a run's stderr (asked for before the kill), one line per
    gate: who held it and who waited for what, for how long; None without a report."""
    report = None
    with contextlib.suppress(OSError):
        for line in stderr_path.read_text(errors="replace").splitlines():
            if line.startswith('{"state_report"'):
                with contextlib.suppress(json.JSONDecodeError):
                    report = json.loads(line)["state_report"]
    if not isinstance(report, dict):
        return None
    lines = []
    for g in report.get("gates") or []:
        held = "; ".join(
            f"{o['occupant']} ({', '.join(o['holding']) or 'present'})" for o in g["present"]
        )
        waits = "; ".join(
            f"{w['occupant']} {w['mode']} {w['phase']} {w['for_s']}s" for w in g["waiting"]
        )
        lines.append(f"{g['gate']}: holding: {held or 'none'}; waiting: {waits or 'none'}")
    if report.get("large_shares"):
        lines.append(f"large shares held: {report['large_shares']}")
    return lines


def keep_baselines(src: Path, dst: Path) -> int:
    """Copy the profiler cache's baseline files from ``src`` into ``dst`` (created); returns how
    many ``dst`` holds. What a fresh-cache run measured so survives its caches' removal."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("*.json") if src.is_dir() else ():
        shutil.copy2(f, dst / f.name)
    return sum(1 for _ in dst.glob("*.json"))


def _compile_mode_of(backend: str, extra: list[str]) -> str | None:
    """The torch.compile mode of the baselines a ``kernelbench-eval run`` with the flags
    ``extra`` asks for (None: eager only, the cpu backend's default or
    ``--no-compile-baseline``)."""
    want_compile, mode = backend == "cuda", "default"
    for i, a in enumerate(extra):
        if a in ("--no-compile-baseline", "--compile-baseline"):
            want_compile = a == "--compile-baseline"
        elif a.startswith("--baseline-compile-mode="):
            mode = a.split("=", 1)[1]
        elif a == "--baseline-compile-mode" and i + 1 < len(extra):
            mode = extra[i + 1]
    return mode if want_compile else None


def baseline_cover(
    lines: list[bytes], cache: Path, backend: str, extra: list[str]
) -> dict[str, Any]:
    """How many of the batch's tasks that can reach the device (``throughput_batch.device_tasks``)
    have a baseline in ``cache``, looked up as the sandbox will in this environment: with the
    torch.compile mode the run asks for. Seeded files that match no task, e.g. another run's,
    are not counted."""
    import msgspec

    from cuda_agent.profiler.baseline import BaselineCache, cached_baseline
    from cuda_agent.records import Candidate

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput_batch import device_tasks

    cands = [msgspec.json.decode(ln, type=Candidate) for ln in lines]
    source = {}
    for c in cands:
        source.setdefault(c.task.id, c.meta["bench"]["source"])
    mode = _compile_mode_of(backend, extra)
    by_source: dict[str, list[int]] = {}
    seeded = 0
    for task in device_tasks(cands):
        hit = cached_baseline(
            task,
            device="cuda" if backend == "cuda" else "cpu",
            compile_mode=mode,
            cache=BaselineCache(root=cache / "baselines"),
        )
        row = by_source.setdefault(source[task.id], [0, 0])
        row[1] += 1
        if hit is not None:
            row[0] += 1
            seeded += 1
    return {
        "tasks": sum(b for _, b in by_source.values()),
        "seeded": seeded,
        "by_source": {k: f"{a}/{b}" for k, (a, b) in sorted(by_source.items())},
    }


# ----------------------------------------------------------------------------- service

# client threads by default: the service's own default --max-concurrent (16), so that the batch
# meets the service as a trainer with that many rollouts in flight does; more would only be
# answered 503 busy, fewer would leave the pool's window (compile jobs + device workers) unfilled
SERVICE_CLIENTS = 16
SERVICE_START_S = 120.0


def _serve_run_flags(serve_args: list[str]) -> list[str]:
    """The ``kernelbench-eval run`` flags that ask for the baselines ``serve_args``
    (``--sandbox-config`` JSON: ``compile_baseline``, ``baseline_compile_mode``) ask the service
    for: what ``baseline_cover`` looks seeded files up with."""
    text = None
    for i, a in enumerate(serve_args):
        if a.startswith("--sandbox-config="):
            text = a.split("=", 1)[1]
        elif a == "--sandbox-config" and i + 1 < len(serve_args):
            text = serve_args[i + 1]
    try:
        d = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return []  # the service refuses it and says why
    d = d if isinstance(d, dict) else {}
    out = []
    if d.get("compile_baseline") is not None:
        out.append("--compile-baseline" if d["compile_baseline"] else "--no-compile-baseline")
    if d.get("baseline_compile_mode"):
        out.append(f"--baseline-compile-mode={d['baseline_compile_mode']}")
    return out


def _tail(path: Path, n: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


def _stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM ``proc``'s process group (it finishes what is in flight and closes its pool),
    SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:  # the server is gone; what it started may not be
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _server_url(proc: subprocess.Popen, stderr_path: Path, limit_s: float) -> str:
    """The URL the server prints as its first stdout line, within ``limit_s``; SystemExit with
    its stderr's tail when it dies first or says nothing in time."""
    assert proc.stdout is not None
    got: list[bytes] = []
    th = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    th.start()
    th.join(limit_s)
    url = got[0].decode(errors="replace").strip() if got else ""
    if not url.startswith("http"):
        if got:  # its stdout ended (or said something else): it is exiting, or should
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        rc = proc.poll()
        if rc is not None:
            why = f"exited with status {rc}"
        elif got:
            why = "printed something other than its URL"
        else:
            why = f"printed no URL in {limit_s:g} s"
        _stop_group(proc, 5.0)
        raise SystemExit(
            f"throughput: the service {why} (stdout: {url[:200]!r}); its stderr ends:\n"
            + _tail(stderr_path)
        )
    return url


def run_service(
    batch: Path,
    out_dir: Path,
    *,
    gpus: str,
    feed_s: float | None,
    timeout_s: float | None,
    serve_args: list[str],
    clients: int = SERVICE_CLIENTS,
    guard_policy: str = "kernelbench",
    fresh_cache: bool = True,
    backend: str = "cuda",
    baselines_from: Path | None = None,
) -> dict[str, Any]:
    """The batch through the service (``python -m cuda_agent.service serve``, a child process in
    its own session, with ``ours``' fresh caches and seeded baselines): ``clients`` threads take
    the candidates in batch order until ``feed_s`` has passed, each one request at a time
    (``ServiceClient.evaluate``), and write each result as ``kernelbench-eval run`` writes it
    (``with_run_meta``) plus ``meta.service``: the request's wall clock, the pool's wait for a
    compile worker (``stages_s.compile_queue``), and the overhead: the wall clock less the
    evaluation's own ``seconds`` and that wait (HTTP, JSON, the server's threads). Candidates
    with a result in ``results.jsonl`` (by bench id) are skipped. At ``timeout_s`` no request
    starts, the server is stopped (SIGTERM to its group, SIGKILL after 20 s) and the requests in
    flight are abandoned. ``guard_policy``: the
    batch's (``kernelbench``, ``run``'s default; the service's own default is ``strict``).
    Service errors are kept in run.json's ``errors``; a ``busy`` answer is retried after its
    Retry-After. Returns (and writes to run.json) the wall clock and counts."""
    import secrets

    import msgspec

    from cuda_agent.kernelbench_eval.cli import with_run_meta
    from cuda_agent.records import Candidate
    from cuda_agent.service.client import ServiceClient, ServiceError

    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    have = {bench_id(r) for r in read_jsonl(results)}
    lines = [x for x in batch.read_bytes().splitlines(keepends=True) if x.strip()]
    todo = []
    for ln in lines:
        c = msgspec.json.decode(ln, type=Candidate)
        if str(c.meta["bench"]["id"]) not in have:
            todo.append(c)
    flags = _serve_run_flags(serve_args)
    env, seeded, cover = bench_env(out_dir, lines, backend, flags, fresh_cache, baselines_from)
    token = secrets.token_urlsafe(32)
    tok_file = out_dir / "service.token"
    tok_file.unlink(missing_ok=True)
    fd = os.open(tok_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    cmd = [sys.executable, "-m", "cuda_agent.service", "serve", "--backend", backend]
    cmd += ["--gpus", gpus, "--port", "0", "--token-file", str(tok_file)]
    cmd += ["--max-concurrent", str(clients), "--guard-policy", guard_policy, "--quiet"]
    cmd += serve_args
    stderr_path = out_dir / "server.stderr.txt"
    lock = threading.Lock()
    stop = threading.Event()
    pending = iter(todo)
    in_flight: set[str] = set()
    errors: list[dict[str, Any]] = []
    counts = {"fed": 0, "done": 0, "busy_retries": 0}
    t0 = time.time()
    with open(stderr_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
        )
        try:
            url = _server_url(proc, stderr_path, SERVICE_START_S)
            startup_s = time.time() - t0
            # nothing else is printed there, but a full pipe would block the server: drain it
            threading.Thread(target=lambda: proc.stdout and proc.stdout.read(), daemon=True).start()
            client = ServiceClient(url, token)
            try:
                health = client.health()
            except ServiceError as e:
                raise SystemExit(
                    f"throughput: the service at {url} does not answer its health check ({e}); "
                    "its stderr ends:\n" + _tail(stderr_path)
                ) from None

            # the policy the service applies (a --serve-arg may have set another): the results'
            policy = health.guard_policy or guard_policy

            def take() -> Candidate | None:
                with lock:
                    if stop.is_set() or proc.poll() is not None:
                        return None
                    if feed_s is not None and time.time() - t0 > feed_s:
                        return None
                    c = next(pending, None)
                    if c is not None:
                        counts["fed"] += 1
                        in_flight.add(str(c.meta["bench"]["id"]))
                    return c

            def work(out: Any) -> None:
                while (c := take()) is not None:
                    bid = str(c.meta["bench"]["id"])
                    retries = 0
                    while True:
                        t = time.time()
                        try:
                            r = client.evaluate(c)
                        except ServiceError as e:
                            if stop.is_set():  # the server was stopped under it: abandoned
                                return
                            busy = e.code == "busy"
                            with lock:
                                errors.append(
                                    {
                                        "id": bid,
                                        "code": e.code,
                                        "status": e.status,
                                        "message": e.message[:500],
                                        "retried": busy,
                                        "after_s": round(time.time() - t0, 1),
                                    }
                                )
                                if busy:
                                    counts["busy_retries"] += 1
                            if busy and not stop.wait(e.retry_after or 5.0):
                                retries += 1
                                continue
                            with lock:
                                in_flight.discard(bid)
                            break
                        wall = time.time() - t
                        r = with_run_meta(c, r, policy)
                        # `seconds` starts when a compile worker takes the candidate: the wait
                        # before that is the pool's (`compile_queue`), not the service's
                        queued = float((r.meta.get("stages_s") or {}).get("compile_queue") or 0.0)
                        svc = {
                            "request_s": round(wall, 3),
                            "compile_queue_s": round(queued, 3),
                            "overhead_s": round(wall - r.seconds - queued, 3),
                        }
                        if retries:
                            svc["busy_retries"] = retries
                        r = msgspec.structs.replace(r, meta={**r.meta, "service": svc})
                        with lock:
                            if stop.is_set():
                                return
                            out.write(msgspec.json.encode(r) + b"\n")
                            out.flush()
                            counts["done"] += 1
                            in_flight.discard(bid)
                        break

            with open(results, "ab") as out:
                threads = [
                    threading.Thread(target=work, args=(out,), daemon=True) for _ in range(clients)
                ]
                for th in threads:
                    th.start()
                deadline = None if timeout_s is None else t0 + timeout_s
                for th in threads:
                    th.join(None if deadline is None else max(0.0, deadline - time.time()))
                with lock:
                    killed = any(th.is_alive() for th in threads)
                    stop.set()
                    abandoned = sorted(in_flight)
        finally:
            stop.set()
            _stop_group(proc)
            tok_file.unlink(missing_ok=True)
    wall = time.time() - t0
    n_gpus = count_gpus(gpus)
    over = [
        float(((r.get("meta") or {}).get("service") or {}).get("overhead_s"))
        for r in read_jsonl(results)
        if isinstance(((r.get("meta") or {}).get("service") or {}).get("overhead_s"), int | float)
    ]
    info = {
        "label": "service",
        "command": " ".join(cmd),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "wall_s": round(wall, 1),
        "startup_s": round(startup_s, 1),
        "gpus": n_gpus,
        "batch": len(lines),
        "clients": clients,
        "fed": counts["fed"],
        "done_before": len(have),
        "done": counts["done"],
        "rc": proc.returncode,
        "killed": killed,
        "abandoned": abandoned,
        "fresh_cache": fresh_cache,
        "baselines_seeded": seeded,
        "baselines_cover": cover,
        "baselines_from": str(baselines_from) if baselines_from else None,
        "per_gpu_hour": per_gpu_hour(counts["done"], wall, n_gpus),
        "overhead_s": {
            "min": round(min(over), 3) if over else None,
            "median": _median(over),
            "p90": round(_quantile(over, 0.9), 3) if over else None,
            "max": round(max(over), 3) if over else None,
            "n": len(over),
        },
        "busy_retries": counts["busy_retries"],
        "errors": errors,
        "health": msgspec.to_builtins(health),
    }
    drop_caches(out_dir, env, fresh_cache, info)
    _write_json(out_dir / "run.json", info)
    return info


def _quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (linear between order statistics)."""
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ----------------------------------------------------------------------------- summary


def _matches(expected: str | None, r: dict[str, Any]) -> bool | None:
    """Whether a result meets ``bench.expected`` ("ok", "guard_violation", or
    "guard_violation:G-CODE"); None when nothing is expected."""
    if not expected:
        return None
    status, _, code = expected.partition(":")
    if r.get("status") != status:
        return False
    return not code or code in {g.get("code") for g in r.get("guards") or []}


# stages that run before anything reaches the GPU (a static guard's rejection ends there)
HOST_STAGES = frozenset({"compile_queue", "static_guards", "compile", "admission_wait"})


def reached_device(r: dict[str, Any]) -> bool:
    """Whether the evaluation got past the host-side stages (static guards, compile)."""
    return bool(set((r.get("meta") or {}).get("stages_s") or {}) - HOST_STAGES)


def summarize(results: list[dict[str, Any]], run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rate, verdict counts (overall and per source), stage times (sum, median) and the results
    that missed their expected verdict."""
    run = run or {}
    statuses: dict[str, int] = {}
    by_source: dict[str, dict[str, int]] = {}
    stages: dict[str, list[float]] = {}
    misses = []
    for r in results:
        st = str(r.get("status"))
        statuses[st] = statuses.get(st, 0) + 1
        b = (r.get("meta") or {}).get("bench") or {}
        src = by_source.setdefault(str(b.get("source", "?")), {})
        src[st] = src.get(st, 0) + 1
        for k, v in ((r.get("meta") or {}).get("stages_s") or {}).items():
            if isinstance(v, int | float):
                stages.setdefault(k, []).append(float(v))
        if _matches(b.get("expected"), r) is False:
            misses.append(
                {
                    "id": bench_id(r),
                    "expected": b.get("expected"),
                    "status": st,
                    "guards": sorted({str(g.get("code")) for g in r.get("guards") or []}),
                    "message": str(r.get("message", ""))[:300],
                }
            )
    seconds = [float(r.get("seconds") or 0.0) for r in results]
    n = len(results)
    n_dev = sum(1 for r in results if reached_device(r))
    wall = float(run.get("wall_s") or 0.0)
    gpus = int(run.get("gpus") or 1)
    return {
        "label": run.get("label"),
        "candidates": n,
        "wall_s": wall or None,
        "gpus": gpus,
        "per_gpu_hour": per_gpu_hour(run.get("done", n), wall, gpus) if wall else None,
        # candidates that ended in the static guards or the compile cost the GPU nothing: the rate
        # counting only those that reached the device (over the same wall clock) is a lower bound
        "reached_device": n_dev,
        "per_gpu_hour_device_only": per_gpu_hour(n_dev, wall, gpus) if wall else None,
        "statuses": dict(sorted(statuses.items())),
        "by_source": {k: dict(sorted(v.items())) for k, v in sorted(by_source.items())},
        "stages_s": {
            k: {"sum": round(sum(v), 1), "median": _median(v), "n": len(v)}
            for k, v in sorted(stages.items(), key=lambda kv: -sum(kv[1]))
        },
        "eval_seconds": {"sum": round(sum(seconds), 1), "median": _median(seconds)},
        "memory_per_working_set": memory_per_working_set(results),
        "expected_missed": misses,
        "run": run,
    }


def memory_per_working_set(results: list[dict[str, Any]], min_mb: float = 256.0) -> dict:
    """Per stage, each process's peak memory over its task's working set (inputs, outputs and
    weights; ``meta.working_set_mb``), for tasks of at least ``min_mb`` (below, the CUDA context
    and torch's own memory dominate): median and max of the device's reserved memory (what a
    GPU share caps), else of the host RSS (the cpu backend), and how many results. What
    ``admission.CANDIDATE_WORKING_SET_FACTOR`` should cover."""
    ratios: dict[str, list[float]] = {}
    for r in results:
        meta = r.get("meta") or {}
        ws = meta.get("working_set_mb")
        if not isinstance(ws, int | float) or ws < min_mb:
            continue
        for stage, peak in (meta.get("peak_memory_mb") or {}).items():
            v = peak.get("device_reserved", peak.get("host_rss"))
            if isinstance(v, int | float):
                ratios.setdefault(stage, []).append(v / ws)
    return {
        k: {"median": _median(v), "max": round(max(v), 2), "n": len(v)}
        for k, v in sorted(ratios.items())
    }


def _baselines_note(run: dict[str, Any]) -> str:
    """Where the run's eager and torch.compile baselines came from (its rate depends on it)."""
    if run.get("baselines_seeded"):
        n, cover = run["baselines_seeded"], run.get("baselines_cover")
        if cover:  # what the files cover of this batch, looked up as the run's sandbox did
            return (
                f"; baselines seeded ({n} files of an earlier references run) for "
                f"{cover['seeded']} of the {cover['tasks']} tasks that can reach the device, "
                "the others timed in the run"
            )
        return f"; baselines of an earlier references run seeded ({n} files)"
    return "; every baseline timed in the run (fresh caches)" if run.get("fresh_cache") else ""


def summary_md(s: dict[str, Any]) -> str:
    lines = [
        f"**{s['label'] or 'run'}**: {s['candidates']} candidates in {s['wall_s']} s on "
        f"{s['gpus']} GPU(s): **{s['per_gpu_hour']} candidates per GPU-hour** "
        f"({s['reached_device']} reached the device: {s['per_gpu_hour_device_only']} per GPU-hour "
        f"counting only those){_baselines_note(s.get('run') or {})}",
        "",
        "| verdict | count |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in s["statuses"].items()],
        "",
        "| stage | sum s | median s | results |",
        "| --- | --- | --- | --- |",
        *[f"| {k} | {v['sum']} | {v['median']} | {v['n']} |" for k, v in s["stages_s"].items()],
    ]
    if s.get("memory_per_working_set"):
        lines += [
            "",
            "| process | peak memory / working set, median | max | results |",
            "| --- | --- | --- | --- |",
            *[
                f"| {k} | {v['median']} | {v['max']} | {v['n']} |"
                for k, v in s["memory_per_working_set"].items()
            ],
        ]
    run = s.get("run") or {}
    if run.get("overhead_s"):  # a `service` run: each request's wall clock over its evaluation's
        o = run["overhead_s"]
        lost = [e for e in run.get("errors") or [] if not e.get("retried")]
        lines += [
            "",
            f"Through the service ({run.get('clients')} clients): overhead per request (its wall "
            "clock less the pool's compile queue and the "
            + (
                f"evaluation's own seconds): median {o['median']} s, p90 {o['p90']} s, max "
                f"{o['max']} s (min {o.get('min')} s; {o['n']} results); "
                if o.get("n")
                else "evaluation's own seconds): no results; "
            )
            + f"{run.get('busy_retries', 0)} busy "
            f"answers retried, {len(lost)} errors, {len(run.get('abandoned') or [])} requests "
            "abandoned at the bound",
        ]
        lines += [f"- {e['id']}: {e['code']} {e['message'][:160]}" for e in lost[:20]]
    if (s.get("run") or {}).get("state_at_kill"):
        lines += ["", "At the kill (the sandbox's state report):", ""]
        lines += [f"- {x}" for x in s["run"]["state_at_kill"]]
    if s["expected_missed"]:
        lines += ["", "Missed their expected verdict:", ""]
        lines += [
            f"- {m['id']}: expected {m['expected']}, got {m['status']} {m['guards']}: {m['message'][:160]}"
            for m in s["expected_missed"]
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- compare


def _speedup(r: dict[str, Any]) -> float | None:
    v = r.get("speedup_vs_eager")
    return float(v) if isinstance(v, int | float) and v > 0 else None


def timed_sides(r: dict[str, Any]) -> dict[str, Any]:
    """What a speed-up was made of: the candidate's and the eager medians (ms), their sample
    counts, and the host's busy fraction during the exclusive timed hold (``host_busy`` of its
    ``time`` phase; None where not recorded)."""
    t = r.get("timing") or {}
    out: dict[str, Any] = {}
    for side in ("candidate", "eager"):
        st = t.get(side) or {}
        out[f"{side}_ms"] = st.get("median_ms")
        out[f"{side}_n"] = st.get("n")
    phases = (r.get("meta") or {}).get("device_phases") or []
    out["host_busy"] = next(
        (
            ph.get("host_busy")
            for ph in phases
            if ph.get("phase") == "time" and ph.get("mode") == "exclusive"
        ),
        None,
    )
    return out


def _sides_md(a: dict[str, Any], b: dict[str, Any]) -> str:
    def ms(x: Any) -> str:
        return "?" if x is None else f"{x:.4g}"

    parts = [
        f"{side} {ms(a.get(side + '_ms'))} -> {ms(b.get(side + '_ms'))} ms "
        f"(n {a.get(side + '_n')} -> {b.get(side + '_n')})"
        for side in ("candidate", "eager")
    ]
    if a.get("host_busy") is not None or b.get("host_busy") is not None:
        parts.append(f"host busy {a.get('host_busy')} -> {b.get('host_busy')}")
    return "; ".join(parts)


def compare(
    a: list[dict[str, Any]], b: list[dict[str, Any]], tol: float = SPEEDUP_TOL
) -> dict[str, Any]:
    """Verdicts of two runs of the same batch, candidate by candidate (matched by bench id), and
    honest candidates' speed-ups vs eager (``|a/b - 1| <= tol`` where both are ok)."""
    ia = {bench_id(r): r for r in a}
    ib = {bench_id(r): r for r in b}
    both = sorted(set(ia) & set(ib))
    differ, speed = [], []
    for i in both:
        ra, rb = ia[i], ib[i]
        if ra.get("status") != rb.get("status"):
            differ.append(
                {
                    "id": i,
                    "a": ra.get("status"),
                    "b": rb.get("status"),
                    "a_message": str(ra.get("message", ""))[:200],
                    "b_message": str(rb.get("message", ""))[:200],
                }
            )
        honest = ((ra.get("meta") or {}).get("bench") or {}).get("honest") is True
        sa, sb = _speedup(ra), _speedup(rb)
        if honest and ra.get("status") == "ok" and rb.get("status") == "ok" and sa and sb:
            dev = sa / sb - 1.0
            speed.append(
                {
                    "id": i,
                    "a": round(sa, 4),
                    "b": round(sb, 4),
                    "dev": round(dev, 4),
                    "within": abs(dev) <= tol,
                    "a_timed": timed_sides(ra),
                    "b_timed": timed_sides(rb),
                }
            )
    outside = [s for s in speed if not s["within"]]
    return {
        "compared": len(both),
        "only_a": sorted(set(ia) - set(ib)),
        "only_b": sorted(set(ib) - set(ia)),
        "verdicts_identical": not differ,
        "verdicts_differ": differ,
        "honest_speedups": len(speed),
        "speedups_within_tol": not outside,
        "tol": tol,
        "speedups_outside": outside,
        "max_abs_dev": max((abs(s["dev"]) for s in speed), default=None),
        "speedups": speed,
    }


def compare_md(c: dict[str, Any]) -> str:
    lines = [
        f"{c['compared']} candidates in both runs ({len(c['only_a'])} only in the first, "
        f"{len(c['only_b'])} only in the second): verdicts "
        f"**{'identical' if c['verdicts_identical'] else 'differ: ' + str(len(c['verdicts_differ']))}**; "
        f"{c['honest_speedups']} honest candidates ok in both, speed-ups "
        f"**{'all within' if c['speedups_within_tol'] else str(len(c['speedups_outside'])) + ' outside'} "
        f"{c['tol']:.0%}** (largest deviation {c['max_abs_dev']})",
    ]
    for d in c["verdicts_differ"]:
        lines.append(
            f"- {d['id']}: {d['a']} vs {d['b']} ({d['a_message'][:100]} | {d['b_message'][:100]})"
        )
    for s in c["speedups_outside"]:
        sides = _sides_md(s.get("a_timed") or {}, s.get("b_timed") or {})
        lines.append(f"- {s['id']}: {s['a']}x vs {s['b']}x ({s['dev']:+.1%}): {sides}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- KernelBench's harness

_ABSENT_STUBS = ("dotenv", "openai", "litellm")


class _StandInBaseModel:
    """pydantic.BaseModel as far as KernelBench's result record uses it: annotated class
    attributes as per-instance defaults (copied), keyword construction, ``model_dump``. Used only
    where pydantic is not installed (the GPU image lacks it); it validates nothing."""

    def __init__(self, **kw: Any) -> None:
        import copy

        for cls in reversed(type(self).__mro__):
            for k in getattr(cls, "__annotations__", {}):
                if k in cls.__dict__:
                    setattr(self, k, copy.deepcopy(cls.__dict__[k]))
        for k, v in kw.items():
            setattr(self, k, v)

    def _fields(self) -> list[str]:
        out: list[str] = []
        for cls in reversed(type(self).__mro__):
            out += [k for k in getattr(cls, "__annotations__", {}) if k not in out]
        return out

    def model_dump(self) -> dict[str, Any]:
        return {k: getattr(self, k, None) for k in self._fields()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k, None)!r}' for k in self._fields())})"


def install_stubs(force: tuple[str, ...] = ()) -> list[str]:
    """Stand-ins for the modules KernelBench imports at package import but its evaluation never
    calls (the LLM clients: dotenv, openai, litellm) and for pydantic's BaseModel, each only where
    the real one is missing (or named in ``force``). Returns the names stubbed."""
    import importlib.util
    import types

    done = []
    if "pydantic" in force or importlib.util.find_spec("pydantic") is None:
        # the real LLM clients import pydantic: beside its stand-in they would not import
        force = (*force, "openai", "litellm")
    for name in (*_ABSENT_STUBS, "pydantic"):
        if name not in force and importlib.util.find_spec(name) is not None:
            continue
        m = types.ModuleType(name)
        if name == "dotenv":
            m.load_dotenv = lambda *a, **k: False  # type: ignore[attr-defined]
        elif name == "openai":
            m.OpenAI = type("OpenAI", (), {})  # type: ignore[attr-defined]
        elif name == "litellm":

            def completion(*a: Any, **k: Any) -> Any:
                raise RuntimeError("litellm stand-in: no LLM calls in the throughput benchmark")

            m.completion = completion  # type: ignore[attr-defined]
        else:
            m.BaseModel = _StandInBaseModel  # type: ignore[attr-defined]
        sys.modules[name] = m
        done.append(name)
    return done


def import_kernelbench(src: Path, force_stubs: tuple[str, ...] = ()) -> tuple[Any, list[str]]:
    """``kernelbench.eval`` imported from ``src`` (KernelBench's ``src/`` folder) with the
    stand-ins it needs here; returns the module and the names stubbed."""
    stubs = install_stubs(force_stubs)
    sys.path.insert(0, str(src))
    import importlib

    mod = importlib.import_module("kernelbench.eval")
    if not str(Path(mod.__file__).resolve()).startswith(str(Path(src).resolve())):
        raise ImportError(f"kernelbench.eval came from {mod.__file__}, not {src}")
    return mod, stubs


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    return str(x)[:2000]


def kb_one(src: Path, inp: Path, outp: Path) -> int:
    """Child process: one candidate through ``eval_kernel_against_ref`` (or, with
    ``compile_only`` in the input, KernelBench's ``build_compile_cache``)."""
    t0 = time.time()
    job = json.loads(inp.read_text())
    kb, stubs = import_kernelbench(src)
    from kernelbench.utils import set_gpu_arch

    set_gpu_arch(job.get("gpu_arch", ["Hopper"]))
    t_import = time.time() - t0
    doc: dict[str, Any] = {"stubs": stubs, "import_s": round(t_import, 2)}
    if job.get("compile_only"):
        ok, _out, err = kb.build_compile_cache(
            job["code"], verbose=False, build_dir=job["build_dir"]
        )
        doc.update({"compile_only": True, "compiled": bool(ok), "error": err})
    else:
        import torch

        try:
            res = kb.eval_kernel_against_ref(
                original_model_src=job["ref"],
                custom_model_src=job["code"],
                measure_performance=True,
                num_correct_trials=job.get("num_correct_trials", KB_CORRECT_TRIALS),
                num_perf_trials=job.get("num_perf_trials", KB_PERF_TRIALS),
                build_dir=job["build_dir"],
                device=torch.device("cuda:0"),
                backend="cuda",
                precision=kb.get_torch_dtype_from_string("fp32"),
            )
        except Exception as e:  # eval_from_generations' "last level catch", as it records it
            kind = "cuda_error" if "CUDA error" in str(e) else "other_error"
            md = {kind: f"{e}", f"{kind}_name": kb.get_error_name(e)}
            res = kb.KernelExecResult(compiled=False, correctness=False, metadata=md)
        if res is None:  # KernelBench's answer to a lock-file error: "please retry"
            doc.update({"result": None})
        else:
            d = res.model_dump() if hasattr(res, "model_dump") else dict(res.__dict__)
            doc.update({"result": _jsonable(d)})
    doc["eval_s"] = round(time.time() - t0 - t_import, 2)
    outp.write_text(json.dumps(doc))
    return 0


def kb_verdict(doc: dict[str, Any] | None, rc: int | None, timed_out: bool) -> tuple[str, str]:
    """KernelBench's outcome as one of our statuses, and the reason from its metadata."""
    if timed_out:
        return "timeout", "no result within the timeout"
    if doc is None:
        return "crash", f"the process ended (rc={rc}) without a result"
    res = doc.get("result")
    if res is None:
        return "infra_error", "eval_kernel_against_ref returned None (lock file error: retry)"
    md = res.get("metadata") or {}
    if not res.get("compiled"):
        for k in ("cuda_error", "other_error"):  # an exception out of eval_kernel_against_ref
            if k in md:
                return "compile_error", f"{k} {md.get(k + '_name', '')}: {str(md[k])[:300]}"
        err = f"{md.get('compilation_error_name', '')}: {md.get('compilation_error', '')}"
        return "compile_error", err[:300]
    if res.get("correctness"):
        extra = " (excessive_speedup flagged)" if md.get("excessive_speedup") else ""
        return "ok", f"correct {md.get('correctness_trials', '')}{extra}"
    if "runtime_error" in md or "runtime_error_name" in md:
        return (
            "runtime_error",
            f"{md.get('runtime_error_name', '')}: {str(md.get('runtime_error', ''))[:300]}",
        )
    if md.get("correctness_issue"):
        return (
            "incorrect",
            f"{md.get('correctness_issue')} max_difference={md.get('max_difference')} trials {md.get('correctness_trials', '')}",
        )
    return "incorrect", json.dumps(md)[:300]


def run_kb(
    subset: Path,
    out_dir: Path,
    *,
    src: Path,
    budget_s: float | None,
    timeout_s: float = KB_TIMEOUT_S,
    precompile_workers: int = 0,
    num_correct_trials: int = KB_CORRECT_TRIALS,
    num_perf_trials: int = KB_PERF_TRIALS,
) -> dict[str, Any]:
    """KernelBench's harness on the subset as its eval_from_generations runs it (one GPU):
    ``precompile_workers`` > 0 first builds every candidate's extensions on the CPU in parallel
    (its ``build_cache`` option), then candidates are evaluated one after another, each in a
    fresh interpreter (its spawn-started pool), killed after ``timeout_s``; no candidate starts
    once ``budget_s`` has passed. Writes kb.jsonl and run.json."""
    out_dir = out_dir.resolve()  # the children run in their own job folders
    src = src.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cands = [json.loads(x) for x in subset.read_text().splitlines() if x.strip()]
    me = Path(__file__).resolve()
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    jobs = []
    for n, c in enumerate(cands):
        d = out_dir / "jobs" / f"{n:03d}"
        d.mkdir(parents=True, exist_ok=True)
        job = {
            "ref": c["task"]["ref_code"],
            "code": c["solution"]["files"]["model_new.py"],
            "build_dir": str(out_dir / "build" / f"{n:03d}"),
            "num_correct_trials": num_correct_trials,
            "num_perf_trials": num_perf_trials,
        }
        jobs.append((c, d, job))

    def child(
        d: Path, name: str, limit: float
    ) -> tuple[dict[str, Any] | None, int | None, bool, float]:
        t = time.time()
        with open(d / f"{name}.log", "wb") as log:
            p = subprocess.Popen(
                [
                    sys.executable,
                    str(me),
                    "kb-one",
                    "--src",
                    str(src),
                    str(d / f"{name}.in.json"),
                    str(d / f"{name}.json"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=d,
                start_new_session=True,
            )
            timed_out = False
            try:
                p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        f = d / f"{name}.json"
        doc = json.loads(f.read_text()) if f.exists() else None
        return doc, p.returncode, timed_out, time.time() - t

    t0 = time.time()
    pre = {"workers": precompile_workers, "wall_s": 0.0}
    if precompile_workers > 0:
        from concurrent.futures import ThreadPoolExecutor

        for _c, d, job in jobs:
            (d / "compile.in.json").write_text(json.dumps({**job, "compile_only": True}))
        with ThreadPoolExecutor(precompile_workers) as ex:
            list(ex.map(lambda j: child(j[1], "compile", timeout_s), jobs))
        pre["wall_s"] = round(time.time() - t0, 1)
    rows = []
    with open(out_dir / "kb.jsonl", "w") as fh:
        for c, d, job in jobs:
            # no start that the budget would not see finish (at the median candidate's pace)
            pace = statistics.median([r["wall_s"] for r in rows]) if rows else 0.0
            if budget_s is not None and time.time() - t0 + pace > budget_s:
                break
            (d / "eval.in.json").write_text(json.dumps(job))
            doc, rc, timed_out, wall = child(d, "eval", timeout_s)
            verdict, reason = kb_verdict(doc, rc, timed_out)
            res = (doc or {}).get("result") or {}
            rt, ref = res.get("runtime", -1.0), res.get("ref_runtime", -1.0)
            row = {
                "bench_id": c["meta"]["bench"]["id"],
                "source": c["meta"]["bench"]["source"],
                "wall_s": round(wall, 2),
                "verdict": verdict,
                "reason": reason,
                "runtime_us": rt,
                "ref_runtime_us": ref,
                "speedup_vs_eager": round(ref / rt, 4)
                if rt and rt > 0 and ref and ref > 0
                else None,
                "excessive_speedup": bool((res.get("metadata") or {}).get("excessive_speedup")),
                "stubs": (doc or {}).get("stubs"),
                "import_s": (doc or {}).get("import_s"),
                "eval_s": (doc or {}).get("eval_s"),
            }
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
    wall = time.time() - t0
    info = {
        "label": "kernelbench-harness",
        "wall_s": round(wall, 1),
        "gpus": 1,
        "subset": len(cands),
        "done": len(rows),
        "precompile": pre,
        "timeout_s": timeout_s,
        "num_correct_trials": num_correct_trials,
        "num_perf_trials": num_perf_trials,
        "per_gpu_hour": per_gpu_hour(len(rows), wall, 1),
    }
    shutil.rmtree(out_dir / "build", ignore_errors=True)
    _write_json(out_dir / "run.json", info)
    return info


# ----------------------------------------------------------------------------- ratio


def ratio(
    ours: list[dict[str, Any]],
    ours_run: dict[str, Any],
    kb: list[dict[str, Any]],
    kb_run: dict[str, Any],
) -> dict[str, Any]:
    """Both harnesses' rates on the subset, their ratio, and the candidates whose verdicts differ
    (KernelBench's reason vs our status, guard codes and message)."""
    ro = ours_run.get("per_gpu_hour") or per_gpu_hour(
        len(ours), float(ours_run.get("wall_s") or 0), int(ours_run.get("gpus") or 1)
    )
    rk = kb_run.get("per_gpu_hour")
    io = {bench_id(r): r for r in ours}
    rows = []
    for k in kb:
        o = io.get(k["bench_id"])
        if o is None:
            continue
        if o.get("status") != k["verdict"]:
            rows.append(
                {
                    "id": k["bench_id"],
                    "ours": o.get("status"),
                    "ours_guards": sorted({str(g.get("code")) for g in o.get("guards") or []}),
                    "ours_message": str(o.get("message", ""))[:300],
                    "kernelbench": k["verdict"],
                    "kernelbench_reason": k["reason"][:300],
                    "kernelbench_speedup": k.get("speedup_vs_eager"),
                }
            )
    same = sum(1 for k in kb if k["bench_id"] in io) - len(rows)
    n_dev = sum(1 for r in ours if reached_device(r))
    ro_dev = per_gpu_hour(n_dev, float(ours_run.get("wall_s") or 0), int(ours_run.get("gpus") or 1))
    return {
        "ours_per_gpu_hour": ro,
        "kernelbench_per_gpu_hour": rk,
        "ratio": round(ro / rk, 2) if ro and rk else None,
        # ours counting only the candidates it took to the device (static rejections as if they
        # had not been done), KernelBench's harness counting all: a lower bound on the ratio
        "ours_reached_device": n_dev,
        "ratio_device_only": round(ro_dev / rk, 2) if ro_dev and rk else None,
        "ours_done": len(ours),
        "kernelbench_done": len(kb),
        "ours_wall_s": ours_run.get("wall_s"),
        "kernelbench_wall_s": kb_run.get("wall_s"),
        "kernelbench_precompile_s": (kb_run.get("precompile") or {}).get("wall_s"),
        "verdicts_same": same,
        "verdicts_differ": rows,
        "kernelbench_stubs": sorted({s for k in kb for s in (k.get("stubs") or [])}),
    }


def ratio_md(r: dict[str, Any]) -> str:
    lines = [
        f"Subset: ours {r['ours_done']} candidates in {r['ours_wall_s']} s "
        f"(**{r['ours_per_gpu_hour']}** per GPU-hour), KernelBench's harness {r['kernelbench_done']} in "
        f"{r['kernelbench_wall_s']} s, pre-compile {r['kernelbench_precompile_s']} s of it "
        f"(**{r['kernelbench_per_gpu_hour']}** per GPU-hour): **{r['ratio']}x** "
        + (
            f"({r['ratio_device_only']}x counting only the {r['ours_reached_device']} candidates "
            "ours took to the device). "
            if r["ratio_device_only"] is not None
            else "(none of ours reached the device). "
        )
        + f"Verdicts: {r['verdicts_same']} the same, {len(r['verdicts_differ'])} differ.",
    ]
    if r["kernelbench_stubs"]:
        lines.append(
            f"(KernelBench imported with stand-ins for {', '.join(r['kernelbench_stubs'])}: not installed there.)"
        )
    if r["verdicts_differ"]:
        lines += ["", "| candidate | ours | KernelBench | why |", "| --- | --- | --- | --- |"]
        for d in r["verdicts_differ"]:
            g = f" {','.join(d['ours_guards'])}" if d["ours_guards"] else ""
            why = f"ours: {d['ours_message'][:120]}; KernelBench: {d['kernelbench_reason'][:120]}"
            lines.append(
                f"| {d['id']} | {d['ours']}{g} | {d['kernelbench']} | {why.replace('|', '/')} |"
            )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("ours", help="the batch through kernelbench-eval run")
    o.add_argument("--batch", type=Path, required=True)
    o.add_argument("--out", type=Path, required=True, help="folder: results.jsonl, run.json")
    serial_modes = o.add_mutually_exclusive_group()
    serial_modes.add_argument(
        "--serial", action="store_true", help="one candidate at a time, one worker"
    )
    serial_modes.add_argument(
        "--serial-device",
        action="store_true",
        help="one candidate at a time on the device (one device worker), compiles ahead",
    )
    o.add_argument("--gpus", default="all")
    o.add_argument("--backend", default="cuda")
    o.add_argument("--feed-s", type=float, help="stop feeding new candidates after this")
    o.add_argument("--timeout-s", type=float, help="kill the run after this")
    o.add_argument("--warm-cache", action="store_true", help="use the usual caches, not fresh ones")
    o.add_argument(
        "--baselines-from",
        type=Path,
        help="profiler cache folder whose baselines/ seed the fresh cache (kb_references.py's)",
    )
    o.add_argument(
        "--run-arg", action="append", default=[], help="extra kernelbench-eval run argument"
    )
    v = sub.add_parser("service", help="the batch through the kernel service over HTTP")
    v.add_argument("--batch", type=Path, required=True)
    v.add_argument("--out", type=Path, required=True, help="folder: results.jsonl, run.json")
    v.add_argument("--gpus", default="all")
    v.add_argument("--backend", default="cuda")
    v.add_argument(
        "--clients",
        type=int,
        default=SERVICE_CLIENTS,
        help="client threads, one request each at a time (also the service's --max-concurrent)",
    )
    v.add_argument(
        "--guard-policy",
        default="kernelbench",
        help="the service's (the batch's and kernelbench-eval run's default: kernelbench)",
    )
    v.add_argument("--feed-s", type=float, help="start no request after this")
    v.add_argument("--timeout-s", type=float, help="stop the service after this")
    v.add_argument("--warm-cache", action="store_true", help="use the usual caches, not fresh ones")
    v.add_argument(
        "--baselines-from",
        type=Path,
        help="profiler cache folder whose baselines/ seed the fresh cache (kb_references.py's)",
    )
    v.add_argument(
        "--serve-arg", action="append", default=[], help="extra `service serve` argument"
    )
    k = sub.add_parser("kb", help="KernelBench's harness on the subset")
    k.add_argument("--subset", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--src", type=Path, required=True, help="KernelBench's src/ folder")
    k.add_argument("--budget-s", type=float)
    k.add_argument("--timeout-s", type=float, default=KB_TIMEOUT_S)
    k.add_argument("--precompile-workers", type=int, default=0)
    k.add_argument("--num-correct-trials", type=int, default=KB_CORRECT_TRIALS)
    k.add_argument("--num-perf-trials", type=int, default=KB_PERF_TRIALS)
    one = sub.add_parser("kb-one")
    one.add_argument("--src", type=Path, required=True)
    one.add_argument("inp", type=Path)
    one.add_argument("outp", type=Path)
    s = sub.add_parser("summary", help="rate, stage split and verdicts of a run folder")
    s.add_argument("dir", type=Path)
    s.add_argument("--md", action="store_true")
    c = sub.add_parser("compare", help="two run folders (or results files) of the same batch")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--tol", type=float, default=SPEEDUP_TOL)
    c.add_argument("--md", action="store_true")
    r = sub.add_parser("ratio", help="ours vs KernelBench's harness on the subset")
    r.add_argument("ours", type=Path, help="run folder of `ours` on the subset")
    r.add_argument("kb", type=Path, help="run folder of `kb`")
    r.add_argument("--md", action="store_true")
    a = ap.parse_args(argv)

    def results_of(p: Path) -> list[dict[str, Any]]:
        return read_jsonl(p / "results.jsonl" if p.is_dir() else p)

    def run_of(p: Path) -> dict[str, Any]:
        f = p / "run.json"
        return json.loads(f.read_text()) if p.is_dir() and f.exists() else {}

    if a.cmd == "ours":
        info = run_ours(
            a.batch,
            a.out,
            serial=a.serial,
            serial_device=a.serial_device,
            gpus=a.gpus,
            feed_s=a.feed_s,
            timeout_s=a.timeout_s,
            extra=a.run_arg,
            fresh_cache=not a.warm_cache,
            baselines_from=a.baselines_from,
            backend=a.backend,
        )
        print(json.dumps(info))
        return 0 if info["rc"] == 0 or info["killed"] else 1
    if a.cmd == "service":
        if a.clients < 1:
            raise SystemExit("throughput: --clients: 1 or more")
        info = run_service(
            a.batch,
            a.out,
            gpus=a.gpus,
            feed_s=a.feed_s,
            timeout_s=a.timeout_s,
            serve_args=a.serve_arg,
            clients=a.clients,
            guard_policy=a.guard_policy,
            fresh_cache=not a.warm_cache,
            baselines_from=a.baselines_from,
            backend=a.backend,
        )
        print(json.dumps(info))
        lost = [e for e in info["errors"] if not e["retried"]]
        return 0 if info["killed"] or (info["rc"] in (0, -signal.SIGTERM) and not lost) else 1
    if a.cmd == "kb":
        info = run_kb(
            a.subset,
            a.out,
            src=a.src,
            budget_s=a.budget_s,
            timeout_s=a.timeout_s,
            precompile_workers=a.precompile_workers,
            num_correct_trials=a.num_correct_trials,
            num_perf_trials=a.num_perf_trials,
        )
        print(json.dumps(info))
        return 0
    if a.cmd == "kb-one":
        return kb_one(a.src, a.inp, a.outp)
    if a.cmd == "summary":
        doc = summarize(results_of(a.dir), run_of(a.dir))
        print(summary_md(doc) if a.md else json.dumps(doc, indent=1))
        return 0
    if a.cmd == "compare":
        doc = compare(results_of(a.a), results_of(a.b), a.tol)
        print(compare_md(doc) if a.md else json.dumps(doc, indent=1))
        return 0 if doc["verdicts_identical"] and doc["speedups_within_tol"] else 1
    doc = ratio(results_of(a.ours), run_of(a.ours), read_jsonl(a.kb / "kb.jsonl"), run_of(a.kb))
    print(ratio_md(doc) if a.md else json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
