"""Status codes for bad input, as exceptions that carry the gRPC code."""
import grpc
import numpy as np
import pytest

import tqkv
from helpers import kv, unique

L, H, D, BS = 2, 2, 64, 8


@pytest.fixture
def model(client):
    return client.register_model(unique(), num_layers=L, num_kv_heads=H, head_dim=D,
                                 block_size=BS, cache_dtype="tq4")


def test_stale_fingerprint_is_failed_precondition_and_returns_nothing(client, model, rng):
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(model, [(b"x", k, v)])
    stale = (model.model_id, "0" * 32)
    for call in (lambda: client.get_blocks(stale, [b"x"]),
                 lambda: client.lookup(stale, [b"x"]),
                 lambda: client.put_blocks(stale, [(b"y", k, v)])):
        with pytest.raises(tqkv.FailedPrecondition) as e:
            call()
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert client.lookup(model, [b"y"]).hits == 0


def test_unknown_model_and_zero_id(client, model):
    with pytest.raises(tqkv.NotFound):
        client.lookup((model.model_id ^ 1, model.fingerprint), [b"x"])
    with pytest.raises(tqkv.InvalidArgument):
        client.lookup((0, model.fingerprint), [b"x"])


def test_bad_layouts_and_cache_dtypes(client):
    with pytest.raises(tqkv.InvalidArgument):
        client.register_model(unique(), num_layers=2, num_kv_heads=2, head_dim=64,
                              block_size=8, cache_dtype="k7v7")
    with pytest.raises(tqkv.InvalidArgument):
        client.register_model(unique(), num_layers=0, num_kv_heads=2, head_dim=64, block_size=8)
    with pytest.raises(tqkv.InvalidArgument):
        client.register_model(unique(), num_layers=2, num_kv_heads=2, num_q_heads=3,
                              head_dim=64, block_size=8)


def test_bad_shape_fails_the_whole_stream(client, model, rng):
    k, v = kv(rng, L, BS, H, D)
    bad_k = np.zeros((L, BS, H, D + 1), np.float16)
    with pytest.raises(tqkv.InvalidArgument) as e:
        client.put_blocks(model, [(b"good", k, v), (b"bad", bad_k, bad_k)])
    assert isinstance(e.value, ValueError) and e.value.details
    assert client.lookup(model, [b"good"]).hits == 0  # two-phase: nothing committed
    with pytest.raises(tqkv.InvalidArgument):  # too many tokens
        big_k, big_v = kv(rng, L, BS + 1, H, D)
        client.put_blocks(model, [(b"big", big_k, big_v)])
    with pytest.raises(tqkv.InvalidArgument):  # k and v disagree
        client.put_blocks(model, [(b"kv", k, v[:, :BS - 1])])


def test_bad_hashes(client, model, rng):
    k, v = kv(rng, L, BS, H, D)
    for h in (b"", b"x" * 65):
        with pytest.raises(tqkv.InvalidArgument):
            client.put_blocks(model, [(h, k, v)])
        with pytest.raises(tqkv.InvalidArgument):
            client.lookup(model, [h])
    client.put_blocks(model, [(b"x" * 64, k, v)])  # 64 bytes is the limit, inclusive
    with pytest.raises(tqkv.InvalidArgument):
        client.get_blocks(model, [b"x" * 64, b"x" * 64])  # duplicates


def test_wrong_packed_size_and_conflicting_bytes(client, model, rng):
    k, v = kv(rng, L, BS, H, D)
    client.put_blocks(model, [(b"p", k, v)])
    payload = client.get_blocks(model, [b"p"])[0].payload
    with pytest.raises(tqkv.InvalidArgument):
        client.put_blocks(model, [(b"q", payload[:-1])])
    other = bytearray(payload)
    other[0] ^= 0xFF
    with pytest.raises(tqkv.AlreadyExists):
        client.put_blocks(model, [(b"p", bytes(other))])
    assert client.get_blocks(model, [b"p"])[0].payload == payload


def test_missing_block_and_sequence(client, model):
    with pytest.raises(tqkv.NotFound) as e:
        client.get_blocks(model, [b"never-stored"])
    assert e.value.code == grpc.StatusCode.NOT_FOUND and isinstance(e.value, KeyError)
    with pytest.raises(tqkv.NotFound):
        client.attend(0, [("no-such-sequence", np.zeros((1, H, D), np.float16))])
    with pytest.raises(tqkv.NotFound):
        client.drop_sequence("no-such-sequence")


def test_bad_layer_range(client, model):
    with pytest.raises(tqkv.InvalidArgument):
        client.get_blocks(model, [b"p"], first_layer=1, last_layer=1)
    with pytest.raises(tqkv.InvalidArgument):
        client.get_blocks(model, [b"p"], first_layer=0, last_layer=L + 1)


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "try again"


def test_unavailable_is_retried_with_backoff(client, model):
    c = tqkv.Client(client.address, retries=3, backoff_s=0.001)
    real = c._kv.Lookup
    calls = []

    def flaky(req, **kw):
        calls.append(1)
        if len(calls) <= 2:
            raise _Unavailable()
        return real(req, **kw)

    c._kv.Lookup = flaky
    assert c.lookup(model, [b"nothing"]).hits == 0
    assert len(calls) == 3

    calls.clear()
    c._kv.Lookup = lambda req, **kw: (calls.append(1), (_ for _ in ()).throw(_Unavailable()))[1]
    with pytest.raises(tqkv.Unavailable) as e:
        c.lookup(model, [b"nothing"])
    assert len(calls) == 4 and e.value.code == grpc.StatusCode.UNAVAILABLE
    c.close()


def test_append_is_not_retried(client):
    c = tqkv.Client(client.address, retries=3, backoff_s=0.001)
    calls = []

    def down(req, **kw):
        calls.append(1)
        raise _Unavailable()

    c._kv.Append = down
    with pytest.raises(tqkv.Unavailable):
        c.append("seq", 0, np.zeros((1, H, D), np.float16), np.zeros((1, H, D), np.float16))
    assert len(calls) == 1
    c.close()


def test_unreachable_server_is_unavailable():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    with tqkv.Client(f"127.0.0.1:{port}", timeout=2, retries=1, backoff_s=0.01) as c:
        with pytest.raises(tqkv.Unavailable):
            c.stats()
