"""The in-process vLLM engine as a token-level policy (optional; needs ``vllm`` importable).

vLLM is not part of this workspace's environment or lock: it pins its own torch. This module is
for a process whose environment has vLLM (a separate one, built as vLLM's docs say:
``uv venv``, ``uv pip install vllm --torch-backend=auto``, then this workspace's packages into
it); the supported way to use vLLM is the server engine (:mod:`cuda_agent.agent.server_policy`,
``vllm serve`` in its own environment; packages/agent/README.md "Rollout engines").

Token ids in, token ids and log-probs out; ``sleep``/``wake_up`` free the KV cache and weights
between rollouts when the trainer shares the GPU; ``update_weights`` loads new actor weights in
place (PPO). Written against vLLM's ``LLM`` API (``generate`` with ``TokensPrompt``,
``SamplingParams(logprobs=0)``, ``sleep``/``wake_up`` with ``enable_sleep_mode``,
``collective_rpc``). Not exercised in CI (no GPU); the GPU machine of this project has no vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .policy import Generation, SamplingPolicy


class VLLMPolicy(SamplingPolicy):
    def __init__(self, llm: Any, tokenizer: Any, *, name: str = "vllm", **kw: Any):
        super().__init__(tokenizer, name=name, **kw)
        self.llm = llm

    @classmethod
    def load(
        cls, path: str, *, gpu_memory_utilization: float = 0.5, sleep_mode: bool = True, **kw: Any
    ) -> VLLMPolicy:
        """An engine for a local checkpoint directory (or ``smollm2``, converted first)."""
        try:
            from vllm import LLM
        except ImportError as e:
            raise ValueError(
                "the vllm policy needs vLLM importable in this environment (it is not in this "
                "workspace's lock); use the server engine instead: vllm serve in its own "
                "environment and --policy server:URL#MODEL (packages/agent/README.md)"
            ) from e
        from .models import load_tokenizer, resolve_model

        d = str(resolve_model(path))
        llm = LLM(
            model=d,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep_mode,
            dtype="bfloat16",
        )
        return cls(llm, load_tokenizer(d), name=f"vllm:{path}", **kw)

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int,
        keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's log-prob
            stop_token_ids=self.eot,
            seed=self.seed,
        )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(c)) for c in contexts], sp, use_tqdm=False
        )
        gens = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=False)]
            if len(lps) != len(ids):
                raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
            gens.append(Generation(ids, lps, "stop" if ids and ids[-1] in self.eot else "length"))
        return gens

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory between rollouts (level 1 keeps weights in host memory)."""
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        self.llm.wake_up()

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load new weights into the running engine (same architecture and names as HF)."""
        weights = list(named_tensors)

        def _load(worker: Any) -> None:
            worker.model_runner.model.load_weights(weights=weights)

        self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()
