"""The verl adapter through verl's own code (skipped without verl: it cannot join this workspace's
lock; the README's verl section has the scratch venv that runs these). Nothing of verl is mocked:
its hydra config, its loader of the custom reward function, its reward-loop worker and naive
reward manager, its Ray reward-loop manager, its parquet dataset and its single-turn agent loop;
only the LLM server is replaced by :class:`ScriptedServer` (the interface verl's agent loops call
on vLLM / SGLang), answering with given texts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed (README: scratch venv, no extra)")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cuda_agent.adapters import verl as kverl  # noqa: E402
from cuda_agent.adapters.common import register_evaluator  # noqa: E402

ORDER = ("correct", "wrong", "unparsable")
EXPECTED = {
    "score": [1.0, -1.0, -1.0],
    "ok": [1.0, 0.0, 0.0],
    "evaluated": [1.0, 1.0, 0.0],
    "status": ["ok", "incorrect", "unparsed"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The random-weight tiny model's directory (its byte-level tokenizer is what verl decodes
    responses with; the weights are never run)."""
    from cuda_agent.agent.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("verl-tiny"))


def verl_config(overrides: list[str]) -> Any:
    """verl's own trainer config (``verl/trainer/config/ppo_trainer.yaml``) composed by hydra
    with command-line ``overrides``, as ``python -m verl.trainer.main_ppo ...`` composes it."""
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def reward_overrides(path: str, tiny: Path, **kwargs: object) -> list[str]:
    out = [
        f"reward.custom_reward_function.path={path}",
        "reward.custom_reward_function.name=compute_score",
        f"actor_rollout_ref.model.path={tiny}",
    ]
    return out + [
        f"+reward.custom_reward_function.reward_kwargs.{k}={v}" for k, v in kwargs.items()
    ]


def response_batch(tok, task, texts: list[str]) -> Any:
    """A verl ``DataProto`` as a rollout leaves it: left-padded prompts, right-padded responses
    (each ending in the end-of-turn token), their attention mask, the dataset's non-tensor
    fields (``verl_rows``)."""
    from verl import DataProto

    rows = kverl.verl_rows([task] * len(texts), backend="cpu", include_skill=False)
    text = tok.apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    responses = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(len(r) for r in responses) + 5
    pad = tok.pad_token_id
    prompts = torch.tensor([[pad] * 3 + prompt] * len(texts))
    resp = torch.tensor([r + [pad] * (width - len(r)) for r in responses])
    mask = torch.tensor(
        [[0] * 3 + [1] * len(prompt) + [1] * len(r) + [0] * (width - len(r)) for r in responses]
    )
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": resp,
            "input_ids": torch.cat([prompts, resp], dim=1),
            "attention_mask": mask,
        },
        non_tensors={
            k: np.array([r[k] for r in rows], dtype=object)
            for k in ("data_source", "reward_model", "extra_info")
        },
    ), [len(r) for r in responses]


def expect_token_rewards(rm_scores: torch.Tensor, lengths: list[int]) -> None:
    """verl's token-level reward: the score on each response's last valid token, zero elsewhere."""
    assert rm_scores.dtype == torch.float32
    assert rm_scores.nonzero().tolist() == [[i, n - 1] for i, n in enumerate(lengths)]
    assert rm_scores.sum(dim=1).tolist() == EXPECTED["score"]


def test_the_config_key_verl_reads(tiny):
    """verl 0.9.1's reward loop reads ``reward.custom_reward_function``: the legacy top-level
    ``custom_reward_function`` still composes but is left unread (``main_ppo`` does not migrate
    it; only ``migrate_legacy_reward_impl``, called by the fully-async entry point, does)."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.ppo.reward import get_custom_reward_fn

    legacy = [
        f"custom_reward_function.path={kverl.__file__}",
        "custom_reward_function.name=compute_score",
        f"actor_rollout_ref.model.path={tiny}",
    ]
    config = verl_config(legacy)
    assert config.reward.custom_reward_function.path is None
    assert get_custom_reward_fn(config) is None
    assert get_custom_reward_fn(migrate_legacy_reward_impl(config)) is not None
    fn = get_custom_reward_fn(verl_config(reward_overrides(kverl.__file__, tiny, backend="cpu")))
    assert fn.args[0].__name__ == "compute_score" and fn.args[1] == {"backend": "cpu"}


def test_reward_loop_worker_scores_a_batch(tiny, scale_add_task, answers, strict_pool):
    """The adapter's file named as a verl config names it (``reward.custom_reward_function.path``
    / ``.name``, ``reward_kwargs``), loaded by verl's ``get_custom_reward_fn`` inside its
    ``RewardLoopWorker`` (the naive reward manager, the default), scoring a batch of three
    responses on the strict cpu pool; the token-level tensor built by the manager class."""
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.reward_manager import NaiveRewardManager
    from verl.trainer.ppo.reward import extract_reward

    from cuda_agent.agent.models import load_tokenizer

    register_evaluator("verl-real", strict_pool)
    config = verl_config(reward_overrides(kverl.__file__, tiny, evaluator="verl-real"))
    worker = RewardLoopWorker(config)
    assert isinstance(worker.reward_manager, NaiveRewardManager)

    data, lengths = response_batch(
        load_tokenizer(str(tiny)), scale_add_task, [answers[n] for n in ORDER]
    )
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    assert [o["reward_score"] for o in outputs] == EXPECTED["score"]
    for key, values in EXPECTED.items():
        assert [o["reward_extra_info"][key] for o in outputs] == values

    rm_scores = NaiveRewardManager.assemble_rm_scores(data, [o["reward_score"] for o in outputs])
    expect_token_rewards(rm_scores, lengths)
    data.batch["rm_scores"] = rm_scores
    data.meta_info["reward_extra_keys"] = ["status"]
    data.non_tensor_batch["status"] = np.array(EXPECTED["status"], dtype=object)
    tensor, extra = extract_reward(data)
    assert tensor is rm_scores and list(extra["status"]) == EXPECTED["status"]


def test_reward_loop_manager_on_ray(tiny, scale_add_task, answers):
    """The trainer's path: verl's ``RewardLoopManager`` (what ``RayPPOTrainer`` builds) starts a
    ``RewardLoopWorker`` Ray actor that loads the adapter by module (``pkg://``) and evaluates on
    its own strict cpu pool (``reward_kwargs``: backend cpu, no timing), and returns the
    ``rm_scores`` ``DataProto`` with the adapter's keys as its reward extra info."""
    ray = pytest.importorskip("ray")
    from verl.experimental.reward_loop import RewardLoopManager

    from cuda_agent.agent.models import load_tokenizer

    config = verl_config(
        reward_overrides("pkg://cuda_agent.adapters.verl", tiny, backend="cpu", timing="false")
        + ["reward.num_workers=1"]
    )
    data, lengths = response_batch(
        load_tokenizer(str(tiny)), scale_add_task, [answers[n] for n in ORDER]
    )
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        out = RewardLoopManager(config).compute_rm_score(data)
    finally:
        ray.shutdown()
    expect_token_rewards(out.batch["rm_scores"], lengths)
    assert out.meta_info["reward_extra_keys"] == ["score", "ok", "evaluated", "status"]
    for key, values in EXPECTED.items():
        assert out.non_tensor_batch[key].tolist() == values


class ScriptedServer:
    """What verl's agent loops call on the LLM server (``LLMServerClient.generate``: prompt token
    ids in, a ``TokenOutput`` out), answering each task's prompt (``Task: NAME.``) with its
    given text and the end-of-turn token instead of sampling a model."""

    def __init__(self, tok, texts: dict[str, str]):
        self.tok, self.texts, self.prompts = tok, texts, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        prompt = self.tok.decode(prompt_ids)
        self.prompts.append(prompt)
        (name,) = [n for n in self.texts if f"Task: {n}." in prompt]
        ids = self.tok(self.texts[name], add_special_tokens=False)["input_ids"]
        return TokenOutput(token_ids=ids + [self.tok.eos_token_id], stop_reason="completed")


def test_rollout_step_through_verls_dataset_and_agent_loop(
    tiny, scale_add_task, answers, strict_pool, tmp_path
):
    """A rollout step as ``RayPPOTrainer`` runs it, on the cpu backend: the adapter's parquet read
    by verl's ``RLHFDataset`` and ``collate_fn`` into a ``DataProto``, generated by verl's
    ``AgentLoopWorker`` with its default ``single_turn_agent`` loop (chat template, padding,
    masks) over :class:`ScriptedServer`, then scored by the ``RewardLoopWorker`` with the
    adapter's ``compute_score``: the token-level rewards land on each response's last token."""
    from verl import DataProto
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.experimental.reward_loop.reward_manager import NaiveRewardManager
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from cuda_agent.agent.models import load_tokenizer
    from cuda_agent.records import Task

    names = {"scale_add": "correct", "scale_add_wrong": "wrong", "scale_add_prose": "unparsable"}
    tasks = [Task.make(n, scale_add_task.ref_code) for n in names]
    parquet = kverl.write_parquet(tasks, tmp_path / "k.parquet", backend="cpu", include_skill=False)
    register_evaluator("verl-real", strict_pool)
    config = verl_config(
        reward_overrides(kverl.__file__, tiny, evaluator="verl-real")
        + [
            f"data.train_files={parquet}",
            "data.max_prompt_length=4096",
            "data.max_response_length=2048",
            "actor_rollout_ref.rollout.name=vllm",  # the engine's name; never started here
        ]
    )
    tok = load_tokenizer(str(tiny))
    dataset = RLHFDataset(str(parquet), tok, config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    server = ScriptedServer(tok, {n: answers[a] for n, a in names.items()})
    out = asyncio.run(AgentLoopWorker(config, llm_client=server).generate_sequences(batch))

    assert len(server.prompts) == 3 and all(
        p.endswith("<|im_start|>assistant\n") for p in server.prompts
    )
    assert out.batch["prompts"].shape == (3, 4096) and out.batch["responses"].shape == (3, 2048)
    assert list(out.non_tensor_batch["agent_name"]) == ["single_turn_agent"] * 3
    lengths = out.batch["response_mask"].sum(dim=1).tolist()
    for i, n in enumerate(names):
        text = tok.decode(out.batch["responses"][i, : lengths[i]], skip_special_tokens=True)
        assert text == answers[names[n]]

    worker = RewardLoopWorker(config)
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(out))
    for key, values in EXPECTED.items():
        assert [o["reward_extra_info"][key] for o in outputs] == values
    rm_scores = NaiveRewardManager.assemble_rm_scores(out, [o["reward_score"] for o in outputs])
    expect_token_rewards(rm_scores, lengths)
