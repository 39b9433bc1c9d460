"""Seed catalogue, crawl and compose: real programs, run on the CPU."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from cuda_agent.opsynth.catalog import CATEGORIES, SEEDS
from cuda_agent.opsynth.compose import ComposeConfig, build_chain, compose
from cuda_agent.opsynth.crawl import coverage, crawl, resolve
from cuda_agent.profiler.program import Program, check_contract

OPSYNTH = [sys.executable, "-m", "cuda_agent.opsynth.cli"]


def _run_task(code: str, seed: int = 0):
    prog = Program.from_source(code, name="t_opsynth")
    model = prog.make_model(seed=seed)
    with torch.no_grad():
        return model(*prog.make_inputs(seed=seed))


def test_catalogue_has_100_seeds_across_all_categories():
    assert len(SEEDS) >= 100
    cats = {s.category for s in SEEDS.values()}
    assert cats == set(CATEGORIES)
    assert any(s.origin == "transformers" for s in SEEDS.values())
    # every torch op name resolves in the installed torch
    for s in SEEDS.values():
        if s.origin == "torch":
            assert resolve(s.op) is not None, s.op


def test_every_seed_builds_a_legal_program():
    # meta-device shape propagation only (no probe): every catalogue entry yields a task
    tasks = list(crawl(size="tiny", probe=False))
    assert len(tasks) == len(SEEDS)
    assert len({t.id for t in tasks}) == len(tasks)


def test_crawl_probes_rng_and_emits_runnable_seed_tasks():
    tasks = list(crawl(size="tiny", categories=["activation", "loss"]))
    by = {t.name: t for t in tasks}
    assert len(tasks) >= 40
    # probed, not guessed: dropout and RReLU draw random numbers in train mode only
    for name in ("Dropout", "RReLU", "AlphaDropout"):
        assert by[name].meta["stochastic"] and by[name].meta["rng_train"]
        assert not by[name].meta["rng_eval"]
    for name in ("ReLU", "GELU", "Softmax", "MSELoss", "CrossEntropyLoss"):
        assert by[name].meta["stochastic"] is False
    for t in tasks:
        assert t.source == "opsynth" and t.ops == [SEEDS[t.name].op]
        assert check_contract(t.ref_code) == []
        assert t.meta["category"] in ("activation", "loss")
    out = _run_task(by["CrossEntropyLoss"].ref_code)  # per-sample loss: one value per row
    assert out.shape == (by["CrossEntropyLoss"].meta["output_shape"][0],)
    assert torch.isfinite(out).all() and 'reduction="none"' in by["CrossEntropyLoss"].ref_code


def test_coverage_lists_uncovered_torch_ops():
    c = coverage()
    assert "conv2d" in c["covered"] and "Conv2d" not in c["nn_not_covered"]
    assert "AdaptiveAvgPool2d" not in c["nn_not_covered"]  # F.adaptive_avg_pool2d covers it


def test_build_chain_adapts_shapes():
    rng = random.Random(0)
    b = build_chain(["Conv2d", "GroupNorm", "Gemm", "LogSumExp"], rng, size="tiny")
    code = b.render("Conv2d_GroupNorm_Gemm_LogSumExp")
    assert "torch.flatten(x, 1)" in code  # rank 4 -> 2 for the GEMM
    out = _run_task(code)
    assert list(out.shape) == [d.value for d in b.shape]
    assert out.dim() in (1, 2)  # LogSumExp over features (keepdim or not)


def test_compose_tasks_run_and_match_meta_shapes():
    cfg = ComposeConfig(size="tiny")
    tasks = list(compose(25, seed=7, cfg=cfg))
    assert len({t.id for t in tasks}) == 25
    for t in tasks:
        assert t.name == "_".join(t.meta["seeds"])
        assert 1 <= t.meta["n_ops"] <= 5 and len(t.ops) == t.meta["n_ops"]
        assert "class Model(nn.Module)" in t.ref_code and "def get_init_inputs" in t.ref_code
        out = _run_task(t.ref_code)
        assert list(out.shape) == t.meta["output_shape"], t.name
        assert not any(SEEDS[s].stochastic_hint for s in t.meta["seeds"])
    # KernelBench level-2 mix: most chains start with a heavy op
    heavy_first = sum(SEEDS[t.meta["seeds"][0]].heavy for t in tasks)
    assert heavy_first >= 10
    # reproducible
    again = [t.id for t in compose(5, seed=7, cfg=cfg)]
    assert again == [t.id for t in tasks[:5]]


def test_compose_length_distribution_is_configurable():
    cfg = ComposeConfig(size="tiny", length_weights={3: 1.0})
    tasks = list(compose(8, seed=1, cfg=cfg))
    assert {t.meta["n_ops"] for t in tasks} == {3}
    with pytest.raises(ValueError):
        list(compose(1, seed=1, cfg=ComposeConfig(size="tiny", max_ops=2, length_weights={4: 1})))


def test_compose_cli_writes_records_and_resumes(tmp_path):
    out = tmp_path / "c.jsonl"
    env = dict(os.environ)
    cmd = OPSYNTH + ["compose", "--n", "3", "--seed", "2", "--size", "tiny", "-o", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""  # records went to the file
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["kind"] == "task" for x in lines)
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "0 tasks written, 3 already in" in p.stderr
    assert len(out.read_text().splitlines()) == 3
    bad = subprocess.run(OPSYNTH + ["compose", "--size", "huge"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--size" in bad.stderr


def test_compose_pool_restricted_to_crawled_seeds():
    cfg = ComposeConfig(size="tiny", seed_names={"Gemm", "ReLU", "Tanh", "LayerNorm"})
    tasks = list(compose(4, seed=0, cfg=cfg))
    assert all(set(t.meta["seeds"]) <= cfg.seed_names for t in tasks)
    with pytest.raises(ValueError):
        list(compose(1, seed=0, cfg=ComposeConfig(size="tiny", seed_names={"NoSuchSeed"})))
