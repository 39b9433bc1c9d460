"""The candidate's outputs reach the judge through one file that is written over in place: the
judge hands each judged output's file back (``runner.FREE_SLOT``), the next output goes into it.
A new file per output must get a page of the page cache for every 4 KiB (seconds per multi-GB
output on a host full of cached files)."""

from __future__ import annotations

import os

import torch

from cuda_agent.sandbox import runner


def test_the_next_output_is_written_over_the_handed_back_file(tmp_path):
    a = torch.arange(100_000, dtype=torch.float32)
    runner._save_output(a, tmp_path / "out_0.pt")
    ino = (tmp_path / "out_0.pt").stat().st_ino
    runner._hand_back(tmp_path / "out_0.pt", tmp_path / runner.FREE_SLOT, keep=True)
    assert not (tmp_path / "out_0.pt").exists()  # what the candidate waits for
    b = torch.ones(10, dtype=torch.float64)  # shorter: nothing of the first may be left
    runner._save_output({"y": b}, tmp_path / "out_1.pt")
    f = tmp_path / "out_1.pt"
    assert f.stat().st_ino == ino and not (tmp_path / runner.FREE_SLOT).exists()
    assert f.stat().st_size < 4096
    assert torch.equal(torch.load(f, weights_only=True)["y"], b)
    # the last output is removed, not handed back
    runner._hand_back(f, tmp_path / runner.FREE_SLOT, keep=False)
    assert not f.exists() and not (tmp_path / runner.FREE_SLOT).exists()


def test_a_slot_that_is_not_a_writable_file_gets_a_new_file(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not the candidate's")
    os.symlink(target, tmp_path / runner.FREE_SLOT)  # a link where the slot should be
    runner._save_output(torch.zeros(3), tmp_path / "out_1.pt")
    assert target.read_bytes() == b"not the candidate's"
    assert torch.equal(torch.load(tmp_path / "out_1.pt", weights_only=True), torch.zeros(3))


def test_the_judges_sketch_is_a_copy_not_a_view_of_the_file(tmp_path):
    # on the CPU a loaded output is a view of its file; the candidate writes the next output over
    # that file, so what the judge keeps of it must be its own
    runner._save_output(torch.full((64,), 2.0), tmp_path / "out_0.pt")
    loaded = torch.load(tmp_path / "out_0.pt", weights_only=True, mmap=True)
    sk = runner._sketch(loaded)
    runner._hand_back(tmp_path / "out_0.pt", tmp_path / runner.FREE_SLOT, keep=True)
    runner._save_output(torch.full((64,), 7.0), tmp_path / "out_1.pt")
    assert torch.equal(sk, torch.full((64,), 2.0))
