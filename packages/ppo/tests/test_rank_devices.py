"""Which GPU a rank's sandbox evaluates on: the one it trains on, as the sandbox names GPUs."""

from cuda_agent.ppo.trainer import rank_gpus


def test_each_rank_evaluates_on_its_local_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # the sandbox's names: the physical ids
    assert [rank_gpus("cuda", r) for r in range(3)] == [["4"], ["5"], ["4"]]  # wraps around
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb")
    assert rank_gpus("cuda", 1) == ["GPU-bb"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none listed: the local rank's index
    assert rank_gpus("cuda", 3) == ["3"]
    assert rank_gpus("cpu", 1) is None  # the rank's own pool, in its own process
