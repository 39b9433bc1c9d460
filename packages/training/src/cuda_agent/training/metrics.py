"""Training metrics: one JSON line per logged step, mirrored to TensorBoard when it is installed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from cuda_agent.records.cli_helpers import log


class MetricsLogger:
    """Appends ``{"step": N, ...}`` lines to ``path`` (flushed per line) and, optionally, scalars
    to a TensorBoard event file under ``tb_dir``.

    On resume, lines of steps >= the resumed step are dropped first so the file never holds two
    records of one step.
    """

    def __init__(
        self, path: Path, tb_dir: Path | None = None, resume_step: int = 0, enabled: bool = True
    ):
        self.path = Path(path)
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        keep.append(line)
                except json.JSONDecodeError:
                    continue
            self.path.write_text("".join(k + "\n" for k in keep))
        self._fh = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        if tb_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log(
                    "metrics: tensorboard is not installed (uv sync --extra tensorboard, or "
                    "pip install tensorboard); writing JSONL only"
                )
            else:
                self._tb = SummaryWriter(log_dir=str(tb_dir), purge_step=resume_step + 1)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` of optimizer step ``step`` (1-based)."""
        if not self.enabled:
            return
        rec = {"step": step, **metrics}
        self._fh.write(json.dumps(rec, default=float) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All metric lines of a ``metrics.jsonl``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
