"""Length bucketing and the step schedule (pure Python, no model)."""

from __future__ import annotations

from cuda_agent.training.data import Example, Schedule, bucket


def _ex(i: int, n: int) -> Example:
    return Example(key=f"e{i}", input_ids=tuple(range(n)), loss_mask=(0,) + (1,) * (n - 1))


def test_buckets_respect_the_token_budget_and_cover_every_example():
    exs = [_ex(i, n) for i, n in enumerate([5, 300, 40, 41, 39, 120, 1000, 7])]
    batches = bucket(exs, 256)
    assert sorted(i for b in batches for i in b) == list(range(len(exs)))
    for b in batches:
        longest = max(len(exs[i]) for i in b)
        assert longest * len(b) <= 256 or len(b) == 1  # an over-long example sits alone


def test_every_rank_gets_grad_accum_micro_batches_each_step():
    batches = [[0], [1], [2]]  # fewer micro-batches than one step needs
    s = Schedule(batches, grad_accum=4, world_size=2, seed=0)
    assert s.steps_per_epoch == 1
    for step in range(3):
        for rank in range(2):
            assert len(s.step_batches(step, rank)) == 4
        assert len(s.all_step_batches(step)) == 8


def test_schedule_is_deterministic_and_shuffles_per_epoch():
    batches = [[i] for i in range(10)]
    a = Schedule(batches, grad_accum=1, world_size=1, seed=3)
    b = Schedule(batches, grad_accum=1, world_size=1, seed=3)
    e0 = [a.step_batches(s)[0][0] for s in range(10)]
    e1 = [a.step_batches(s)[0][0] for s in range(10, 20)]
    assert e0 == [b.step_batches(s)[0][0] for s in range(10)]
    assert sorted(e0) == sorted(e1) == list(range(10)) and e0 != e1


def test_value_targets_leave_out_episodes_the_sandbox_failed(tmp_path, capsys):
    """An infra_error episode's -1 is the sandbox's failure, not a value: the critic's data
    (need_reward) leaves it out and says so; the same file without rewards needed keeps it."""
    import msgspec

    from cuda_agent.records import Status
    from cuda_agent.records.examples import trajectory
    from cuda_agent.records.jsonl import encode
    from cuda_agent.training.data import load_examples

    good = msgspec.structs.replace(trajectory(0), reward=1.0)
    t1 = trajectory(1)
    bad = msgspec.structs.replace(
        t1,
        id="infra",
        reward=-1.0,
        eval_result=msgspec.structs.replace(t1.eval_result, status=Status.INFRA_ERROR),
    )
    assert bad.infra_failed and not good.infra_failed
    f = tmp_path / "t.jsonl"
    f.write_bytes(encode(good) + encode(bad))
    kept = load_examples(f, max_len=64, need_reward=True)
    assert [e.reward for e in kept] == [1.0]
    assert "1 trajectories whose evaluation failed in the sandbox" in capsys.readouterr().err
    assert len(load_examples(f, max_len=64)) == 2


def test_episodes_ended_by_an_error_are_left_out(tmp_path, capsys):
    """An episode the harness cut short (a model request or tool that raised: ``stop_reason``
    ``error``) is no demonstration and no value: left out of every use, and counted."""
    import msgspec

    from cuda_agent.records.examples import trajectory
    from cuda_agent.records.jsonl import encode
    from cuda_agent.training.data import load_examples

    good = msgspec.structs.replace(trajectory(0), reward=1.0)
    cut = msgspec.structs.replace(trajectory(1), id="cut", stop_reason="error", reward=0.5)
    assert cut.harness_failed and not cut.infra_failed and not good.harness_failed
    f = tmp_path / "t.jsonl"
    f.write_bytes(encode(good) + encode(cut))
    for need in (True, False):
        assert [e.reward for e in load_examples(f, max_len=64, need_reward=need)] == [1.0]
        assert "1 trajectories ended by an error" in capsys.readouterr().err
