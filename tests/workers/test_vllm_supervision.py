"""The vLLM server's supervision without vLLM: `python` points at a real stand-in program that
takes vLLM's command line. One fails the way vLLM does when it cannot start (a reason on its
output, exit 1); the other serves /health on the port it was given. What is tested is Atoll's
side: the error a user reads, the log it points to, and what is left in /tmp afterwards."""
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from workers.llm import vllm_server
from workers.llm.config import VLLMModel
from workers.llm.local_server import free_port, healthy, serves_here, wait_healthy
from workers.llm.vllm_server import VLLMServer

FAILS = """\
import sys
print("INFO starting the engine", flush=True)
print("ValueError: No available memory for the cache blocks.", file=sys.stderr, flush=True)
sys.exit(1)
"""

SERVES = """\
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

port = int(sys.argv[sys.argv.index("--port") + 1])
print("serving", " ".join(sys.argv[1:]), flush=True)
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def stand_in(tmp_path, body: str):
    """An executable that vLLMServer runs as `python -m vllm... --port N`: it drops the `-m module`."""
    (tmp_path / "prog.py").write_text(body)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {tmp_path / 'prog.py'} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def config(tmp_path, exe, **kw):
    return VLLMModel(name="m", model_path=tmp_path, python=exe, engine="vllm", gpus=0, **kw)


def test_a_server_that_cannot_start_is_said_with_its_reason_and_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the log it keeps for the user: not in /tmp
    cfg = config(tmp_path, stand_in(tmp_path, FAILS), startup_timeout_s=60)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        VLLMServer(cfg)
    assert time.monotonic() - start < 30  # the exit is seen at once, not after the start-up timeout
    last = str(caught.value).splitlines()[-1]  # what the run's "could not start" line shows
    assert "exited with status 1" in last and "No available memory for the cache blocks" in last, last
    log = Path(last.split("(the whole log: ")[1].rstrip(")"))
    assert "INFO starting the engine" in log.read_text()  # kept: the user reads it
    assert log.parent.parent == tmp_path


def test_a_clean_shutdown_leaves_nothing_and_a_restarted_server_keeps_its_log(tmp_path):
    cfg = config(tmp_path, stand_in(tmp_path, SERVES), startup_timeout_s=60)
    server = VLLMServer(cfg, check_every_s=0.3)
    log = server.log
    assert healthy(server.root) and "--served-model-name m" in log.read_text()
    server.shutdown()
    assert not log.parent.exists()

    server = VLLMServer(cfg, check_every_s=1.0)  # a health check waits this long: 0.3 s could restart it twice
    try:
        server.kill_for_test()
        deadline = time.monotonic() + 60
        while not (server.restarts and healthy(server.root)):
            assert time.monotonic() < deadline, "the watchdog did not restart the server"
            time.sleep(0.1)
    finally:
        server.shutdown()
    assert server.log.read_text().count("serving") == 2 and server.status()["restarts"] == 1
    os.remove(server.log)
    os.rmdir(server.log.parent)


def test_serves_here_names_the_process_that_holds_the_listening_socket(tmp_path):
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        assert serves_here(port, os.getsid(0))  # this process's session holds it
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        try:
            assert not serves_here(port, other.pid)
        finally:
            other.kill()
            other.wait()
    assert not serves_here(port, os.getsid(0))  # closed: nobody listens


def test_a_port_another_program_answers_on_is_given_up_for_another(tmp_path, monkeypatch):
    """The race `free_port` leaves: another program binds the chosen port before vLLM does and answers
    /health. The server must not take that answer for vLLM's: it chooses another port."""
    taken = free_port()
    foreign = subprocess.Popen([sys.executable, "-c", SERVES, "--port", str(taken)])  # not the server's session
    try:
        wait_healthy(f"http://127.0.0.1:{taken}", 30)
        chosen = iter([taken])  # the first choice is the taken port; later ones are free_port's own
        monkeypatch.setattr(vllm_server, "free_port", lambda: next(chosen, None) or free_port())
        server = VLLMServer(config(tmp_path, stand_in(tmp_path, SERVES), startup_timeout_s=60), check_every_s=5.0)
        try:
            assert server.port != taken and serves_here(server.port, server._proc.pid) and healthy(server.root)
            assert foreign.poll() is None  # the other program is left alone
        finally:
            server.shutdown()
    finally:
        foreign.kill()
        foreign.wait()
