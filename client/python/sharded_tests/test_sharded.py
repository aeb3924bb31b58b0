"""tqkv.ShardedClient against three real servers and a single reference
server: chains spread evenly, reads and attends equal the single server's, a
killed shard's chains read as misses (reads of its blocks raise Unavailable
naming it), its durable chains are back after a restart, and a fourth shard
takes about a quarter of the chains."""
import hashlib
import itertools

import numpy as np
import pytest

import tqkv
from servers import Server

MODEL = dict(num_layers=1, num_kv_heads=1, num_q_heads=2, head_dim=64, block_size=16,
             cache_dtype="k4v4", rotation_seed=7)


def chain(seed, n, rng):
    """n blocks of one prefix chain: (hash, k, v, parent)."""
    out, parent = [], b""
    for j in range(n):
        h = hashlib.sha256(parent + f"{seed}/{j}".encode()).digest()
        k = rng.standard_normal((1, 16, 1, 64)).astype(np.float16)
        v = rng.standard_normal((1, 16, 1, 64)).astype(np.float16)
        out.append(tqkv.Block(h, k=k, v=v, parent=parent))
        parent = h
    return out


def put_all(client, model, chains, **kw):
    for s in range(0, len(chains), 100):
        client.put_blocks(model, [b for c in chains[s:s + 100] for b in c], **kw)


@pytest.fixture
def cluster():
    servers = [Server() for _ in range(3)]
    reference = Server()
    yield servers, reference
    for s in servers + [reference]:
        s.kill()


def test_sharded_client(cluster):
    servers, reference = cluster
    now = [1000.0]
    sc = tqkv.ShardedClient([s.address for s in servers], clock=lambda: now[0], timeout=60, retries=1)
    ref = tqkv.Client(reference.address, timeout=60)
    model = sc.register_model("sharded-py", **MODEL)
    assert ref.register_model("sharded-py", **MODEL).fingerprint == model.fingerprint

    rng = np.random.default_rng(5)
    chains = [chain(i, 4, rng) for i in range(2500)]             # 10,000 blocks
    durable = [chain(10**6 + i, 2, rng) for i in range(1000)]    # 2,000 durable blocks
    put_all(sc, model, chains)
    per_shard = {a: s.model(model.model_id) for a, s in sc.stats(model.model_id).items()}
    for a, m in per_shard.items():
        blocks = sum(t.blocks for t in m.tiers.values())
        assert 10000 / 3 * 0.85 < blocks < 10000 / 3 * 1.15, (a, blocks)
    put_all(sc, model, durable, durable=True)
    put_all(ref, model, chains[:30])
    put_all(ref, model, durable[:30], durable=True)

    # Lookups, reads and attends equal the single server's.
    for c in chains[:30] + durable[:30]:
        hs = [b.hash for b in c] + [b"never-stored"]
        assert sc.lookup(model, hs) == ref.lookup(model, hs)
        assert sc.lookup(model, hs).hits == len(c)
    hs = [b.hash for j in range(4) for c in chains[:30] for b in c[3 - j:4 - j]]
    keys = [c[0].hash for j in range(4) for c in chains[:30]]
    got, want = sc.get_blocks(model, hs, routing_keys=keys), ref.get_blocks(model, hs)
    assert [(g.hash, g.payload) for g in got] == [(w.hash, w.payload) for w in want]
    got = sc.get_blocks(model, hs, routing_keys=keys, dense=True)
    want = ref.get_blocks(model, hs, dense=True)
    assert all(np.array_equal(g.k, w.k) and np.array_equal(g.v, w.v) for g, w in zip(got, want))
    # Six chains taken round-robin over their shards, so the attend call spans shards
    # whatever ports the servers got.
    by_shard = {}
    for c in chains[:30]:
        by_shard.setdefault(sc.shard_for(c[0].hash), []).append(c)
    picked = [c for row in itertools.zip_longest(*by_shard.values()) for c in row if c is not None][:6]
    seqs = [(sc.create_sequence(model, [b.hash for b in c]), ref.create_sequence(model, [b.hash for b in c]))
            for c in picked]
    assert len({s.id.rpartition("/")[0] for s, _ in seqs}) >= 2, "the attend call should span shards"
    q = [rng.standard_normal((1, 2, 64)).astype(np.float16) for _ in seqs]
    kv = [rng.standard_normal((1, 1, 64)).astype(np.float16) for _ in seqs]
    a = sc.attend(0, [(s, q[i], None, kv[i], kv[i]) for i, (s, _) in enumerate(seqs)])
    b = ref.attend(0, [(r, q[i], None, kv[i], kv[i]) for i, (_, r) in enumerate(seqs)])
    assert all(np.array_equal(x, y) and x.shape == (1, 2, 64) for x, y in zip(a, b))
    victim_seq = seqs[0][0]

    # Kill the shard of chain 0: its chains are misses, the others hit.
    victim = sc.shard_for(chains[0][0].hash)
    vi = [s.address for s in servers].index(victim)
    servers[vi].kill()
    for c in chains:
        dead = sc.shard_for(c[0].hash) == victim
        assert sc.lookup(model, [b.hash for b in c]).hits == (0 if dead else 4)
    with pytest.raises(tqkv.Unavailable) as e:
        sc.get_blocks(model, [chains[0][1].hash], routing_keys=chains[0][0].hash)
    assert e.value.shard == victim and f"shard {victim}" in str(e.value)
    with pytest.raises(tqkv.Unavailable) as e:
        victim_seq.attend(0, q[0])
    assert e.value.shard == victim

    # Restart it on its address: its durable chains are back, byte for byte.
    servers[vi] = Server(servers[vi].data_dir, port=servers[vi].port)
    now[0] += 3
    assert all(sc.lookup(model, [b.hash for b in c]).hits == 2 for c in durable)
    hs = [b.hash for c in durable[:30] for b in c]
    keys = [c[0].hash for c in durable[:30] for _ in c]
    got, want = sc.get_blocks(model, hs, routing_keys=keys), ref.get_blocks(model, hs)
    assert [g.payload for g in got] == [w.payload for w in want]

    # A fourth shard takes about a quarter of the chains, and only those move.
    before = {c[0].hash: sc.shard_for(c[0].hash) for c in chains + durable}
    servers.append(Server())
    sc.set_servers([s.address for s in servers])
    for group, n in ((chains, 4), (durable, 2)):
        moved = 0
        for c in group:
            owner = sc.shard_for(c[0].hash)
            hits = sc.lookup(model, [b.hash for b in c]).hits
            if owner != before[c[0].hash]:
                moved += 1
                assert owner == servers[-1].address and hits == 0
            elif n == 4 and owner == victim:
                assert hits == 0  # not durable: lost with the kill
            else:
                assert hits == n
        assert 0.18 <= moved / len(group) <= 0.30, moved
    sc.close()
    ref.close()
