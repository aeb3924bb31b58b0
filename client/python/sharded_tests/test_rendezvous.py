"""tqkv.rendezvous: the golden values client/cpp/rendezvous_test.cc asserts
too (a Python and a C++ client must route alike), spread and movement."""
from tqkv.rendezvous import Ring, rendezvous_hash, rendezvous_owner, rendezvous_score
from tqkv.sharded import parse_servers, resolve

import pytest


def test_golden_values_shared_with_cpp():
    assert rendezvous_hash(b"") == 0xf52a15e9a9b5e89b
    assert rendezvous_hash(b"a") == 0x2c0bdbf481420f8
    assert rendezvous_hash(b"tqkv") == 0xe9717778d468e490
    assert rendezvous_hash(bytes(range(32))) == 0xa87fa126f653fd51
    k, s = rendezvous_hash(b"chain-0"), rendezvous_hash(b"10.0.0.1:50051")
    assert rendezvous_score(k, s, 1.0) == 0.41050248949562984
    assert rendezvous_score(k, s, 2.5) == 1.0262562237390747
    shards = [("10.0.0.1:50051", 1.0), ("10.0.0.2:50051", 1.0), ("10.0.0.3:50051", 2.0)]
    owners = "".join(str(rendezvous_owner(f"key-{i}".encode(), shards)) for i in range(32))
    assert owners == "22201220102202212212221121222012"
    ring = Ring(shards)
    assert all(ring.owner(f"key-{i}".encode()) == rendezvous_owner(f"key-{i}".encode(), shards)
               for i in range(200))


def test_a_fourth_shard_takes_a_quarter_and_nothing_else_moves():
    three = Ring([(f"10.1.0.{i}:50051", 1.0) for i in range(3)])
    four = Ring([(f"10.1.0.{i}:50051", 1.0) for i in range(4)])
    keys = [f"chain-root-{i}".encode() for i in range(6000)]
    counts = [0, 0, 0]
    moved = 0
    for k in keys:
        a, b = three.owner(k), four.owner(k)
        counts[a] += 1
        if a != b:
            assert b == 3, "a key moved between old shards"
            moved += 1
    assert all(abs(c - 2000) < 200 for c in counts), counts
    assert 0.22 < moved / len(keys) < 0.28


def test_server_lists():
    assert parse_servers("a:1, b:2=2.5") == [("a:1", 1.0), ("b:2", 2.5)]
    assert parse_servers([("a:1", 3)]) == [("a:1", 3.0)]
    for bad in ["", "a", "a:x", "a:1=0", "a:1,a:1", ":1"]:
        with pytest.raises(ValueError):
            parse_servers(bad)
    got = resolve("localhost:7")
    assert got and all(a in ("127.0.0.1:7", "[::1]:7") for a, _ in got)
