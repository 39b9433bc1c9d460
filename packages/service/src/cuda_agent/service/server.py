"""The kernel environment over HTTP: evaluate candidates and run workspace tool commands.

One :class:`KernelService` holds one evaluation pool (``SandboxPool``: its ``submit``) and the
agent environment (``SandboxEnv``: workspaces, the confined ``bash``); :class:`ServiceHTTPServer`
serves it with the standard library's ``ThreadingHTTPServer``. The service runs code by design, so:

- it binds a loopback address unless told otherwise (:func:`check_host`);
- every endpoint but ``GET /v1/health`` needs ``Authorization: Bearer <token>``, compared in
  constant time;
- a request body has a byte limit, checked on ``Content-Length`` before anything is read (413;
  411 without one); reading it has a time limit (408);
- at most ``max_concurrent`` requests run work at once; one more is answered 503 with
  ``Retry-After`` before its body is read; an evaluation's slot is held until the evaluation
  has ended, even when the request stopped waiting for it (504);
- a body that is not JSON, or not a record of the expected kind, is a 400 naming what is wrong;
  every refusal is decided before anything runs.

Errors are JSON: ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import math
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from cuda_agent.records import (
    SCHEMA_VERSION,
    Candidate,
    CompileDetail,
    EvalResult,
    Solution,
    Status,
    Task,
)

from .messages import (
    API_VERSION,
    BashRequest,
    BashResult,
    ErrorDetail,
    ErrorResponse,
    Health,
    WorkspaceCreated,
    WorkspaceDeleted,
)

if TYPE_CHECKING:
    from cuda_agent.agent.env import SandboxEnv

TOKEN_ENV = "CUDA_AGENT_SERVICE_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
MIB = 1 << 20
# after an error answered before the body was read: what is discarded (at most, and for how
# long; never kept) so that a client still sending reads the answer, not a reset connection
_DRAIN_BYTES = 256 * MIB
_DRAIN_S = 2.0


def version() -> str:
    """This package's installed version (``"unknown"`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("cuda-agent-service")
    except PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------- settings and errors


@dataclass(frozen=True)
class ServiceSettings:
    """The service's limits. Evaluations' own time limits are the pool's ``SandboxConfig``."""

    max_body_bytes: int = 8 * MIB  # a request body over this is refused (413) unread
    max_concurrent: int = 16  # requests running work at once; more: 503 + Retry-After
    max_workspaces: int = 16  # workspaces that exist at once; more: 409
    bash_timeout_s: float = 300.0  # a command's limit when the request names none
    max_bash_timeout_s: float = 600.0  # the cap on a command's limit (the default's too)
    eval_wait_s: float = 3600.0  # how long a request waits for its evaluation (then 504)
    read_timeout_s: float = 30.0  # for the request line, headers and body (then 408 / closed)
    retry_after_s: int = 5  # the Retry-After of a 503
    max_connections: int = 256  # open connections (a thread each); more: 503 and closed at once
    keep_workspaces: bool = False  # leave workspaces on disk when the service closes

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_concurrent",
            "max_workspaces",
            "retry_after_s",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected 1 or more")
        for name in ("bash_timeout_s", "max_bash_timeout_s", "eval_wait_s", "read_timeout_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}={v}: expected a positive number of seconds")


class ServiceFailure(Exception):
    """An error response: HTTP ``status``, a stable ``code`` and a message."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class TokenError(ValueError):
    """No usable token: the service refuses to start."""


def load_token(token_file: str | Path | None = None, environ: Any = None) -> str:
    """The service token: the contents of ``token_file`` (stripped), else
    ``$CUDA_AGENT_SERVICE_TOKEN``. Raises :class:`TokenError` when there is none or it is shorter than 16 characters."""
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise TokenError(f"--token-file {token_file}: {e.strerror or e}") from None
        where = f"--token-file {token_file}"
    else:
        token = (env.get(TOKEN_ENV) or "").strip()
        where = f"${TOKEN_ENV}"
        if not token:
            raise TokenError(
                f"no token: pass --token-file FILE or set ${TOKEN_ENV} (the service runs code; "
                "it does not start without one). Make one with: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise TokenError(
            f"{where}: the token must be at least {MIN_TOKEN_CHARS} characters without spaces"
        )
    return token


def token_file_warning(token_file: str | Path) -> str | None:
    """A warning when ``token_file`` can be read by users other than its owner, else None."""
    try:
        mode = Path(token_file).stat().st_mode
    except OSError:
        return None
    if mode & 0o077:
        return f"warning: {token_file} has mode {mode & 0o777:o}; other users can read the token (chmod 600 it)"
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine: ``localhost`` or a loopback address."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool = False) -> str | None:
    """Raise ValueError for a non-loopback ``host`` unless ``allow_remote``; with it, return the
    warning to print (None for a loopback host)."""
    if is_loopback(host):
        return None
    if not allow_remote:
        raise ValueError(
            f"--host {host!r} is not a loopback address: the service runs the code it is sent, "
            "so it listens on 127.0.0.1 unless --allow-remote is given as well"
        )
    return (
        f"warning: listening on {host!r}, reachable from other machines: anyone with the token "
        "can run code on this host; the token travels in clear text over plain HTTP (put the "
        "service behind a TLS proxy or an SSH tunnel)"
    )


# ---------------------------------------------------------------- the service


class Evaluator(Protocol):
    """What the service evaluates with: ``SandboxPool`` (``submit`` -> a future ``EvalResult``)."""

    def submit(self, candidate: Candidate) -> Future[EvalResult]: ...


@dataclass
class _Workspace:
    id: str
    root: Path
    task: Task
    lock: threading.Lock = field(default_factory=threading.Lock)


_WS_ID = re.compile(r"^[0-9a-f]{16}$")


def infra_result(candidate: Candidate, backend: str, exc: BaseException) -> EvalResult:
    """The ``infra_error`` result of an evaluation that raised (the sandbox failed, not the
    candidate), as the agent's episodes record one."""
    return EvalResult(
        task_id=candidate.task.id,
        solution_id=candidate.solution.id,
        backend="cuda" if backend == "cuda" else "cpu",
        device="",
        status=Status.INFRA_ERROR,
        message=f"sandbox error: {type(exc).__name__}: {exc}"[:2000],
        meta={"raised": True},
    )


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` made safe to call many times: only the first call runs it."""
    lock = threading.Lock()
    done = False

    def call() -> None:
        nonlocal done
        with lock:
            if done:
                return
            done = True
        fn()

    return call


class KernelService:
    """Evaluations through ``pool`` and workspaces of ``env`` under ``workspaces_dir``, behind a
    token and the limits of ``settings``. Thread-safe; the HTTP layer is
    :class:`ServiceHTTPServer`. :meth:`close` removes the workspaces it made (unless
    ``settings.keep_workspaces``); the pool is left to its owner."""

    def __init__(
        self,
        pool: Evaluator,
        env: SandboxEnv,
        token: str,
        workspaces_dir: str | Path,
        settings: ServiceSettings | None = None,
    ):
        if len(token) < MIN_TOKEN_CHARS:
            raise TokenError(f"the token must be at least {MIN_TOKEN_CHARS} characters")
        from cuda_agent.sandbox.execute import check_workspace_reachable

        self.pool = pool
        self.env = env
        self.settings = settings or ServiceSettings()
        self.backend: str = env.backend
        self.devices: list[str] = list(getattr(pool, "devices", []) or [])
        self._token = token.encode()
        self.workspaces_dir = Path(workspaces_dir).resolve()
        self.workspaces_dir.mkdir(parents=True, exist_ok=True)
        # confined commands may run as another uid: fail here, not at the first workspace
        check_workspace_reachable(self.workspaces_dir / "probe")
        self._slots = threading.BoundedSemaphore(self.settings.max_concurrent)
        self._count_lock = threading.Lock()
        self._in_flight = 0
        self._ws: dict[str, _Workspace | None] = {}  # None: being created
        self._ws_lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ gates

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries this service's bearer token (compared
        with ``hmac.compare_digest``)."""
        if not header:
            return False
        scheme, _, given = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    def try_acquire(self) -> bool:
        """Take a work slot without waiting; False when ``max_concurrent`` are taken."""
        if not self._slots.acquire(blocking=False):
            return False
        with self._count_lock:
            self._in_flight += 1
        return True

    def release(self) -> None:
        """Give back a slot taken by :meth:`try_acquire`."""
        with self._count_lock:
            self._in_flight -= 1
        self._slots.release()

    @property
    def in_flight(self) -> int:
        """Work slots taken now."""
        return self._in_flight

    def health(self) -> Health:
        """What this server is and how busy; runs nothing."""
        with self._ws_lock:
            n_ws = len(self._ws)
        return Health(
            status="ok",
            version=version(),
            api=API_VERSION,
            backend=self.backend,
            devices=self.devices,
            guard_policy=str(getattr(self.env.config, "guard_policy", "")),
            max_concurrent=self.settings.max_concurrent,
            in_flight=self.in_flight,
            max_body_bytes=self.settings.max_body_bytes,
            workspaces=n_ws,
            max_workspaces=self.settings.max_workspaces,
        )

    # ------------------------------------------------------------ work (each holds a slot)

    def evaluate(self, candidate: Candidate, release: Callable[[], None]) -> EvalResult:
        """``candidate``'s result from the pool; an evaluation that raised is an ``infra_error``
        result. ``release`` is called exactly once, when the evaluation has ended: before this
        returns, or later for a 504 (the slot stays taken while the pool still works on it)."""
        release = _once(release)
        try:
            fut = self.pool.submit(candidate)
        except BaseException:
            release()
            raise
        fut.add_done_callback(lambda _f: release())
        try:
            result = fut.result(timeout=self.settings.eval_wait_s)
            release()  # the callback may run after the waiters have woken: not later than now
            return result
        except FutureTimeout:
            raise ServiceFailure(
                504,
                "timeout",
                f"the evaluation of {candidate.key} did not end within {self.settings.eval_wait_s:g} s "
                "(the service's eval_wait_s); it goes on in the pool and holds its slot until it ends",
            ) from None
        except Exception as e:  # noqa: BLE001 - the sandbox's own failure, as a result
            release()
            return infra_result(candidate, self.backend, e)

    def create_workspace(self, task: Task) -> WorkspaceCreated:
        """A fresh workspace for ``task`` under ``workspaces_dir`` (409 past ``max_workspaces``)."""
        with self._ws_lock:
            if self._closed:
                raise ServiceFailure(503, "closing", "the service is shutting down")
            if len(self._ws) >= self.settings.max_workspaces:
                raise ServiceFailure(
                    409,
                    "workspace_limit",
                    f"{len(self._ws)} workspaces exist, the most this service keeps at once "
                    f"(max_workspaces={self.settings.max_workspaces}); delete one first",
                )
            ws_id = secrets.token_hex(8)
            while ws_id in self._ws:
                ws_id = secrets.token_hex(8)
            self._ws[ws_id] = None  # reserved
        root = self.workspaces_dir / ws_id
        try:
            root = self.env.make_workspace(task, root)
        except BaseException:
            with self._ws_lock:
                self._ws.pop(ws_id, None)
            shutil.rmtree(root, ignore_errors=True)
            raise
        with self._ws_lock:
            self._ws[ws_id] = _Workspace(ws_id, Path(root), task)
        return WorkspaceCreated(id=ws_id, path=str(root), task_id=task.id, backend=self.backend)

    def workspace(self, ws_id: str) -> _Workspace:
        """The live workspace ``ws_id`` (404 when there is none)."""
        with self._ws_lock:
            ws = self._ws.get(ws_id) if _WS_ID.match(ws_id) else None
        if ws is None:
            raise ServiceFailure(404, "not_found", f"no workspace {ws_id!r}")
        return ws

    def bash_timeout(self, requested: float | None) -> float:
        """The limit a command runs under: ``requested`` (default ``bash_timeout_s``) capped
        at ``max_bash_timeout_s``."""
        s = self.settings
        want = s.bash_timeout_s if requested is None else float(requested)
        return min(want, s.max_bash_timeout_s)

    def bash(self, ws_id: str, req: BashRequest) -> BashResult:
        """Run ``req.command`` confined in the workspace (``SandboxEnv.bash``); commands of one
        workspace run one at a time."""
        ws = self.workspace(ws_id)
        timeout = self.bash_timeout(req.timeout_s)
        with ws.lock:
            self.workspace(ws_id)  # deleted while this request waited
            t0 = time.monotonic()
            out = self.env.bash(ws.root, req.command, timeout)
            took = time.monotonic() - t0
        return BashResult(
            exit_code=out.exit_code,
            output=out.output,
            timed_out=out.timed_out,
            timeout_s=timeout,
            seconds=round(took, 3),
        )

    def workspace_candidate(self, ws_id: str) -> Candidate | EvalResult:
        """The candidate a workspace holds now: its task and ``solution_from_workspace``; or,
        where its solution files are not plain files of a sane size (a symbolic link a confined
        command made would have this process read whatever it points to), the
        ``compile_error`` result saying which, made without reading them."""
        from cuda_agent.sandbox.workspace import solution_from_workspace

        ws = self.workspace(ws_id)
        origin = f"service:{ws_id}"
        with ws.lock:
            self.workspace(ws_id)
            problem = unsafe_solution_files(ws.root)
            if problem is None:
                sol = solution_from_workspace(ws.root, origin=origin)
        if problem is not None:
            return EvalResult(
                task_id=ws.task.id,
                solution_id=Solution.make("workdir", {}, origin=origin).id,
                backend="cuda" if self.backend == "cuda" else "cpu",
                device="",
                status=Status.COMPILE_ERROR,
                message=f"solution files: {problem}",
                compile=CompileDetail(ok=False, log_tail=problem),
                meta={"workspace": ws_id, "refused_by": "service"},
            )
        return Candidate(task=ws.task, solution=sol, meta={"workspace": ws_id})

    def evaluate_workspace(self, ws_id: str, release: Callable[[], None]) -> EvalResult:
        """The ``EvalResult`` of the workspace's solution now (see :meth:`workspace_candidate`
        and :meth:`evaluate`; ``release`` as there)."""
        release = _once(release)
        try:
            cand = self.workspace_candidate(ws_id)
        except BaseException:
            release()
            raise
        if isinstance(cand, EvalResult):
            release()
            return cand
        return self.evaluate(cand, release)

    def delete_workspace(self, ws_id: str) -> WorkspaceDeleted:
        """Remove the workspace from disk (after a command running in it has ended)."""
        ws = self.workspace(ws_id)
        with ws.lock, self._ws_lock:
            if self._ws.get(ws_id) is not ws:
                raise ServiceFailure(404, "not_found", f"no workspace {ws_id!r}")
            del self._ws[ws_id]
        shutil.rmtree(ws.root, ignore_errors=True)
        return WorkspaceDeleted(id=ws_id)

    def close(self) -> None:
        """Refuse new workspaces and remove the existing ones (unless ``keep_workspaces``)."""
        with self._ws_lock:
            self._closed = True
            live = [w for w in self._ws.values() if w is not None]
            if not self.settings.keep_workspaces:
                self._ws.clear()
        if not self.settings.keep_workspaces:
            for w in live:
                with w.lock:
                    shutil.rmtree(w.root, ignore_errors=True)


def unsafe_solution_files(root: Path) -> str | None:
    """Why the solution files of workspace ``root`` (``model_new.py``, ``kernels/``) must not
    be read by this process, or None: a symbolic link or a file that is not a regular one
    (a FIFO would block the read) where ``solution_from_workspace`` reads, or more bytes than a
    solution may have. Decided with ``lstat`` alone: nothing is opened."""
    from cuda_agent.sandbox.workspace import MAX_SOLUTION_BYTES, SOLUTION_EXT

    def why_not(p: Path, st: os.stat_result) -> str | None:
        rel = p.relative_to(root).as_posix()
        if stat.S_ISLNK(st.st_mode):
            return f"{rel} is a symbolic link (to {os.readlink(p)!r}); solution files must be plain files"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is not a regular file"
        return None

    # what solution_from_workspace reads: model_new.py, kernels/ when it is a directory, and
    # every file under it with a source suffix (symbolic links flagged wherever they are)
    entries: list[Path] = []
    if os.path.lexists(root / "model_new.py"):
        entries.append(root / "model_new.py")
    kd = root / "kernels"
    if kd.is_symlink():
        entries.append(kd)
    elif kd.is_dir():
        for dirpath, dirnames, filenames in os.walk(kd, followlinks=False):
            for name in [*dirnames, *filenames]:
                p = Path(dirpath) / name
                if p.is_symlink() or (name in filenames and p.suffix in SOLUTION_EXT):
                    entries.append(p)
    total = 0
    for p in entries:
        st = p.lstat()
        if why := why_not(p, st):
            return why
        total += st.st_size
        if total > MAX_SOLUTION_BYTES:
            return f"solution files are over {MAX_SOLUTION_BYTES} bytes"
    return None


# ---------------------------------------------------------------- decoding


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise ServiceFailure(400, "bad_request", f"malformed JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ServiceFailure(
            400, "bad_request", f"expected a JSON object ({what}), got {type(obj).__name__}"
        )
    return obj


def decode_record(body: bytes, type_: type[Any]) -> Any:
    """``body`` as one record of ``type_`` (``Candidate`` or ``Task``), else a 400 naming what
    is wrong: malformed JSON, another kind, a newer schema, or the field that does not fit."""
    kind = type_.__struct_config__.tag
    obj = _json_object(body, f"a {kind} record")
    got = obj.get("kind")
    if got != kind:
        raise ServiceFailure(
            400,
            "bad_request",
            f'expected a {kind} record ("kind": "{kind}"), got '
            + ("no kind" if got is None else f"kind {got!r}"),
        )
    schema = obj.get("schema", SCHEMA_VERSION)
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        raise ServiceFailure(
            400,
            "bad_request",
            f"{kind} record of schema {schema}, newer than this server's ({SCHEMA_VERSION})",
        )
    try:
        return msgspec.json.decode(body, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ServiceFailure(400, "bad_request", f"invalid {kind} record: {e}") from None


def decode_bash(body: bytes) -> BashRequest:
    """``body`` as a :class:`BashRequest` (a non-empty command, a positive finite timeout)."""
    _json_object(body, 'a bash request: {"command": ..., "timeout_s": ...}')
    try:
        req = msgspec.json.decode(body, type=BashRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ServiceFailure(400, "bad_request", f"invalid bash request: {e}") from None
    if not req.command.strip():
        raise ServiceFailure(400, "bad_request", "invalid bash request: empty command")
    if "\0" in req.command:
        raise ServiceFailure(400, "bad_request", "invalid bash request: NUL byte in command")
    if req.timeout_s is not None and not (req.timeout_s > 0 and math.isfinite(req.timeout_s)):
        raise ServiceFailure(
            400, "bad_request", f"invalid bash request: timeout_s={req.timeout_s} (expected > 0)"
        )
    return req


# ---------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    name: str
    body: bool  # takes a JSON body
    auth: bool = True
    work: bool = True  # holds a work slot


_ROUTES = (
    _Route("GET", re.compile(r"^/v1/health$"), "health", body=False, auth=False, work=False),
    _Route("POST", re.compile(r"^/v1/evaluate$"), "evaluate", body=True),
    _Route("POST", re.compile(r"^/v1/workspaces$"), "create_workspace", body=True),
    _Route("POST", re.compile(r"^/v1/workspaces/(?P<ws>[^/]+)/bash$"), "bash", body=True),
    _Route(
        "POST", re.compile(r"^/v1/workspaces/(?P<ws>[^/]+)/evaluate$"), "evaluate_ws", body=False
    ),
    _Route(
        "DELETE", re.compile(r"^/v1/workspaces/(?P<ws>[^/]+)$"), "delete_ws", body=False, work=False
    ),
)


def _match(method: str, path: str) -> tuple[_Route, dict[str, str]]:
    path = path.split("?", 1)[0].split("#", 1)[0]
    allowed = []
    for r in _ROUTES:
        m = r.pattern.match(path)
        if m is None:
            continue
        if r.method == method:
            return r, m.groupdict()
        allowed.append(r.method)
    if allowed:
        raise ServiceFailure(
            405,
            "method_not_allowed",
            f"{method} {path}: use {', '.join(sorted(set(allowed)))}",
            {"Allow": ", ".join(sorted(set(allowed)))},
        )
    raise ServiceFailure(404, "not_found", f"no endpoint {method} {path} (see GET /v1/health)")


class _Slot:
    """One work slot of a request, released exactly once (by the request, or by the evaluation
    it was handed to)."""

    def __init__(self, service: KernelService):
        self._service = service
        self._lock = threading.Lock()
        self._held = True
        self.handed = False

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._service.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ServiceHTTPServer
    server_version = "cuda-agent-service"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        self.timeout = self.server.service.settings.read_timeout_s
        super().setup()
        self._checked: tuple[_Route, dict[str, str], int] | None = None
        self._unread = 0  # body bytes announced and not read

    # -- logging: request lines only (never headers: they carry the token)
    def log_message(self, format: str, *args: Any) -> None:
        log = self.server.log
        if log is not None:
            log(f"{self.address_string()} {format % args}")

    # -- the checks made before a body is read (also for Expect: 100-continue)
    def _precheck(self) -> tuple[_Route, dict[str, str], int]:
        if self._checked is not None:
            return self._checked
        svc = self.server.service
        raw = self.headers.get("Content-Length")
        chunked = bool(self.headers.get("Transfer-Encoding"))
        digits = (raw or "").strip()
        n = int(digits) if digits.isascii() and digits.isdigit() else None
        # what a refusal discards of the body (unknown length: as far as the drain goes)
        self._unread = _DRAIN_BYTES if chunked or (raw is not None and n is None) else (n or 0)
        route, params = _match(self.command, self.path)
        if route.auth and not svc.authorized(self.headers.get("Authorization")):
            raise ServiceFailure(
                401,
                "unauthorized",
                "missing or wrong token: send Authorization: Bearer <token>",
                {"WWW-Authenticate": 'Bearer realm="cuda-agent-service"'},
            )
        if chunked:
            raise ServiceFailure(
                411, "length_required", "chunked bodies are not accepted: send Content-Length"
            )
        if raw is None:
            if route.body:
                raise ServiceFailure(
                    411, "length_required", f"{route.method} {self.path} needs Content-Length"
                )
            n = 0
        elif n is None:
            raise ServiceFailure(400, "bad_request", f"invalid Content-Length {raw!r}")
        self._unread = n
        limit = svc.settings.max_body_bytes
        if n > limit:
            raise ServiceFailure(
                413,
                "payload_too_large",
                f"request body of {n} bytes exceeds the limit of {limit} bytes (--max-body-mb)",
            )
        if n and not route.body:
            raise ServiceFailure(
                400, "bad_request", f"{route.method} {self.path} takes no request body"
            )
        self._checked = (route, params, n)
        return self._checked

    def handle_expect_100(self) -> bool:
        try:
            self._precheck()
        except ServiceFailure as f:
            self._fail(f)
            return False
        return super().handle_expect_100()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def _read_body(self, n: int) -> bytes:
        chunks, left = [], n
        try:
            while left:
                b = self.rfile.read(min(left, MIB))
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
        except TimeoutError:
            self._unread = left
            raise ServiceFailure(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.server.service.settings.read_timeout_s:g} s",
            ) from None
        except OSError as e:
            self.close_connection = True
            raise ConnectionError(str(e)) from None
        self._unread = left
        if left:
            self.close_connection = True
            raise ConnectionError("client closed the connection before its body was sent")
        return b"".join(chunks)

    def _handle(self) -> None:
        svc = self.server.service
        slot: _Slot | None = None
        try:
            route, params, n = self._precheck()
            if route.work:
                if not svc.try_acquire():
                    raise ServiceFailure(
                        503,
                        "busy",
                        f"{svc.settings.max_concurrent} requests are running (max_concurrent); "
                        f"try again in {svc.settings.retry_after_s} s",
                        {"Retry-After": str(svc.settings.retry_after_s)},
                    )
                slot = _Slot(svc)
            body = self._read_body(n) if n else b""
            answer = msgspec.json.encode(self._run(route, params, body, slot))
            if slot is not None:  # the work has ended: free before answering, not after
                slot.release()
            self._send(200, answer)
        except ServiceFailure as f:
            self._fail(f)
        except ConnectionError:
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - the service's own failure
            self._fail(ServiceFailure(500, "internal", f"{type(e).__name__}: {e}"[:2000]))
        finally:
            if slot is not None and not slot.handed:
                slot.release()  # a refusal or failure before the work ended

    def _run(self, route: _Route, params: dict[str, str], body: bytes, slot: _Slot | None) -> Any:
        """The route's answer. An evaluation takes the request's slot with it: the slot is
        released when the evaluation ends, not when the request stops waiting."""
        svc = self.server.service
        name = route.name
        if name == "health":
            return svc.health()
        if name == "delete_ws":
            return svc.delete_workspace(params["ws"])
        assert slot is not None
        if name == "evaluate":
            cand = decode_record(body, Candidate)
            slot.handed = True
            return svc.evaluate(cand, slot.release)
        if name == "create_workspace":
            return svc.create_workspace(decode_record(body, Task))
        if name == "bash":
            return svc.bash(params["ws"], decode_bash(body))
        if name == "evaluate_ws":
            slot.handed = True
            return svc.evaluate_workspace(params["ws"], slot.release)
        raise AssertionError(name)

    # -- responses
    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection or self._unread:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _fail(self, f: ServiceFailure) -> None:
        body = msgspec.json.encode(ErrorResponse(error=ErrorDetail(code=f.code, message=f.message)))
        self.close_connection = True
        try:
            self._send(f.status, body, f.headers)
        except OSError:
            return
        if self._unread:
            self._drain()

    def _drain(self) -> None:
        """Discard what the client still sends of a refused body, bounded in bytes and time,
        so that it reads the answer rather than a reset connection."""
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _DRAIN_S
            left = min(self._unread, _DRAIN_BYTES)
            while left > 0:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    break
                self.connection.settimeout(wait)
                b = self.connection.recv(min(left, 256 * 1024))
                if not b:
                    break
                left -= len(b)
        self._unread = 0

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # the standard library's own refusals (bad request line, headers too long, unknown
        # method), as JSON errors like the service's
        names = {400: "bad_request", 414: "uri_too_long", 431: "headers_too_large"}
        self._fail(
            ServiceFailure(
                code, names.get(code, "not_implemented" if code == 501 else "error"), message or ""
            )
        )


class ServiceHTTPServer(ThreadingHTTPServer):
    """The HTTP server of one :class:`KernelService` (a thread per connection). Binds a
    loopback host unless ``allow_remote``; port 0 picks a free one (see :attr:`url`)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        service: KernelService,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        allow_remote: bool = False,
        log: Callable[[str], None] | None = None,
    ):
        self.warning = check_host(host, allow_remote)
        self.service = service
        self.log = log
        host = host.strip("[]")
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None
        self._conn_lock = threading.Lock()
        self._connections = 0

    @property
    def connections(self) -> int:
        """Connections open now (each has a handler thread)."""
        return self._connections

    def process_request(self, request: Any, client_address: Any) -> None:
        limit = self.service.settings.max_connections
        with self._conn_lock:
            full = self._connections >= limit
            if not full:
                self._connections += 1
        if full:  # answered here, without a thread: nothing of the request is read
            body = msgspec.json.encode(
                ErrorResponse(
                    error=ErrorDetail(
                        code="busy", message=f"{limit} connections are open (max_connections)"
                    )
                )
            )
            head = (
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                f"Retry-After: {self.service.settings.retry_after_s}\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(head.encode() + body)
                request.shutdown(socket.SHUT_WR)
                # what the client sent already, so that closing does not reset the answer away
                # (at most 0.1 s of the accepting thread, 64 KiB)
                request.settimeout(0.1)
                request.recv(64 * 1024)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release_connection()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release_connection()

    def _release_connection(self) -> None:
        with self._conn_lock:
            self._connections -= 1

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` this server listens on (the port it got when asked for 0)."""
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        host = f"[{host}]" if ":" in str(host) else str(host)
        return f"http://{host}:{port}"

    def start(self) -> ServiceHTTPServer:
        """Serve in a daemon thread (for tests and trainers embedding the service)."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="cuda-agent-service", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (from another thread than ``serve_forever``'s) and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> ServiceHTTPServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stderr_log(line: str) -> None:
    """The request log of ``kernel-service serve``: one line per request on stderr."""
    print(line, file=sys.stderr, flush=True)
