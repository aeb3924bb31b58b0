"""The data plane (bulk packed reads over plain TCP) from Python."""
import numpy as np
import pytest

import tqkv
from helpers import hashes, kv, unique

L, H, D, BS = 3, 2, 128, 16


def test_data_plane_matches_grpc_get_blocks(client, server, rng):
    m = client.register_model(unique(), num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                              cache_dtype="k4v4")
    hs = hashes(unique("dp"), 5)
    blocks = []
    for h in hs:
        k, v = kv(rng, L, BS, H, D)
        blocks.append(tqkv.Block(h, k=k, v=v))
    client.put_blocks(m, blocks)
    want = client.get_blocks(m, hs)
    with tqkv.DataPlane(server.data_address) as dp:
        got = dp.get_blocks(m, hs, with_format=True)
        assert [b.hash for b in got] == hs
        assert [b.payload for b in got] == [b.payload for b in want]
        assert all(b.tier == "host" for b in got)
        assert got[0].format.block_bytes == m.format.block_bytes
        # Layer range, zero-copy views, no format unless asked.
        part = dp.get_blocks(m, hs[3:1:-1], first_layer=1, last_layer=3, copy=False)
        ref = client.get_blocks(m, hs[3:1:-1], first_layer=1, last_layer=3)
        assert [bytes(b.payload) for b in part] == [b.payload for b in ref]
        assert part[0].format is None
        # Errors carry the same classes as gRPC; the connection stays usable.
        with pytest.raises(tqkv.NotFound):
            dp.get_blocks(m, [hs[0], b"missing"])
        stale = (m.model_id, "0" * 32)
        with pytest.raises(tqkv.FailedPrecondition):
            dp.get_blocks(stale, hs)
        assert len(dp.get_blocks(m, hs)) == len(hs)


def test_data_plane_unreachable_is_unavailable():
    with pytest.raises(tqkv.Unavailable):
        tqkv.DataPlane("127.0.0.1:1", timeout=5).get_blocks((1, "0" * 32), [b"h"])


HQ = 4


def stored_model(client, rng, n):
    """A 2-layer GQA model with n stored blocks, their hashes and a decode query."""
    m = client.register_model(unique(), num_layers=2, num_kv_heads=H, num_q_heads=HQ, head_dim=D,
                              block_size=BS, cache_dtype="k4v4")
    hs = hashes(unique("dp"), n)
    client.put_blocks(m, [tqkv.Block(h, *kv(rng, 2, BS, H, D)) for h in hs])
    return m, hs, rng.standard_normal((1, HQ, D)).astype(np.float16)


def test_data_plane_attend_matches_grpc_attend(client, server, rng):
    m, hs, q = stored_model(client, rng, 3)
    with client.create_sequence(m, hs) as seq, tqkv.DataPlane(server.data_address) as dp:
        for layer in range(2):
            want = client.attend(layer, [(seq, q)])[0]
            got, micros = dp.attend(layer, [(seq, q)], return_kernel_micros=True)
            assert got[0].dtype == np.float16 and got[0].shape == (1, HQ, D)
            assert np.array_equal(got[0], want) and np.abs(want).max() > 0
        with pytest.raises(tqkv.NotFound):
            dp.attend(0, [("no-such-sequence", q)])
        assert np.array_equal(dp.attend(1, [(seq, q)])[0], client.attend(1, [(seq, q)])[0])


def test_client_routes_packed_reads_and_attend_over_the_data_plane(client, server, rng):
    m, hs, q = stored_model(client, rng, 4)
    with tqkv.Client(server.address, timeout=60, data_address=server.data_address) as fast:
        got = fast.get_blocks(m, hs)
        want = client.get_blocks(m, hs)
        assert [b.payload for b in got] == [b.payload for b in want]
        assert got[0].format == want[0].format
        dense = fast.get_blocks(m, hs[:1], dense=True)  # dense stays on gRPC
        assert dense[0].k.shape == (2, BS, H, D)
        with pytest.raises(tqkv.NotFound):
            fast.get_blocks(m, [b"missing"])
        with client.create_sequence(m, hs) as seq:
            assert np.array_equal(fast.attend(0, [(seq, q)])[0], client.attend(0, [(seq, q)])[0])


def test_client_finds_the_data_plane_through_stats(client, server, rng):
    m, hs, _ = stored_model(client, rng, 2)
    assert client.stats().data_plane_address == server.data_address
    with tqkv.Client(server.address, timeout=60, data_address="auto") as auto:
        got = auto.get_blocks(m, hs)
        assert auto.data_address == server.data_address
        assert [b.payload for b in got] == [b.payload for b in client.get_blocks(m, hs)]


def test_polling_for_replies_gives_the_same_replies(client, server, rng):
    """DataPlane(reply_poll=...) polls for each reply before sleeping: the
    same outputs and errors, also when a reply outlasts the poll window."""
    m, hs, q = stored_model(client, rng, 3)
    with client.create_sequence(m, hs) as seq, tqkv.DataPlane(server.data_address) as slept:
        for poll in (0.2, 1e-6):
            with tqkv.DataPlane(server.data_address, reply_poll=poll) as polled:
                for layer in range(2):
                    assert np.array_equal(polled.attend(layer, [(seq, q)])[0], slept.attend(layer, [(seq, q)])[0])
                with pytest.raises(tqkv.NotFound):
                    polled.attend(0, [("no-such-sequence", q)])
    with tqkv.Client(server.address, data_address=server.data_address, data_reply_poll=0.1) as c, \
            c.create_sequence(m, hs) as seq:
        assert np.array_equal(c.attend(0, [(seq, q)])[0], client.attend(0, [(seq, q)])[0])


def test_decode_step_appends_and_attends_in_one_call(client, server, rng):
    """Sequence.append_attend (gRPC), DataPlane.attend with new tokens and
    append + attend give the same bytes at every step, across a block fill."""
    m, hs, q = stored_model(client, rng, 2)
    tail = kv(rng, 2, 9, H, D)
    with tqkv.Client(server.address, timeout=60, data_address=server.data_address) as fast, \
            client.create_sequence(m, hs, tail_k=tail[0], tail_v=tail[1]) as a, \
            client.create_sequence(m, hs, tail_k=tail[0], tail_v=tail[1]) as b, \
            client.create_sequence(m, hs, tail_k=tail[0], tail_v=tail[1]) as c:
        for step in range(10):  # the 9-token tails fill at step 6
            for layer in range(2):
                k, v = kv(rng, 1, 1, H, D)
                assert a.append(layer, k[0], v[0]) == 2 * BS + 9 + step + 1
                want = a.attend(layer, q)
                got_grpc = b.append_attend(layer, k[0], v[0], q)
                got_dp = fast.attend(layer, [(c, q, None, k[0], v[0])])[0]
                assert np.array_equal(got_grpc, want) and np.array_equal(got_dp, want)
                assert np.abs(want).max() > 0
        # A failed call appends nothing: b's next append reports one more token.
        k, v = kv(rng, 1, 1, H, D)
        with pytest.raises(tqkv.InvalidArgument):
            client.attend(0, [(b, q, None, k[0], v[0]), (a, q, [10**6])])
        with pytest.raises(tqkv.InvalidArgument):
            fast.attend(0, [(b, q, None, k[0], v[0]), (b, q, None, k[0], v[0])])
        assert fast.append(b, 0, k[0], v[0]) == 2 * BS + 9 + 10 + 1


def test_data_plane_puts_and_dense_gets_match_grpc(client, server, rng):
    m = client.register_model(unique(), num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                              cache_dtype="k4v4")
    via_grpc, via_dp = hashes(unique("g"), 6), hashes(unique("d"), 6)
    data = [kv(rng, L, BS, H, D) for _ in range(6)]
    client.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(via_grpc, data)])
    with tqkv.DataPlane(server.data_address) as dp:
        # Dense blocks in frames of ~2 blocks; the same bytes as the gRPC put.
        frame = 2 * 2 * L * BS * H * D * 2
        r = dp.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(via_dp, data)], frame_bytes=frame)
        assert (r.committed, r.already_present) == (6, 0)
        want = client.get_blocks(m, via_grpc)
        assert [b.payload for b in dp.get_blocks(m, via_dp)] == [b.payload for b in want]
        # Packed, under new hashes.
        packed = hashes(unique("p"), 6)
        r = dp.put_blocks(m, [(h, b.payload) for h, b in zip(packed, want)])
        assert r.committed == 6
        assert [b.payload for b in dp.get_blocks(m, packed)] == [b.payload for b in want]
        # Dense reads: the gRPC path's arrays, fp16 and fp32, and a layer range.
        for dtype in ("fp16", "fp32"):
            ref = client.get_blocks(m, via_grpc[:3], dense=True, dtype=dtype)
            got = dp.get_blocks(m, via_grpc[:3], dense=True, dtype=dtype)
            for a, b in zip(got, ref):
                assert a.k.dtype == b.k.dtype and a.k.shape == b.k.shape == (L, BS, H, D)
                np.testing.assert_array_equal(a.k, b.k)
                np.testing.assert_array_equal(a.v, b.v)
        part = dp.get_blocks(m, via_grpc[:2], dense=True, first_layer=1)
        assert part[0].k.shape == (L - 1, BS, H, D)
        # A bad block fails the stream: nothing of it is stored, and the
        # connection serves the next call.
        bad = hashes(unique("bad"), 3)
        k, v = data[0]
        blocks = [tqkv.Block(bad[0], k=k, v=v), tqkv.Block(bad[1], k=k[:, :, :1], v=v), tqkv.Block(bad[2], k=k, v=v)]
        with pytest.raises(tqkv.InvalidArgument):
            dp.put_blocks(m, blocks, frame_bytes=1)
        assert client.lookup(m, bad[:1]).hits == 0
        assert len(dp.get_blocks(m, via_dp)) == 6


def test_client_puts_and_reads_dense_over_the_data_plane(client, server, rng):
    m = client.register_model(unique(), num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                              cache_dtype="k4v4")
    a, b = hashes(unique("a"), 4), hashes(unique("b"), 4)
    data = [kv(rng, L, BS, H, D) for _ in range(4)]
    client.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(a, data)])
    with tqkv.Client(server.address, timeout=60, data_address=server.data_address) as fast:
        r = fast.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(b, data)])
        assert r.committed == 4
        assert [x.payload for x in fast.get_blocks(m, b)] == [x.payload for x in client.get_blocks(m, a)]
        got = fast.get_blocks(m, b, dense=True, dtype="fp32")
        want = client.get_blocks(m, a, dense=True, dtype="fp32")
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x.k, y.k)
            np.testing.assert_array_equal(x.v, y.v)


def test_device_calls_need_the_data_plane(server):
    with tqkv.Client(server.address, timeout=30) as c:
        with pytest.raises(tqkv.FailedPrecondition, match="needs the data plane"):
            c.put_blocks_device(None, [b"h"], None, [0])
        with pytest.raises(tqkv.FailedPrecondition, match="needs the data plane"):
            c.get_blocks_device(None, [b"h"], None, [0])


def test_unix_socket_serves_what_tcp_serves(rng):
    """A server with --data_socket: Client and DataPlane on unix:PATH put,
    read and attend as over TCP."""
    import os
    import shutil
    import stat
    import tempfile
    from conftest import Server
    d = tempfile.mkdtemp(prefix="tqkv-sock-", dir="/tmp")  # a socket path holds 107 bytes
    path = os.path.join(d, "dp.sock")
    srv = Server(os.environ["TQKV_SERVER"], ["--data_socket", path])
    try:
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert os.lstat(path).st_mode & 0o777 == 0o600
        with tqkv.Client(srv.address, timeout=60, data_address="unix:" + path) as c:
            m = c.register_model(unique(), num_layers=L, num_kv_heads=H, head_dim=D, block_size=BS,
                                 cache_dtype="k4v4")
            hs = hashes(unique("u"), 4)
            data = [kv(rng, L, BS, H, D) for _ in range(4)]
            assert c.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(hs, data)]).committed == 4
            with tqkv.DataPlane(srv.data_address) as tcp:
                want = tcp.get_blocks(m, hs)
            assert [b.payload for b in c.get_blocks(m, hs)] == [b.payload for b in want]
            with tqkv.DataPlane("unix:" + path) as dp:
                assert [b.payload for b in dp.get_blocks(m, hs)] == [b.payload for b in want]
                with pytest.raises(tqkv.NotFound):
                    dp.get_blocks(m, [b"missing"])
            with tqkv.DataPlane("unix:" + path, reply_poll=0.001) as polled:  # sendmsg and poll as on TCP
                assert [b.payload for b in polled.get_blocks(m, hs)] == [b.payload for b in want]
            # Memory shared with the server: puts, reads (packed and dense)
            # and attend give what the socket gives.
            with tqkv.DataPlane("unix:" + path, shared_memory_bytes=8 << 20) as shm:
                hs2 = hashes(unique("shm"), 4)
                assert shm.put_blocks(m, [tqkv.Block(h, k=k, v=v) for h, (k, v) in zip(hs2, data)]).committed == 4
                assert [b.payload for b in shm.get_blocks(m, hs2)] == [b.payload for b in want]
                for a, b in zip(shm.get_blocks(m, hs, dense=True), c.get_blocks(m, hs, dense=True)):
                    assert np.array_equal(a.k, b.k) and np.array_equal(a.v, b.v)
                with pytest.raises(tqkv.NotFound):
                    shm.get_blocks(m, [b"missing"])
                q = rng.standard_normal((1, H, D)).astype(np.float16)
                with c.create_sequence(m, hs) as seq:
                    assert np.array_equal(shm.attend(1, [(seq, q)])[0], c.attend(1, [(seq, q)])[0])
            with tqkv.Client(srv.address, timeout=60, data_address="unix:" + path,
                             data_shared_memory_bytes=4 << 20) as cs:
                assert [b.payload for b in cs.get_blocks(m, hs)] == [b.payload for b in want]
        with pytest.raises(ValueError):
            tqkv.DataPlane("127.0.0.1:1", shared_memory_bytes=1 << 20)
        with pytest.raises(ValueError):
            tqkv.DataPlane("unix:" + path, tls=object())
    finally:
        srv.stop()
        removed = not os.path.exists(path)
        shutil.rmtree(d, ignore_errors=True)
    assert removed  # at shutdown
