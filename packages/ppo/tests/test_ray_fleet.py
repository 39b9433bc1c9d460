"""PPO with ``sandbox.ray_address``: a step's episodes are evaluated by the Ray fleet (a cluster of
two local nodes, Ray's own ``ray.cluster_utils.Cluster``, loopback only), not by a pool of the
trainer's own, and the run closes the fleet when it ends. Skipped where Ray is not installed
(`uv sync --extra ray`)."""

from __future__ import annotations

import os

import pytest

# before Ray is imported (see packages/sandbox/tests/test_fleet.py): workers use this
# environment, and Ray's own addresses are the loopback ones
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from cuda_agent.records import Trajectory  # noqa: E402
from cuda_agent.records.jsonl import load_records  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NODE = {"num_cpus": 1, "object_store_memory": 100 * 1024**2, "node_ip_address": "127.0.0.1"}


@pytest.fixture
def cluster():
    """A head node and a worker node on this machine; this process is not connected (the
    trainer's fleet connects, and must end the connection it opened)."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    c.add_node(**NODE)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def test_a_ppo_step_is_evaluated_by_the_ray_fleet(ppo_cfg, cluster, capfd):
    from cuda_agent.ppo.config import SandboxCfg
    from cuda_agent.ppo.trainer import train

    cfg = ppo_cfg(steps=1, epochs=1)
    cfg.sandbox = SandboxCfg(
        backend="cpu", guard_policy="off", ray_address=cluster.address, ray_workers=2
    )
    cfg.data.samples_per_task = 2
    history = train(cfg)
    # the fleet ended the connection it opened when the run ended
    assert not ray.is_initialized()

    assert len(history) == 1
    trajs = load_records(f"{cfg.train.out}/trajectories.jsonl", Trajectory)
    assert len(trajs) == 4 and all(t.eval_result is not None for t in trajs)
    nodes = {n["NodeID"] for n in _nodes(cluster)}
    for t in trajs:
        where = t.eval_result.meta.get("ray")
        # evaluated by a fleet worker on one of the cluster's nodes, not by a pool of this process
        assert where is not None, t.eval_result.meta
        assert where["node"] in nodes
        assert t.eval_result.meta.get("pool_pid") != os.getpid()
    assert "evaluates on the Ray cluster" in capfd.readouterr().err


def _nodes(cluster) -> list[dict]:
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        return [n for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()
