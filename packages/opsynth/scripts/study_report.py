"""Numbers for the README's comparison: python study_report.py STUDY_DIR OPS6K_FULL.jsonl"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from cuda_agent.opsynth.stats import describe, filter_report, markdown_compare
from cuda_agent.records.jsonl import load_records
from cuda_agent.records.types import Task


def tasks(p: Path) -> list[Task]:
    return [t for t in load_records(p) if isinstance(t, Task)] if p.exists() else []


def shrink_induced(t: Task) -> bool:
    """An eager error of a shrunk copy whose original runs on the meta device."""
    import torch

    from cuda_agent.profiler.program import Program

    try:
        prog = Program.from_source(t.ref_code, name="study_orig")
        m = prog.make_model(device="meta")
        with torch.no_grad():
            m(*prog.make_inputs(device="meta"))
        return True
    except Exception:  # noqa: BLE001
        return False


def main() -> None:
    d = Path(sys.argv[1])
    full = tasks(Path(sys.argv[2]))
    ours = tasks(d / "ours_composed.jsonl")
    named = {"ours (compose --size cpu, 300)": describe(ours), "Ops-6K (all 6000)": describe(full)}
    print(markdown_compare(named))
    print()
    rep = {}
    for name, kept, rej in [
        ("ours", d / "ours_kept.jsonl", d / "ours_rejected.jsonl"),
        ("ops6k", d / "ops6k_kept.jsonl", d / "ops6k_rejected.jsonl"),
    ]:
        k, r = tasks(kept), tasks(rej)
        # a second worker may have run the same sample in reverse order (*_rev files)
        k += tasks(kept.with_name(kept.stem + "_rev.jsonl"))
        r += tasks(rej.with_name(rej.stem + "_rev.jsonl"))
        k = list({t.meta.get("filter", {}).get("input_id", t.id): t for t in k}.values())
        seen = {t.meta.get("filter", {}).get("input_id", t.id) for t in k}
        r = [t for t in {t.id: t for t in r}.values() if t.id not in seen]
        fr = filter_report(k, r)
        if name == "ops6k":
            errs = [t for t in r if t.meta["rejected"]["reason"] in ("eager_error", "load_error")]
            fr["eager_error_shrink_induced"] = sum(shrink_induced(t) for t in errs)
            fr["shrunk_rows"] = sum(
                bool((t.meta.get("filter") or t.meta.get("rejected") or {}).get("shrunk"))
                for t in k + r
            )
        fr["examples"] = {}
        for t in r:
            fr["examples"].setdefault(t.meta["rejected"]["reason"], []).append(
                (t.name, t.meta["rejected"]["detail"][:120])
            )
        fr["examples"] = {k2: v[:3] for k2, v in fr["examples"].items()}
        rep[name] = fr
    dd = tasks(d / "ours_dedup_rejected.jsonl")
    rep["ours_dedup"] = dict(Counter(t.meta["rejected"]["reason"] for t in dd))
    rep["ours_final"] = len(tasks(d / "ours_final.jsonl"))
    print(json.dumps(rep, indent=1, default=str))


if __name__ == "__main__":
    main()
