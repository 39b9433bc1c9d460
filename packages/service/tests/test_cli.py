"""``kernel-service serve``: the refusals made before anything starts (a non-loopback host without
--allow-remote, no token), and a real server process: URL on stdout, health, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuda_agent.service import ServiceClient, ServiceError, ServiceHTTPServer, check_host
from cuda_agent.service.cli import app
from cuda_agent.service.server import TOKEN_ENV, TokenError, load_token

from .conftest import TOKEN


@pytest.fixture
def token_file(tmp_path) -> Path:
    p = tmp_path / "token"
    p.write_text(TOKEN + "\n")
    p.chmod(0o600)
    return p


def test_loopback_hosts_and_the_remote_refusal():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert check_host(host) is None
    for host in ("0.0.0.0", "", "::", "10.1.2.3", "example.com"):
        with pytest.raises(ValueError, match="--allow-remote"):
            check_host(host)
    warning = check_host("0.0.0.0", allow_remote=True)
    assert warning is not None and "run code" in warning and "clear text" in warning


def test_the_server_refuses_a_remote_host_before_binding(strict):
    with pytest.raises(ValueError, match="not a loopback address"):
        ServiceHTTPServer(strict.service, "0.0.0.0", 0)


def test_serve_refuses_a_remote_host_and_a_missing_token(token_file, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    runner = CliRunner()
    t0 = time.monotonic()
    r = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--token-file", str(token_file)])
    assert r.exit_code == 2 and "--allow-remote" in r.output, r.output
    r = runner.invoke(app, ["serve", "--backend", "cpu", "--port", "0"])
    assert r.exit_code == 2 and "no token" in r.output, r.output
    short = token_file.with_name("short")
    short.write_text("abc")
    r = runner.invoke(app, ["serve", "--token-file", str(short)])
    assert r.exit_code == 2 and "at least 16 characters" in r.output, r.output
    assert time.monotonic() - t0 < 10  # refused before any pool was made


def test_load_token_prefers_the_file_then_the_environment(token_file):
    assert load_token(token_file, environ={TOKEN_ENV: "y" * 20}) == TOKEN
    assert load_token(None, environ={TOKEN_ENV: " " + "y" * 20 + "\n"}) == "y" * 20
    with pytest.raises(TokenError, match="no token"):
        load_token(None, environ={})
    with pytest.raises(TokenError, match="No such file"):
        load_token(token_file.with_name("absent"), environ={})


def test_help_has_an_example():
    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "Example" in r.output and "--allow-remote" in r.output


def test_serve_prints_its_url_and_stops_on_sigterm(token_file, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cuda_agent.service",
            "serve",
            "--backend",
            "cpu",
            "--port",
            "0",
            "--token-file",
            str(token_file),
            "--no-timing",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert p.stdout is not None
        url = p.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
        client = ServiceClient(url, TOKEN)
        h = client.health()
        assert h.backend == "cpu" and h.guard_policy == "strict"
        with pytest.raises(ServiceError) as e:
            ServiceClient(url, "z" * 24).request("POST", "/v1/workspaces", b"{}")
        assert e.value.status == 401
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    m = re.search(r"workspaces=(\S+)", err)
    assert m and "service: stopped" in err, err
    assert not Path(m.group(1)).exists()  # the directory it made is removed
