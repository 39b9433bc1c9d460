"""The client a trainer imports: the service's endpoints as methods that take and return
``cuda_agent.records`` (standard library only: ``urllib``)::

    from cuda_agent.service.client import ServiceClient, ServiceError

    client = ServiceClient("http://127.0.0.1:8470", token)  # token: default $CUDA_AGENT_SERVICE_TOKEN
    result = client.evaluate(candidate)                      # -> EvalResult
    ws = client.create_workspace(task)                       # -> workspace id
    out = client.bash(ws, "python utils/compile.py")         # -> BashResult
    result = client.evaluate_workspace(ws)                   # its model_new.py and kernels/
    client.delete_workspace(ws)
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

import msgspec

from cuda_agent.records import Candidate, EvalResult, Task

from .messages import BashRequest, BashResult, ErrorResponse, Health, WorkspaceCreated
from .server import TOKEN_ENV


class ServiceError(Exception):
    """An error answer of the service (or no answer): HTTP ``status`` (0: the request did not
    get an answer), the service's stable ``code`` and its ``message``."""

    def __init__(self, code: str, message: str, status: int = 0, retry_after: float | None = None):
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after


class ServiceClient:
    """Calls one service at ``url`` with bearer ``token`` (default: ``$CUDA_AGENT_SERVICE_TOKEN``).
    Every method returns the decoded answer or raises :class:`ServiceError`; an evaluation's
    failures (compile errors, guard rejections, the sandbox's own) are ``EvalResult`` statuses,
    not errors. ``timeout``: seconds to wait for each answer (default: 2 hours, longer than an
    evaluation's own limits). Thread-safe (one connection per request)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 7200.0):
        self.url = url.rstrip("/")
        tok = token if token is not None else os.environ.get(TOKEN_ENV, "")
        self.token = tok.strip()
        self.timeout = timeout

    # ------------------------------------------------------------ transport

    def request(
        self, method: str, path: str, body: bytes | None = None, *, auth: bool = True
    ) -> bytes:
        """One request; the answer's body, or :class:`ServiceError` for an error answer (the
        service's code and message) or none (code ``connection``)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = body if body is not None else (b"" if method in ("POST", "PUT") else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            retry = e.headers.get("Retry-After") if e.headers else None
            try:
                err = msgspec.json.decode(raw, type=ErrorResponse).error
                code, message = err.code, err.message
            except (msgspec.DecodeError, msgspec.ValidationError):
                code, message = "http_error", raw.decode(errors="replace")[:500] or str(e.reason)
            raise ServiceError(
                code, message, e.code, float(retry) if retry and retry.isdigit() else None
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServiceError(
                "connection",
                f"{method} {self.url}{path}: no answer ({reason}); a body larger than the "
                "service's --max-body-mb is refused and may end the connection",
            ) from None

    def _json(
        self, method: str, path: str, payload: Any = None, type: Any = Any, *, auth: bool = True
    ) -> Any:
        body = None if payload is None else msgspec.json.encode(payload)
        raw = self.request(method, path, body, auth=auth)
        try:
            return msgspec.json.decode(raw, type=type)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ServiceError("bad_response", f"{method} {path}: {e}") from None

    # ------------------------------------------------------------ endpoints

    def health(self) -> Health:
        """``GET /v1/health`` (no token sent): version, backend, limits, load."""
        return self._json("GET", "/v1/health", None, Health, auth=False)

    def evaluate(self, candidate: Candidate) -> EvalResult:
        """``candidate``'s ``EvalResult``, evaluated by the service's sandbox pool."""
        return self._json("POST", "/v1/evaluate", candidate, EvalResult)

    def create_workspace(self, task: Task) -> str:
        """A new workspace for ``task``; returns its id (see :meth:`create_workspace_info`)."""
        return self.create_workspace_info(task).id

    def create_workspace_info(self, task: Task) -> WorkspaceCreated:
        """A new workspace for ``task``: its id, directory on the service's host and backend."""
        return self._json("POST", "/v1/workspaces", task, WorkspaceCreated)

    def bash(self, ws: str, command: str, timeout_s: float | None = None) -> BashResult:
        """Run ``command`` confined in workspace ``ws`` (its limit: ``timeout_s``, capped by
        the service); the exit code, output and whether it timed out."""
        req = BashRequest(command=command, timeout_s=timeout_s)
        return self._json("POST", f"/v1/workspaces/{ws}/bash", req, BashResult)

    def evaluate_workspace(self, ws: str) -> EvalResult:
        """The ``EvalResult`` of the solution in workspace ``ws`` now (``model_new.py`` and
        ``kernels/``), evaluated in fresh processes, never by the workspace's own scripts."""
        return self._json("POST", f"/v1/workspaces/{ws}/evaluate", None, EvalResult)

    def delete_workspace(self, ws: str) -> None:
        """Remove workspace ``ws`` from the service's disk."""
        self._json("DELETE", f"/v1/workspaces/{ws}")
