"""The server's port and the ports the engine derives from it (engine data), checked against a fake that
enforces sglang 0.5.12's gRPC rule (port + 10000 <= 65535, and free)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from servematrix.engines import load_engine
from servematrix.run import ports

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "fake_derived_port_server.py"


def test_sglang_declares_its_grpc_offset():
    assert 10000 in load_engine("sglang").port_offsets("0.5.12")
    assert load_engine("transformers").port_offsets("5.24.0") == ()


def test_a_picked_port_leaves_every_derived_port_valid():
    rng = random.Random(7)
    for _ in range(50):
        port = ports.pick_port((10000,), rng=rng)
        assert port + 10000 <= ports.MAX_PORT


def test_ports_are_picked_outside_the_kernels_ephemeral_range(monkeypatch):
    """Any outgoing connection on the host may be given a port from the ephemeral range between the pick and
    the server's bind (a benchmark client's, uv's): the start would fail with address-in-use. The port and
    each derived port stay out of it when the offsets leave room."""
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (32768, 60999))
    rng = random.Random(11)
    sglang = load_engine("sglang").port_offsets("0.5.12", ranks=2)
    for offsets in ((), sglang):
        for _ in range(200):
            port = ports.pick_port(offsets, rng=rng)
            for derived in (port, *(port + o for o in offsets)):
                assert not 32768 <= derived <= 60999 and derived <= ports.MAX_PORT
    # Both quiet ranges are used where a port fits in either.
    picked = {ports.pick_port((), rng=rng) >= 61000 for _ in range(200)}
    assert picked == {True, False}


def test_a_range_that_leaves_no_quiet_port_still_gives_a_valid_one(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = ports.pick_port((1,), rng=random.Random(3))
    assert port >= ports.LOWEST and port + 1 <= ports.MAX_PORT


def test_the_ephemeral_range_is_read_from_the_kernels_file(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    assert ports.ephemeral_range(path) == (32768, 60999)
    for text in ("", "32768", "60999 32768", "a b"):
        path.write_text(text)
        assert ports.ephemeral_range(path) is None
    assert ports.ephemeral_range(tmp_path / "absent") is None


def test_a_taken_derived_port_makes_the_port_unusable(monkeypatch):
    # Which ports the host's other programs hold is no business of this test (a second harness held
    # taken - 10000 once): the host's answer is replaced by a set of taken ports.
    taken = {30000}
    monkeypatch.setattr(ports, "is_free", lambda port, host="127.0.0.1": port not in taken)
    assert ports.usable(20000, ()) and not ports.usable(20000, (10000,))
    assert not ports.usable(60000, (10000,))  # 70000 is no port


def test_is_free_asks_the_host():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        assert not ports.is_free(holder.getsockname()[1])


def test_no_room_is_a_harness_error_not_a_crash():
    with pytest.raises(ports.NoPortError):
        ports.pick_port((60000,))


def _serve(port: int) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    return 0, ""
            except httpx.HTTPError:
                time.sleep(0.05)
        return proc.wait(5), proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()


def test_the_fake_refuses_a_port_from_the_top_of_the_ephemeral_range():
    code, stderr = _serve(60001)
    assert code == 1 and "SGLANG_GRPC_PORT (70001) must be between 1 and 65535" in stderr


def test_twenty_ports_picked_for_sglang_all_start_the_fake():
    offsets = load_engine("sglang").port_offsets("0.5.12")
    for _ in range(20):
        code, stderr = _serve(ports.pick_port(offsets))
        assert code == 0, stderr


def test_a_reserved_port_and_its_derived_ports_are_held_against_another_harness(tmp_path):
    """Two servers packed on one host pick their ports seconds before they bind them: a held port, and every
    port derived from it, is never picked by another harness meanwhile."""
    offsets = (1, 10000)
    with ports.reserved_port(offsets, folder=tmp_path) as first:
        held = {first + o for o in (0, *offsets)}
        assert {int(p.name) for p in tmp_path.iterdir()} == held
        assert all(int(p.read_text()) == os.getpid() for p in tmp_path.iterdir())
        # Another harness (a child process) sees these held, and picks ports none of which are held.
        code = (
            "import sys; from pathlib import Path; from servematrix.run import ports\n"
            f"with ports.reserved_port({offsets!r}, folder=Path({str(tmp_path)!r})) as p:\n"
            "    print(p)\n"
        )
        for _ in range(20):
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            second = int(out)
            assert not {second + o for o in (0, *offsets)} & held
            assert all(1 <= second + o <= ports.MAX_PORT for o in (0, *offsets))
    assert not list(tmp_path.iterdir())  # released when the server is gone


def test_a_dead_harnesss_reservation_is_taken_over(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "23456").write_text(str(dead.pid))
    monkeypatch.setattr(ports, "pick_port", lambda offsets=(), host="127.0.0.1", **_: 23456)
    with ports.reserved_port((), folder=tmp_path) as port:
        assert port == 23456 and (tmp_path / "23456").read_text() == str(os.getpid())


def test_a_port_a_live_harness_holds_is_not_taken(tmp_path, monkeypatch):
    (tmp_path / "23456").write_text(str(os.getppid()))  # alive: the process that runs the tests
    picks = iter([23456, 23458])
    monkeypatch.setattr(ports, "pick_port", lambda offsets=(), host="127.0.0.1", **_: next(picks))
    with ports.reserved_port((), folder=tmp_path) as port:
        assert port == 23458
    assert (tmp_path / "23456").read_text() == str(os.getppid())
