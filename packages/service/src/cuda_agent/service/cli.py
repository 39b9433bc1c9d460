"""``service``: the kernel environment over HTTP for trainers outside Ray.

stdout carries one line, the URL the server listens on; the request log and notes go to stderr.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from cuda_agent.records.cli_helpers import fail, log
from cuda_agent.sandbox.stream import CompileJobsOpt, CpuWorkersOpt, GpusOpt, WorkersPerGpuOpt

from .server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MIB,
    TOKEN_ENV,
    KernelService,
    ServiceHTTPServer,
    ServiceSettings,
    TokenError,
    check_host,
    load_token,
    stderr_log,
    token_file_warning,
)

app = typer.Typer(
    help=f"""Serve the kernel environment over HTTP: evaluate candidates, run workspace tools.

It runs the code it is sent (in the sandbox): it listens on {DEFAULT_HOST} unless --allow-remote, needs a bearer token (--token-file or ${TOKEN_ENV}) on every endpoint but /v1/health, and bounds request size, time and concurrency.

Examples:

  python -c 'import secrets; print(secrets.token_urlsafe(32))' > token && chmod 600 token

  kernel-service serve --backend cpu --token-file token --port 8470

  kernel-service serve --backend cuda --gpus 0,1 --token-file token --max-concurrent 32
""",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main() -> None:
    """The kernel environment as an HTTP service."""


def _sandbox_overrides(text: str | None) -> dict:
    if not text:
        return {}
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--sandbox-config") from None
    if not isinstance(d, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--sandbox-config")
    return d


@app.command("serve")
def serve(
    backend: Annotated[str, typer.Option("--backend", help="cuda | cpu | auto")] = "auto",
    gpus: GpusOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (loopback unless --allow-remote).")
    ] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0: any free port.")] = (
        DEFAULT_PORT
    ),
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help="Allow a non-loopback --host (anyone with the token runs code)."
        ),
    ] = False,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help=f"File holding the bearer token (else ${TOKEN_ENV})."),
    ] = None,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", min=0.001, help="Largest request body (413 above).")
    ] = 8.0,
    max_concurrent: Annotated[
        int,
        typer.Option("--max-concurrent", min=1, help="Requests running work at once (503 above)."),
    ] = 16,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections", min=1, help="Open connections (a thread each; 503 above)."
        ),
    ] = 256,
    max_workspaces: Annotated[
        int, typer.Option("--max-workspaces", min=1, help="Workspaces at once (409 above).")
    ] = 16,
    workspaces_dir: Annotated[
        Path | None,
        typer.Option(
            "--workspaces-dir",
            help="Where workspaces live (default: a new directory under the system's temp dir, "
            "removed at exit).",
        ),
    ] = None,
    keep_workspaces: Annotated[
        bool, typer.Option("--keep-workspaces", help="Leave workspaces on disk at exit.")
    ] = False,
    bash_timeout: Annotated[
        float, typer.Option("--bash-timeout", min=0.1, help="A command's default limit, s.")
    ] = 300.0,
    max_bash_timeout: Annotated[
        float, typer.Option("--max-bash-timeout", min=0.1, help="The cap on a command's limit, s.")
    ] = 600.0,
    eval_wait: Annotated[
        float,
        typer.Option(
            "--eval-wait",
            min=1.0,
            help="How long a request waits for its evaluation before 504 (the evaluation's own "
            "phases have the sandbox's limits), s.",
        ),
    ] = 3600.0,
    read_timeout: Annotated[
        float,
        typer.Option("--read-timeout", min=0.1, help="For a request's headers and body, s."),
    ] = 30.0,
    guard_policy: Annotated[
        str, typer.Option("--guard-policy", help="strict | kernelbench | off")
    ] = "strict",
    timing: Annotated[
        bool, typer.Option("--timing/--no-timing", help="Time correct candidates.")
    ] = True,
    sandbox_config: Annotated[
        str | None,
        typer.Option(
            "--sandbox-config",
            help='More SandboxConfig fields as JSON, e.g. {"verify_timeout_s": 120, "trials": 5}.',
        ),
    ] = None,
    compile_jobs: CompileJobsOpt = None,
    cpu_workers: CpuWorkersOpt = 1,
    workers_per_gpu: WorkersPerGpuOpt = 2,
    quiet: Annotated[bool, typer.Option("--quiet", help="No request log on stderr.")] = False,
) -> None:
    """Serve until SIGTERM or Ctrl-C; prints the URL it listens on, then logs requests.

    Example: kernel-service serve --backend cpu --token-file token --port 8470
    """
    import shutil
    import tempfile

    from cuda_agent.agent.env import SandboxEnv
    from cuda_agent.sandbox import SandboxConfig, SandboxPool, resolve_backend
    from cuda_agent.sandbox.pool import parse_gpus

    # refusals first: nothing is started for a bad host or without a token
    try:
        warning = check_host(host, allow_remote)
    except ValueError as e:
        raise fail(f"kernel-service serve: {e}") from None
    try:
        token = load_token(token_file)
    except TokenError as e:
        raise fail(f"kernel-service serve: {e}") from None
    if backend not in ("cuda", "cpu", "auto"):
        raise typer.BadParameter(f"{backend!r}: expected cuda, cpu or auto", param_hint="--backend")
    try:
        settings = ServiceSettings(
            max_body_bytes=max(1, int(max_body_mb * MIB)),
            max_concurrent=max_concurrent,
            max_workspaces=max_workspaces,
            max_connections=max_connections,
            bash_timeout_s=bash_timeout,
            max_bash_timeout_s=max_bash_timeout,
            eval_wait_s=eval_wait,
            read_timeout_s=read_timeout,
            keep_workspaces=keep_workspaces,
        )
        fields = {
            "guard_policy": guard_policy,
            "timing": timing,
            "workers_per_gpu": workers_per_gpu,
        }
        fields.update(_sandbox_overrides(sandbox_config))
        fields["backend"] = resolve_backend(backend)
        cfg = SandboxConfig.from_dict(fields)  # an unknown guard policy is refused there
        gpu_list = parse_gpus(gpus)
    except ValueError as e:
        raise fail(f"kernel-service serve: {e}") from None
    if warning:
        log(warning)
    if token_file is not None and (w := token_file_warning(token_file)):
        log(w)

    made_dir = workspaces_dir is None
    if workspaces_dir is None:
        ws_root = Path(tempfile.mkdtemp(prefix="cuda-agent-service-"))
        ws_root.chmod(0o711)  # confined commands (another uid) must reach their workspace
    else:
        ws_root = workspaces_dir
    pool = SandboxPool(cfg, gpus=gpu_list, compile_workers=compile_jobs, cpu_workers=cpu_workers)
    env = SandboxEnv(cfg, pool=pool)
    server: ServiceHTTPServer | None = None
    service: KernelService | None = None
    try:
        service = KernelService(pool, env, token, ws_root, settings)
        server = ServiceHTTPServer(
            service, host, port, allow_remote=allow_remote, log=None if quiet else stderr_log
        )
        srv = server
        signal.signal(
            signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start()
        )
        print(server.url, flush=True)
        log(
            f"service: {server.url} backend={cfg.backend} devices={','.join(pool.devices)} "
            f"guard_policy={cfg.guard_policy} max_concurrent={settings.max_concurrent} "
            f"max_body={settings.max_body_bytes}B max_workspaces={settings.max_workspaces} "
            f"workspaces={ws_root}"
        )
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    except (OSError, ValueError) as e:
        raise fail(f"kernel-service serve: {e}") from None
    finally:
        if server is not None:
            server.server_close()
        if service is not None:
            service.close()
        pool.close()
        if made_dir and not keep_workspaces:
            shutil.rmtree(ws_root, ignore_errors=True)
        log("service: stopped")


def main() -> None:
    """Entry point of ``python -m cuda_agent.service``."""
    app()


if __name__ == "__main__":
    main()
