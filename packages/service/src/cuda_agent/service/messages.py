"""The service's request and response bodies that are not ``records`` (those travel as
``cuda_agent.records`` encodes them: a ``Candidate`` or ``Task`` in, an ``EvalResult`` out)."""

from __future__ import annotations

import msgspec

API_VERSION = "v1"


class ErrorDetail(msgspec.Struct, kw_only=True):
    """What went wrong: a stable ``code`` (e.g. ``unauthorized``) and a message for people."""

    code: str
    message: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every error response's body: ``{"error": {"code": ..., "message": ...}}``."""

    error: ErrorDetail


class WorkspaceCreated(msgspec.Struct, kw_only=True):
    """``POST /v1/workspaces``: the new workspace's id, its directory on the server's host and
    the task it was made for."""

    id: str
    path: str
    task_id: str
    backend: str


class BashRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/workspaces/{id}/bash``: a shell command line run in the workspace, confined;
    ``timeout_s`` (default: the server's) is capped by the server's maximum."""

    command: str
    timeout_s: float | None = None


class BashResult(msgspec.Struct, kw_only=True):
    """What the agent environment's ``bash`` returns (``cuda_agent.agent.tools.BashOutput``):
    exit code (``None`` when killed), stdout then stderr (each capped, head and tail kept),
    whether the time limit ended it; plus the limit applied and the seconds it ran."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    timeout_s: float = 0.0
    seconds: float = 0.0


class WorkspaceDeleted(msgspec.Struct, kw_only=True):
    """``DELETE /v1/workspaces/{id}``: the workspace is gone from disk."""

    id: str
    deleted: bool = True


class Health(msgspec.Struct, kw_only=True):
    """``GET /v1/health`` (no token): what this server is; nothing is run to answer it."""

    status: str
    version: str
    api: str
    backend: str
    devices: list[str]
    guard_policy: str
    max_concurrent: int
    in_flight: int
    max_body_bytes: int
    workspaces: int
    max_workspaces: int
