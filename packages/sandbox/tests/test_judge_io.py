"""What the judge reads: an output file written by the runner keeps a broadcast view's real
storage (the output floor counts what was really written), and a file appears whole or not at all."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.profiler.sol import storage_bytes
from cuda_agent.sandbox.runner import _save_output, _sketch


def test_a_broadcast_output_keeps_its_small_storage_through_the_file(tmp_path):
    row = torch.rand(4096, 1)
    out = (row + 1).expand(-1, 1 << 12)  # 64 MiB as a dense tensor, 16 KiB really
    f = tmp_path / "out_0.pt"
    _save_output(out, f)
    back = torch.load(f, weights_only=True, mmap=True)
    assert torch.equal(back, out)
    assert storage_bytes(back) == 4096 * 4
    assert f.stat().st_size < 1 << 20
    dense = torch.rand(64, 64)
    _save_output((dense, out), tmp_path / "out_1.pt")
    a, b = torch.load(tmp_path / "out_1.pt", weights_only=True)
    assert torch.equal(a, dense) and torch.equal(b, out)
    assert not list(tmp_path.glob("*.part"))  # written under a temporary name, then renamed


def test_sketches_sample_the_same_positions_for_equal_shapes():
    x = torch.arange(10_000_000, dtype=torch.float32)
    s1, s2 = _sketch(x), _sketch(x + 1)
    assert s1.numel() <= 1 << 22 and s1.shape == s2.shape
    assert torch.equal(s2 - s1, torch.ones_like(s1))
    small = torch.rand(3, 5)
    assert torch.equal(_sketch(small), small.reshape(-1))


def test_the_judge_never_follows_a_link_the_candidate_planted(tmp_path):
    from cuda_agent.sandbox.compare import Tolerance, compare
    from cuda_agent.sandbox.runner import _judge_file

    secret = tmp_path / "secret.pt"
    torch.save(torch.ones(4), secret)
    link = tmp_path / "out_0.pt"
    link.symlink_to(secret)
    v, sketch = _judge_file(link, True, torch.ones(4), Tolerance(), "cpu", compare, {})
    assert not v["passed"] and "not a regular file" in v["message"] and sketch is None
    real = tmp_path / "out_1.pt"
    _save_output(torch.ones(4), real)
    v, sketch = _judge_file(real, True, torch.ones(4), Tolerance(), "cpu", compare, {})
    assert v["passed"] and v["storage_bytes"] == 16 and torch.equal(sketch, torch.ones(4))


@pytest.mark.gpu
def test_device_outputs_go_through_reused_page_locked_buffers(tmp_path):
    from cuda_agent.sandbox.runner import _STAGING

    big = torch.randn(32 << 20, device="cuda")  # 128 MiB: staged
    small = torch.randn(1000, device="cuda")  # plain copy
    row = torch.rand(1 << 20, 1, device="cuda").expand(-1, 64)  # broadcast: its 4 MiB only
    for trial in range(2):
        x = big * (trial + 1)
        f = tmp_path / f"out_{trial}.pt"
        _save_output((x, small, row), f)
        a, b, c = torch.load(f, weights_only=True, mmap=True)
        assert torch.equal(a.cuda(), x) and torch.equal(b.cuda(), small)
        assert torch.equal(c.cuda(), row) and storage_bytes(c) == (1 << 20) * 4
        if trial == 0:
            first = _STAGING.buffers[0]
            assert first.is_pinned() and set(_STAGING.buffers) == {0}
    assert _STAGING.buffers[0] is first  # the second trial reused the first's buffer
    other = torch.randn(16 << 20, dtype=torch.float64, device="cuda")  # another shape and dtype
    _save_output(other, tmp_path / "out_2.pt")
    assert torch.equal(torch.load(tmp_path / "out_2.pt", weights_only=True).cuda(), other)
    assert _STAGING.buffers[0].dtype == torch.float64
