"""The one NVML owner: answers where the driver is there, None (never an exception) where not."""

import pytest
import torch

from cuda_agent.profiler import nvml


def test_torch_index_to_nvml_index():
    assert nvml.nvml_index(0, visible="3,1") == 3
    assert nvml.nvml_index(1, visible="3,1") == 1
    assert nvml.nvml_index(2, visible="3,1") == 2  # past the list: as given
    assert nvml.nvml_index(0, visible="GPU-abc") == 0  # UUIDs are not indices
    assert nvml.nvml_index(1, visible="") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answers without a GPU")
def test_without_a_driver_every_answer_is_none():
    assert nvml.device_name(0) is None
    assert nvml.device_uuids() is None
    assert nvml.memory_bytes(0, "free") is None
    s = nvml.Sampler(0)
    assert s.clock_mhz() is None and s.clock_mhz("MEM") is None
    assert s.uuid() is None and s.memory_bytes() is None
    assert nvml.Sampler(None).clock_mhz() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_it_names_counts_and_samples():
    idx = nvml.nvml_index(0)
    assert nvml.device_name(idx) == torch.cuda.get_device_name(0)
    uuids = nvml.device_uuids()
    assert uuids and all(u.startswith(("GPU-", "MIG-")) for u in uuids)
    total = nvml.memory_bytes(idx, "total")
    assert total and total >= torch.cuda.get_device_properties(0).total_memory * 0.9
    s = nvml.Sampler(idx)
    assert (s.clock_mhz() or 0) > 100 and (s.clock_mhz("MEM") or 0) > 100
    assert s.uuid() in uuids
