"""procenv.listen_port: a listener's port drawn outside the ephemeral range, free, and never one already taken."""

from __future__ import annotations

import random
import socket

from marti_ibrl import procenv
from marti_ibrl.procenv import LISTEN_PORTS_FROM, ephemeral_ports, listen_port


def test_ports_lie_between_rays_worker_ports_and_the_ephemeral_range_and_are_free():
    low = ephemeral_ports()[0]
    ports = {listen_port("127.0.0.1") for _ in range(50)}
    assert all(LISTEN_PORTS_FROM <= p < low for p in ports), sorted(ports)
    assert len(ports) > 40  # drawn at random: two test processes rarely draw the same
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def test_a_port_in_use_is_skipped():
    first = listen_port("", rng=random.Random(7))
    with socket.socket() as taken:
        taken.bind(("", first))
        taken.listen()
        again = listen_port("", rng=random.Random(7))  # the same draw, first taken
    assert again != first and LISTEN_PORTS_FROM <= again < ephemeral_ports()[0]


def test_a_kernel_whose_ephemeral_range_leaves_no_gap_gets_an_os_port(monkeypatch):
    monkeypatch.setattr(procenv, "ephemeral_ports", lambda: (20500, 60999))
    port = listen_port("127.0.0.1")
    assert 20500 <= port <= 60999  # bind(0): the kernel's range


def test_the_ephemeral_range_is_read_from_the_kernel():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert ephemeral_ports() == tuple(int(v) for v in f.read().split())


def test_the_roles_distributed_actors_draw_their_rendezvous_port_here():
    from marti_ibrl.backend.actors import RolePolicyActorBase, RoleReferenceActorBase

    for actor in (RolePolicyActorBase, RoleReferenceActorBase):
        assert LISTEN_PORTS_FROM <= actor._get_free_port() < ephemeral_ports()[0], actor  # OpenRLHF's: bind(0)


def test_the_local_slurms_ports_are_drawn_outside_the_ephemeral_range() -> None:
    """tests/slurm_cluster.py chooses its daemons' and jobs' Ray ports at session start; they listen minutes later,
    so a port another process could get from ``bind(0)`` meanwhile (an ephemeral one) is never chosen."""
    from slurm_cluster import _free_ports

    low, _ = ephemeral_ports()
    ports = _free_ports(6) + _free_ports(3, consecutive=3)
    assert all(LISTEN_PORTS_FROM <= p < low for p in ports)
    spans = [set(range(p, p + 3)) for p in ports[6:]]
    assert len(set(ports[:6])) == 6 and not (spans[0] & spans[1] or spans[0] & spans[2] or spans[1] & spans[2])
