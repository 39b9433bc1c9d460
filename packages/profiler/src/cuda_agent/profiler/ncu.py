"""Per-kernel summaries of one forward call: Nsight Compute when available, else torch.profiler.

``profile_program`` runs ``python -m cuda_agent.profiler.ncu_target`` under
``ncu --clock-control none --profile-from-start off`` (the target opens the profiling window
around one call after warm-up), parses the raw CSV and keeps, per kernel: duration, achieved
occupancy, DRAM and SM throughput (% of peak), registers per thread, shared memory per block,
block/grid size and the top stall reasons. ``summary_text`` renders it compactly for an agent.
When ``ncu`` is missing or cannot read the counters, the same target is run with
``torch.profiler`` and a kernel-time table is returned (``tool == "torch.profiler"``).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")

_M = {
    "duration_ns": ("gpu__time_duration.sum",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "dram_pct": (
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "mem_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "registers": ("launch__registers_per_thread",),
    "smem_static": ("launch__shared_mem_per_block_static",),
    "smem_dynamic": ("launch__shared_mem_per_block_dynamic",),
    "block_size": ("launch__block_size",),
    "grid_size": ("launch__grid_size",),
}
_STALL = re.compile(
    r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)(?:_per_issue_active)?\.ratio$"
)


class KernelSummary(msgspec.Struct, kw_only=True):
    """One kernel launch of the profiled call."""

    name: str
    duration_us: float | None = None
    occupancy_pct: float | None = None
    dram_pct: float | None = None
    sm_pct: float | None = None
    mem_pct: float | None = None
    registers: int | None = None
    smem_per_block_bytes: int | None = None
    block_size: int | None = None
    grid_size: int | None = None
    stalls: list[tuple[str, float]] = []  # top reasons, cycles per issued instruction


class ProfileReport(msgspec.Struct, kw_only=True):
    tool: str  # "ncu" | "torch.profiler"
    program: str
    kernels: list[KernelSummary] = []
    total_us: float = 0.0
    note: str = ""


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    s = s.strip().replace(",", "")
    if not s or s.lower() in ("n/a", "nan"):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_ncu_csv(text: str, program: str = "", top_stalls: int = 3) -> ProfileReport:
    """Parse ``ncu --csv --page raw`` output into a report (unit row and log lines tolerated)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header found in the output")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    col = {h: i for i, h in enumerate(header)}
    kernels: list[KernelSummary] = []
    for r in rows[1:]:
        if len(r) != len(header) or not r[0].strip().isdigit():
            continue  # the units row, or stray lines

        def get(names: tuple[str, ...], r=r) -> float | None:
            for n in names:
                if n in col:
                    v = _num(r[col[n]])
                    if v is not None:
                        return v
            return None

        name = r[col["Kernel Name"]] if "Kernel Name" in col else r[col.get("Function Name", 0)]
        stalls = []
        for h, i in col.items():
            m = _STALL.match(h)
            if m and m.group(1) not in ("selected", "not_selected"):
                v = _num(r[i])
                if v is not None and v > 0:
                    stalls.append((m.group(1), round(v, 2)))
        stalls.sort(key=lambda kv: -kv[1])
        dur = get(_M["duration_ns"])
        # duration may be reported in ns (raw page, --print-units base) or us/ms (unit row)
        ss, sd = get(_M["smem_static"]), get(_M["smem_dynamic"])
        regs, bs, gs = get(_M["registers"]), get(_M["block_size"]), get(_M["grid_size"])
        kernels.append(
            KernelSummary(
                name=name,
                duration_us=None if dur is None else dur / 1e3,
                occupancy_pct=get(_M["occupancy_pct"]),
                dram_pct=get(_M["dram_pct"]),
                sm_pct=get(_M["sm_pct"]),
                mem_pct=get(_M["mem_pct"]),
                registers=None if regs is None else int(regs),
                smem_per_block_bytes=None
                if ss is None and sd is None
                else int((ss or 0) + (sd or 0)),
                block_size=None if bs is None else int(bs),
                grid_size=None if gs is None else int(gs),
                stalls=stalls[:top_stalls],
            )
        )
    total = sum(k.duration_us or 0.0 for k in kernels)
    return ProfileReport(tool="ncu", program=program, kernels=kernels, total_us=total)


def _short(name: str, width: int = 60) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def summary_text(rep: ProfileReport, max_kernels: int = 15) -> str:
    """Compact text for an agent: one line per kernel, longest first."""
    ks = sorted(rep.kernels, key=lambda k: -(k.duration_us or 0.0))
    out = [f"{rep.tool}: {len(rep.kernels)} kernels, {rep.total_us:.1f} us total ({rep.program})"]
    if rep.note:
        out.append(f"note: {rep.note}")

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for k in ks[:max_kernels]:
        parts = [f"{f(k.duration_us, '9.1f')} us", _short(k.name)]
        if rep.tool == "ncu":
            parts.append(
                f"occ {f(k.occupancy_pct, '.0f')}% dram {f(k.dram_pct, '.0f')}% "
                f"sm {f(k.sm_pct, '.0f')}% regs {k.registers if k.registers is not None else '-'} "
                f"smem {k.smem_per_block_bytes if k.smem_per_block_bytes is not None else '-'}B "
                f"block {k.block_size or '-'} grid {k.grid_size or '-'}"
            )
            if k.stalls:
                parts.append("stalls " + ", ".join(f"{n} {v:g}" for n, v in k.stalls))
        out.append(" | ".join(parts))
    if len(ks) > max_kernels:
        out.append(f"... {len(ks) - max_kernels} more kernels")
    return "\n".join(out)


def find_ncu() -> str | None:
    """Path of the ``ncu`` executable ($NCU, PATH, /usr/local/cuda/bin, /opt/nvidia)."""
    env = os.environ.get("NCU")
    if env and Path(env).exists():
        return env
    p = shutil.which("ncu")
    if p:
        return p
    for c in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"), reverse=True) + [
        Path("/usr/local/cuda/bin/ncu")
    ]:
        if c.exists():
            return str(c)
    return None


def _target_cmd(
    ref: Path, new: Path | None, mode: str, device: str, model_mode: str = "eval"
) -> list[str]:
    cmd = [sys.executable, "-m", "cuda_agent.profiler.ncu_target", str(ref), "--mode", mode]
    cmd += ["--device", device, "--model-mode", model_mode]
    if new is not None:
        cmd += ["--new", str(new)]
    return cmd


def profile_program(
    ref: Path,
    *,
    new: Path | None = None,
    device: str = "cuda",
    timeout_s: float = 300.0,
    use_ncu: bool = True,
    launch_count: int = 200,
    raw_csv_out: Path | None = None,
    model_mode: str = "eval",
) -> ProfileReport:
    """Profile one forward call of ``ref``'s Model (or ``new``'s ModelNew) after warm-up, the
    module in ``model_mode`` (the task's)."""
    program = str(new or ref)
    ncu = find_ncu() if use_ncu else None
    note = ""
    if ncu is not None:
        cmd = [
            ncu,
            "--clock-control",
            "none",
            "--profile-from-start",
            "off",
            "--target-processes",
            "all",
            "--launch-count",
            str(launch_count),
            "--csv",
            "--page",
            "raw",
            "--print-units",
            "base",
        ]
        for s in SECTIONS:
            cmd += ["--section", s]
        cmd += _target_cmd(ref, new, "ncu", device, model_mode)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if raw_csv_out is not None:
                raw_csv_out.write_text(p.stdout + "\n# stderr\n" + p.stderr)
            rep = parse_ncu_csv(p.stdout, program=program)
            if rep.kernels:
                return rep
            note = "ncu found no kernels: " + (p.stderr or p.stdout)[-300:].strip()
        except subprocess.TimeoutExpired:
            note = f"ncu timed out after {timeout_s:.0f}s"
        except ValueError as e:
            tail = (p.stderr or p.stdout)[-300:].strip()
            note = f"ncu output unusable ({e}): {tail}"
    else:
        note = "ncu not found" if use_ncu else "ncu disabled"
    rep = _torch_profile(ref, new, device, timeout_s, model_mode)
    rep.note = (note + "; fell back to torch.profiler").strip("; ")
    return rep


def _torch_profile(
    ref: Path, new: Path | None, device: str, timeout_s: float, model_mode: str = "eval"
) -> ProfileReport:
    cmd = _target_cmd(ref, new, "torch", device, model_mode)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"profiling target failed: {p.stderr[-1000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    return msgspec.json.decode(line, type=ProfileReport)
