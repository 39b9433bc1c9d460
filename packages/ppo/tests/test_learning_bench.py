"""benchmarks/learning.py: its pieces (curriculum, aggregation, acceptance, resume) and, on a tiny
random model, the whole chain (cold start, RFT, held-out evaluation, one PPO step, report) on
the real cpu sandbox."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"


@pytest.fixture(scope="module")
def L():
    spec = importlib.util.spec_from_file_location("learning_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["learning_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def _m(L, stage, seed, step, reward):
    return L.StageMetrics(
        stage=stage,
        seed=seed,
        ppo_step=step,
        n=2,
        reward_mean=reward,
        pass_rate=(reward + 1) / 2,
        rewards={},
        seconds=1.0,
        model="m",
    )


def test_curriculum_split_and_scripted_answer(L):
    specs = L.curriculum(["scale", "clampmax"], heldout_per_family=1, per_family=3)
    assert [s.name for s in specs if s.heldout] == ["Scale_3_0", "ClampMax_3_0"]
    assert len({s.name for s in specs}) == 6
    turn = L.solve_turn(specs[0])
    assert "x[i] * 0.5f" in turn and '"name": "Submit"' in turn
    assert L.seed_list("0, 1,2") == [0, 1, 2]


def test_aggregate_and_acceptance(L):
    rows = [_m(L, "base", 0, 0, -1.0), _m(L, "rft", 0, 0, 0.0)]
    rows += [_m(L, "ppo", s, 2, r) for s, r in ((0, 0.5), (1, 0.5), (2, 1.0))]
    rows += [_m(L, "ppo", 2, 2, 0.5)]  # a re-evaluation: the last line wins
    rows = L.expand_shared(rows)
    groups = {(g["stage"], g["ppo_step"]): g for g in L.aggregate(rows)}
    assert list(groups) == [("base", 0), ("rft", 0), ("ppo", 2)]
    assert groups[("rft", 0)]["seeds"] == [0, 1, 2] and groups[("rft", 0)]["reward_std"] == 0
    assert groups[("ppo", 2)]["reward_per_seed"] == [0.5, 0.5, 0.5]
    acc = L.acceptance(rows)
    assert acc["delta_per_seed"] == [0.5, 0.5, 0.5] and acc["spread"] == 0 and acc["holds"]
    rows.append(_m(L, "ppo", 1, 4, -0.5))  # the newest PPO step of a seed is its end point
    acc = L.acceptance(rows)
    assert acc["ppo_reward"] == [0.5, -0.5, 0.5] and not acc["holds"]


def test_ppo_config_loads(L, tmp_path):
    from cuda_agent.ppo.config import load_config

    o = dict(
        tasks_per_step=2,
        samples_per_task=1,
        max_turns=2,
        max_new_tokens=8,
        max_context=512,
        temperature=1.0,
        timing=False,
        ppo_epochs=1,
        minibatches=1,
        actor_lr=1e-5,
        kl_coef=0.0,
        micro_batch_tokens=1024,
        critic_free_baseline="task",
        device="cpu",
    )
    f = tmp_path / "ppo.toml"
    L.ppo_config(
        f, actor="smollm2", tasks=tmp_path / "t.jsonl", out=tmp_path / "o", seed=3, steps=2, o=o
    )
    cfg = load_config(f)
    assert cfg.rollout.tools == ["Write", "Submit"] and cfg.train.seed == 3 and cfg.ppo.steps == 2
    assert not cfg.ppo.use_critic and not cfg.sandbox.timing
    assert cfg.ppo.critic_free_baseline == "task"


@pytest.mark.slow
def test_end_to_end_tiny_and_resume(L, tmp_path):
    """The whole benchmark on a tiny random model: 2 train tasks, 1 held out, one PPO step; a
    second invocation finds everything done and evaluates nothing again."""
    from typer.testing import CliRunner

    from cuda_agent.agent.models import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny", seed=0)
    work = tmp_path / "work"
    args = ["run", "--work", str(work), "--seeds", "0", "--model", str(model)]
    args += ["--families", "scale", "--per-family", "3", "--heldout-per-family", "1"]
    args += ["--max-turns", "1"]
    args += ["--max-new-tokens", "1024", "--max-context", "4096", "--ppo-steps", "1"]
    args += ["--eval-every", "1", "--tasks-per-step", "1", "--samples-per-task", "1"]
    args += ["--rft-batch-tokens", "8192", "--minibatches", "1"]
    r = CliRunner().invoke(L.app, args)
    assert r.exit_code == 0, r.output + str(r.exception)
    rows = L.load_results(work)
    assert [(x.stage, x.ppo_step) for x in rows] == [("rft", 0), ("ppo", 1), ("base", 0)]
    kept = (work / "coldstart" / "kept.jsonl").read_text().splitlines()
    assert len(kept) == 2 and all(json.loads(k)["reward"] == 1.0 for k in kept)
    assert (work / "seed-0" / "ppo" / "checkpoint-1" / "actor" / "config.json").exists()
    r = CliRunner().invoke(L.app, args)  # resumed: nothing left to do
    assert r.exit_code == 0, r.output
    assert len(L.load_results(work)) == 3
    out = tmp_path / "report"
    r = CliRunner().invoke(L.app, ["report", "--work", str(work), "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["acceptance"]["seeds"] == [0] and (out / "learning.png").stat().st_size > 0
    # a second seed in its own process (--jobs): it starts from the shared RFT actor, seed 0
    # is found done; the subprocess's output is in the seed's run.log
    r = CliRunner().invoke(L.app, [*args[:4], "0,1", *args[5:], "--jobs", "2"])
    assert r.exit_code == 0, r.output + str(r.exception)
    rows = L.load_results(work)
    assert sorted((x.stage, x.seed, x.ppo_step) for x in rows) == [
        ("base", 0, 0),
        ("ppo", 0, 1),
        ("ppo", 1, 1),
        ("rft", 0, 0),
    ]
    assert "seed 1 done" in (work / "seed-1" / "run.log").read_text()
    assert not (work / "rft-1").exists()
