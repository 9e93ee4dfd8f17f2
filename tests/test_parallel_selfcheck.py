"""Self-check of how `make test` runs in parallel (tests/parallel.py, tests/procs.py's ports): the
units of work that keep shared processes and ordered packages on one worker, and the ports each
xdist worker hands out."""

from __future__ import annotations

import os
import socket

import pytest

from tests import procs
from tests.parallel import heaviness, work_unit


def test_a_module_is_one_unit_and_the_one_worker_packages_are_one_each() -> None:
    assert work_unit("tests/integration/test_sse_chat.py::test_a[6-sse]") == "tests/integration/test_sse_chat.py"
    assert work_unit("tests/unit/test_errors.py::TestX::test_y") == "tests/unit/test_errors.py"
    # The fuzz modules and the one that checks after them; every browser module.
    fuzz = {work_unit(f"tests/fuzz/{m}.py::t") for m in ("test_http_inputs", "test_ws_frames", "test_zz_after_fuzz")}
    assert fuzz == {"tests/fuzz"}
    assert work_unit("tests/browser/test_demo_page.py::t") == work_unit("tests/browser/test_four_eyes.py::t") == "tests/browser"
    # A name that merely starts alike is not in the package.
    assert work_unit("tests/fuzzy_test.py::t") == "tests/fuzzy_test.py"


def test_the_long_units_are_queued_before_the_unit_tests() -> None:
    order = ["tests/unit/test_errors.py::t", "tests/test_ops_kit.py::t", "tests/integration/test_x.py::t",
             "tests/ops/test_load.py::t", "tests/browser/test_demo_page.py::t", "tests/fuzz/test_zz_after_fuzz.py::t"]
    assert sorted(order, key=heaviness) == [
        "tests/fuzz/test_zz_after_fuzz.py::t", "tests/browser/test_demo_page.py::t", "tests/ops/test_load.py::t",
        "tests/integration/test_x.py::t", "tests/unit/test_errors.py::t", "tests/test_ops_kit.py::t",
    ]


def test_each_worker_hands_out_ports_of_its_own_block_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # This worker's own block (gw0's in a serial run): what the test takes from it, no other worker
    # was going to use.
    worker = os.environ.get("PYTEST_XDIST_WORKER") or "gw0"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    ports = [procs.free_port() for _ in range(50)]
    first = procs.FIRST_PORT + procs.PORT_BLOCK * (int(worker[2:]) % procs.PORT_BLOCKS)
    assert all(first <= port < first + procs.PORT_BLOCK for port in ports)
    assert len(set(ports)) == 50  # none again before the block is used up
    # Below the kernel's ephemeral range, where no connection's local port lands.
    assert procs.FIRST_PORT + procs.PORT_BLOCK * procs.PORT_BLOCKS <= 32768
    # A port some process holds is skipped.
    nxt = ports[-1] + 1 if ports[-1] + 1 < first + procs.PORT_BLOCK else first
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", nxt))
        except OSError:
            pytest.skip(f"port {nxt} is busy on this machine")
        assert procs.free_port() != nxt


def test_without_workers_the_ports_are_gw0s_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not the kernel's choice: that is in the ephemeral range, where an outgoing connection took a
    # port in the seconds between its choice and a replica's bind ("address already in use").
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert procs.worker_ports("") is None
    assert procs.FIRST_PORT <= procs.free_port() < procs.FIRST_PORT + procs.PORT_BLOCK
