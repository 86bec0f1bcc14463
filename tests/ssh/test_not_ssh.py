"""A host whose port does not speak SSH: one clear line naming it, no paramiko traceback."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.conftest import REPO, cli


def test_port_that_closes_at_once_is_one_line(tmp_path: Path) -> None:
    """paramiko's transport-thread traceback never reaches the user; the host is named."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def refuse_politely() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=refuse_politely, daemon=True).start()
    (tmp_path / "ssh_config").write_text(f"Host 127.0.0.1\n  Port {port}\n")
    (tmp_path / "hosts").write_text("127.0.0.1\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"script: {REPO / 'jobs' / 'hello.py'}\n"
                   f"ssh: {{config_file: {tmp_path / 'ssh_config'}, connect_timeout: 3}}\n")
    try:
        result = cli("run", str(job), "--hostfile", str(tmp_path / "hosts"), cwd=tmp_path, timeout=600)
    finally:
        server.close()
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr, result.stderr
    assert f"ssh to 127.0.0.1:{port} failed" in result.stderr and "nothing was started" in result.stderr
