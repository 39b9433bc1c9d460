"""Prompts: the multi-turn system prompt (SKILL.md + tools) and the single-turn prompt."""

from __future__ import annotations

import json
from typing import Any

from .tools import TOOL_SCHEMAS

TOOLS_BLOCK = """# Tools

You act only through tools. To call tools, write one or more calls, each as JSON inside
<tool_call></tool_call> tags, after a short plan:
<tool_call>
{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>
The results come back in the next message inside <tool_response></tool_response> tags.
Call Submit when your solution is final (or when you cannot improve it further).

Available tools (JSON schemas):
<tools>
{schemas}
</tools>"""


def system_prompt(skill_md: str, tools: list[dict[str, Any]] | None = None) -> str:
    """The workspace's SKILL.md followed by the tool schemas and the calling convention."""
    schemas = "\n".join(json.dumps(s["function"]) for s in (tools or TOOL_SCHEMAS))
    return skill_md.strip() + "\n\n" + TOOLS_BLOCK.format(schemas=schemas)


def task_prompt(task_name: str, ref_code: str) -> str:
    """The first user message of a multi-turn episode."""
    return (
        f"Task: {task_name}.\n"
        "The reference PyTorch program is model.py in your workspace (read-only):\n"
        f"```python\n{ref_code.strip()}\n```\n"
        "Write a faster implementation: model_new.py defining ModelNew (same constructor "
        "arguments as Model) backed by your kernels in kernels/. Compile, verify and profile with "
        "the utils/ scripts, then Submit."
    )


def tool_response(results: list[str]) -> str:
    """The observation message for one turn's tool results (Qwen/Hermes convention)."""
    return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)


SINGLE_TURN_INSTRUCTIONS = """Write the complete solution in one answer. Give every file as a
fenced code block whose opening line names the file, for example:
```python model_new.py
...
```
```{kernel_lang} kernels/my_kernel.{kernel_ext}
...
```
```cpp kernels/my_kernel_binding.cpp
...
```
model_new.py must define ModelNew with the same constructor arguments as Model."""


def single_turn_prompt(
    task_name: str, ref_code: str, skill_md: str, backend: str = "cuda"
) -> list[dict[str, str]]:
    """Chat messages for one-shot kernel generation (the PPO warm-up stage)."""
    lang, ext = ("cuda", "cu") if backend == "cuda" else ("cpp", "cpp")
    user = task_prompt(task_name, ref_code).split("Write a faster")[
        0
    ] + SINGLE_TURN_INSTRUCTIONS.format(kernel_lang=lang, kernel_ext=ext)
    return [{"role": "system", "content": skill_md.strip()}, {"role": "user", "content": user}]
