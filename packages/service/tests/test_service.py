"""The service through real HTTP on loopback, over real sandbox pools (cpu backend): a candidate,
workspace tool commands, and every refusal (bad token, oversized or unframed body, malformed
record, too many at once) answered with a clear error before anything runs."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import pytest

from cuda_agent.records import EvalResult, Solution, Status, encode
from cuda_agent.service import ServiceClient, ServiceError

from .conftest import HONEST, TOKEN, Running, kb_candidate


def _hostport(r: Running) -> tuple[str, int]:
    u = urlsplit(r.url)
    assert u.hostname is not None and u.port is not None
    return u.hostname, u.port


def raw(
    r: Running,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, dict]:
    """One request through ``http.client``: status, headers, decoded JSON body."""
    host, port = _hostport(r)
    conn = http.client.HTTPConnection(host, port, timeout=120)
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.headers, json.loads(data) if data else {}
    finally:
        conn.close()


def raw_socket(r: Running, head: str) -> tuple[int, bytes]:
    """Send only a request head (no body) on a plain socket; the status and the whole answer."""
    with socket.create_connection(_hostport(r), timeout=30) as s:
        s.sendall(head.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def error_of(exc: pytest.ExceptionInfo[ServiceError]) -> tuple[int, str, str]:
    return exc.value.status, exc.value.code, exc.value.message


# ---------------------------------------------------------------- what works


@pytest.fixture(autouse=True)
def _strict_service_idle(request):
    """Each test that uses the module's strict service starts with all its slots free."""
    if "strict" in request.fixturenames:
        request.getfixturevalue("strict").wait_idle()


def test_health_needs_no_token_and_runs_nothing(strict):
    before = strict.work_done()
    h = strict.client.health()
    assert (h.status, h.api, h.backend, h.guard_policy) == ("ok", "v1", "cpu", "strict")
    assert h.version == "0.1.0" and h.max_concurrent == 2 and h.max_body_bytes == 64 * 1024
    status, _, body = raw(strict, "GET", "/v1/health", token=None)
    assert status == 200 and body["backend"] == "cpu" and body["devices"] == ["cpu0"]
    assert strict.work_done() == before


def test_an_honest_candidate_is_evaluated(unguarded, task):
    cand = kb_candidate(task, HONEST)
    before = unguarded.pool.submits
    r = unguarded.client.evaluate(cand)
    assert isinstance(r, EvalResult)
    assert r.status == Status.OK, r.message
    assert (r.task_id, r.solution_id, r.backend) == (task.id, cand.solution.id, "cpu")
    assert r.correctness is not None and r.correctness.passed
    assert unguarded.pool.submits == before + 1
    # the body is the record as `records` encodes it
    status, _, body = raw(unguarded, "POST", "/v1/evaluate", encode(cand))
    assert status == 200 and body["kind"] == "eval_result" and body["status"] == "ok"


def test_a_statically_rejected_candidate_is_a_guard_violation(strict, task):
    """The same ModelNew under the strict policy: torch compute, rejected before anything ran."""
    r = strict.client.evaluate(kb_candidate(task, HONEST))
    assert r.status == Status.GUARD_VIOLATION, (r.status, r.message)
    assert any(g.severity == "reject" for g in r.guards), r.guards
    assert r.correctness is None and r.compile is None


def test_a_workspace_round_trip(unguarded, task):
    c = unguarded.client
    info = c.create_workspace_info(task)
    ws, root = info.id, Path(info.path)
    assert root.parent == unguarded.service.workspaces_dir and root.is_dir()
    assert (info.task_id, info.backend) == (task.id, "cpu")
    out = c.bash(ws, "ls")
    assert out.exit_code == 0 and not out.timed_out, out.output
    assert {"model.py", "model_new.py", "SKILL.md", "utils", "kernels"} <= set(out.output.split())
    out = c.bash(ws, "cat model.py")
    assert out.exit_code == 0 and task.ref_code.strip() in out.output
    # the agent's edits are what the workspace evaluation sees
    out = c.bash(ws, f"rm -r kernels && cat > model_new.py <<'EOF'\n{HONEST}EOF\necho written")
    assert out.exit_code == 0 and "written" in out.output, out.output
    r = c.evaluate_workspace(ws)
    want = Solution.make("workdir", {"model_new.py": HONEST})
    assert (r.task_id, r.solution_id) == (task.id, want.id)
    # a workdir solution without kernels: the sandbox's verdict, as a status
    assert r.status == Status.COMPILE_ERROR and r.compile is not None, (r.status, r.message)
    assert "no kernels" in r.compile.log_tail
    out = c.bash(ws, "exit 3")
    assert out.exit_code == 3
    c.delete_workspace(ws)
    assert not root.exists()
    for call in (lambda: c.bash(ws, "ls"), lambda: c.delete_workspace(ws)):
        with pytest.raises(ServiceError) as e:
            call()
        assert error_of(e)[:2] == (404, "not_found") and ws in e.value.message


def test_a_workspace_with_links_is_not_read(strict, task):
    """A confined command may link a solution file to any path; the service (which may run as
    root) refuses to read it: a compile_error result naming the link, nothing submitted."""
    c = strict.client
    ws = c.create_workspace(task)
    try:
        for cmd, words in (
            ("ln -s /etc/passwd kernels/evil.cpp", "kernels/evil.cpp is a symbolic link"),
            ("rm kernels/evil.cpp && mkfifo kernels/pipe.h", "kernels/pipe.h is not a regular"),
            (
                "rm kernels/pipe.h model_new.py && ln -s /etc/passwd model_new.py",
                "model_new.py is a symbolic link",
            ),
            ("rm model_new.py && mv kernels k2 && ln -s /etc kernels", "kernels is a symbolic"),
        ):
            assert c.bash(ws, cmd).exit_code == 0, cmd
            before = strict.pool.submits
            r = c.evaluate_workspace(ws)
            assert r.status == Status.COMPILE_ERROR and words in r.message, (cmd, r.message)
            assert r.meta["refused_by"] == "service" and r.task_id == task.id
            assert strict.pool.submits == before
    finally:
        c.delete_workspace(ws)


def test_bash_time_limits(strict, task):
    c = strict.client
    ws = c.create_workspace(task)
    try:
        out = c.bash(ws, "echo hi", timeout_s=1e6)
        assert out.exit_code == 0 and out.timeout_s == 30.0  # capped: max_bash_timeout_s
        assert c.bash(ws, "echo hi").timeout_s == 30.0  # the default (300 s) is capped too
        t0 = time.monotonic()
        out = c.bash(ws, "sleep 20", timeout_s=0.5)
        assert out.timed_out and out.exit_code != 0 and time.monotonic() - t0 < 15
    finally:
        c.delete_workspace(ws)


# ---------------------------------------------------------------- refusals: nothing runs


def test_a_bad_token_runs_nothing(strict, task):
    ws = strict.client.create_workspace(task)
    root = strict.service.workspace(ws).root
    try:
        before = strict.work_done()
        bad = ServiceClient(strict.url, "not-the-token-0123456789")
        calls = [
            lambda: bad.evaluate(kb_candidate(task, HONEST)),
            lambda: bad.create_workspace(task),
            lambda: bad.bash(ws, "touch pwned"),
            lambda: bad.evaluate_workspace(ws),
            lambda: bad.delete_workspace(ws),
        ]
        for call in calls:
            with pytest.raises(ServiceError) as e:
                call()
            assert error_of(e)[:2] == (401, "unauthorized"), e.value
        for headers in ({}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}):
            status, h, body = raw(
                strict,
                "POST",
                "/v1/evaluate",
                encode(kb_candidate(task, HONEST)),
                token=None,
                headers=headers,
            )
            assert status == 401 and body["error"]["code"] == "unauthorized"
            assert h["WWW-Authenticate"].startswith("Bearer")
        assert strict.work_done() == before
        assert not (root / "pwned").exists() and root.is_dir()
    finally:
        strict.client.delete_workspace(ws)


def test_an_oversized_or_unframed_request_is_refused_unread(strict, task):
    before = strict.work_done()
    big = kb_candidate(task, HONEST + "#" * (100 * 1024) + "\n")
    with pytest.raises(ServiceError) as e:
        strict.client.evaluate(big)
    status, code, message = error_of(e)
    assert (status, code) == (413, "payload_too_large") and "65536" in message
    # decided on Content-Length alone: the head is answered, no body was ever sent
    head = f"POST /v1/evaluate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
    status, data = raw_socket(strict, head + "Content-Length: 1000000000\r\n\r\n")
    assert status == 413 and b'"payload_too_large"' in data
    # a client that waits for 100-continue gets the refusal instead
    status, data = raw_socket(
        strict, head + "Content-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n"
    )
    assert status == 413 and b"100 Continue" not in data
    # no Content-Length, or a chunked body: 411
    status, data = raw_socket(strict, head + "\r\n")
    assert status == 411 and b'"length_required"' in data
    status, data = raw_socket(strict, head + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert status == 411
    for length in ("-5", "1_0", "ten"):
        status, data = raw_socket(strict, head + f"Content-Length: {length}\r\n\r\n")
        assert status == 400 and b"invalid Content-Length" in data, data
    assert strict.work_done() == before


def test_malformed_records_are_400s_naming_the_fault(strict, task):
    ws = strict.client.create_workspace(task)
    try:
        before = strict.work_done()
        cand = json.loads(encode(kb_candidate(task, HONEST)))
        bad_id = json.loads(json.dumps(cand))
        bad_id["task"]["id"] = 7
        cases = [
            ("/v1/evaluate", b"{not json", "malformed JSON"),
            ("/v1/evaluate", b"[1, 2]", "expected a JSON object"),
            ("/v1/evaluate", encode(task), "expected a candidate record"),
            ("/v1/evaluate", b'{"task": {}}', "got no kind"),
            ("/v1/evaluate", json.dumps(bad_id).encode(), "`$.task.id`"),
            ("/v1/evaluate", b'{"kind": "candidate"}', "missing required field `task`"),
            ("/v1/evaluate", json.dumps({**cand, "schema": 99}).encode(), "schema 99"),
            ("/v1/workspaces", json.dumps(cand).encode(), "got kind 'candidate'"),
            (f"/v1/workspaces/{ws}/bash", b'{"cmd": "ls"}', "unknown field `cmd`"),
            (f"/v1/workspaces/{ws}/bash", b'{"command": "  "}', "empty command"),
            (f"/v1/workspaces/{ws}/bash", b'{"command": 5}', "Expected `str`"),
            (f"/v1/workspaces/{ws}/bash", b'{"command": "ls", "timeout_s": -1}', "timeout_s"),
            (f"/v1/workspaces/{ws}/evaluate", b"{}", "takes no request body"),
        ]
        for path, body, words in cases:
            status, _, answer = raw(strict, "POST", path, body)
            assert status == 400, (path, body, answer)
            assert answer["error"]["code"] == "bad_request"
            assert words in answer["error"]["message"], (words, answer)
        assert strict.work_done() == before
        # unknown paths and methods, unknown workspaces
        status, _, answer = raw(strict, "POST", "/v1/nothing", b"{}")
        assert status == 404 and answer["error"]["code"] == "not_found"
        status, h, answer = raw(strict, "GET", "/v1/evaluate")
        assert status == 405 and h["Allow"] == "POST"
        status, _, answer = raw(strict, "PUT", "/v1/evaluate", b"{}")
        assert status == 405
        status, _, answer = raw(
            strict, "POST", "/v1/workspaces/0123456789abcdef/bash", b'{"command": "ls"}'
        )
        assert status == 404 and "no workspace" in answer["error"]["message"]
        status, _, answer = raw(strict, "DELETE", "/v1/workspaces/../../etc")
        assert status == 404
        assert strict.work_done() == before
    finally:
        strict.client.delete_workspace(ws)


def test_at_most_max_concurrent_requests_run(strict, task):
    """Two commands hold both slots; a third request is 503 with Retry-After, unrun; once they
    end, work is taken again."""
    c = strict.client
    wss = [c.create_workspace(task) for _ in range(2)]
    outs: list = []
    try:
        before = strict.work_done()
        threads = [
            threading.Thread(target=lambda w=w: outs.append(c.bash(w, "sleep 4; echo done")))
            for w in wss
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while c.health().in_flight < 2:
            assert time.monotonic() < deadline, "the two commands never both started"
            time.sleep(0.05)
        for call in (
            lambda: c.evaluate(kb_candidate(task, HONEST)),
            lambda: c.bash(wss[0], "echo third"),
            lambda: c.create_workspace(task),
        ):
            with pytest.raises(ServiceError) as e:
                call()
            assert error_of(e)[:2] == (503, "busy") and e.value.retry_after == 5.0
        assert c.health().in_flight == 2  # the health check needs no slot
        for t in threads:
            t.join(60)
        assert [o.exit_code for o in outs] == [0, 0] and all("done" in o.output for o in outs)
        assert strict.work_done() == (before[0], before[1] + 2, before[2])
        assert c.health().in_flight == 0
        r = c.evaluate(kb_candidate(task, HONEST))  # a slot again; an evaluation returns its own
        assert r.status == Status.GUARD_VIOLATION and c.health().in_flight == 0
    finally:
        for w in wss:
            c.delete_workspace(w)


def _wait_connections(r: Running, n: int) -> None:
    deadline = time.monotonic() + 30
    while r.server.connections != n:
        assert time.monotonic() < deadline, (r.server.connections, n)
        time.sleep(0.02)


def test_open_connections_are_capped(strict):
    """Idle connections (a thread each) are bounded too: past max_connections a connection is
    answered 503 and closed without a thread."""
    _wait_connections(strict, 0)
    idle = [socket.create_connection(_hostport(strict), timeout=30) for _ in range(6)]
    try:
        _wait_connections(strict, 6)
        with pytest.raises(ServiceError) as e:
            strict.client.health()
        assert error_of(e)[:2] == (503, "busy") and "max_connections" in e.value.message
    finally:
        for s in idle:
            s.close()
    _wait_connections(strict, 0)
    assert strict.client.health().status == "ok"


def test_workspaces_are_capped(strict, task):
    c = strict.client
    wss = [c.create_workspace(task) for _ in range(3)]
    try:
        with pytest.raises(ServiceError) as e:
            c.create_workspace(task)
        assert error_of(e)[:2] == (409, "workspace_limit")
        assert c.health().workspaces == 3
    finally:
        for w in wss:
            c.delete_workspace(w)
    assert c.health().workspaces == 0
    assert sorted(p.name for p in strict.service.workspaces_dir.iterdir()) == []


def test_error_bodies_decode_as_the_error_message(strict):
    from cuda_agent.service import ErrorResponse

    status, _, body = raw(strict, "POST", "/v1/evaluate", b"{", token="x" * 20)
    err = msgspec.convert(body, ErrorResponse).error
    assert status == 401 and err.code == "unauthorized" and "Bearer" in err.message
