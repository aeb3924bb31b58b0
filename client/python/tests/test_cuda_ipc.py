"""Same-host K/V in GPU memory (tqkv.DeviceKv over torch CUDA tensors) against
a `--backend cuda` server (its host tier on the heap, then pinned): device
puts store the bytes that a put of the same tensors over the wire stores
(paged NHD and HND caches, a contiguous tensor, fp16 and bf16, partial
blocks, a layer range); device gets write what dense
gets return into exactly the named slots; a CPU-backend server makes both
fall back to the wire with the same results, or refuse with
FailedPrecondition when asked not to fall back.

Skipped without torch and a CUDA device; on the GPU machine:
    dist/hf_xz/env.sh python3 -m pytest -s client/python/tests/test_cuda_ipc.py
"""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import tqkv  # noqa: E402
from helpers import hashes, unique  # noqa: E402

LAYERS, HEADS, QHEADS, DIM, BS, SLOTS = 4, 8, 32, 128, 16, 10


@pytest.fixture(scope="module", params=["heap", "pinned"])
def cuda_server(request):
    """A CUDA server whose host tier is on the heap, then one whose host
    tier is pinned for DMA (--pin_host_tier: blocks go between it and the
    GPU without staging), once it reports the pinning done."""
    from conftest import Server
    pinned = request.param == "pinned"
    s = Server(os.environ["TQKV_SERVER"], ["--backend", "cuda", f"--pin_host_tier={str(pinned).lower()}"])
    deadline = time.time() + 60
    while pinned and not any("host tier pinned for DMA" in line for line in list(s.lines)):
        if time.time() > deadline:
            s.stop()
            pytest.fail("the server did not pin its host tier:\n" + "\n".join(s.lines))
        time.sleep(0.1)
    yield s
    s.stop()


def register(c):
    return c.register_model(unique("ipc"), num_layers=LAYERS, num_kv_heads=HEADS, num_q_heads=QHEADS,
                            head_dim=DIM, block_size=BS, cache_dtype="k4v4")


def cache(layout, dtype, seed):
    """Per layer K and V caches of SLOTS blocks, random, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one():
        if layout == "nhd":
            return torch.randn(SLOTS, BS, HEADS, DIM, generator=g, device="cuda").to(dtype)
        if layout == "hnd":  # [blocks, heads, block_size, d] in memory
            return torch.randn(SLOTS, HEADS, BS, DIM, generator=g, device="cuda").to(dtype).permute(0, 2, 1, 3)
        return torch.randn(SLOTS * BS, HEADS, DIM, generator=g, device="cuda").to(dtype)

    k, v = [one() for _ in range(LAYERS)], [one() for _ in range(LAYERS)]
    if layout == "contiguous":
        return tqkv.DeviceKv.contiguous(k, v, BS)
    return tqkv.DeviceKv.paged(k, v)


def wire_blocks(kv, names, slots, tokens, first, last):
    return [tqkv.Block(h, k=kv.block(kv.k_layers[first:last], s, t).cpu(), v=kv.block(kv.v_layers[first:last], s, t).cpu())
            for h, s, t in zip(names, slots, tokens)]


@pytest.mark.parametrize("layout,dtype,first,last", [
    ("nhd", torch.float16, 0, LAYERS), ("hnd", torch.float16, 0, LAYERS),
    ("contiguous", torch.bfloat16, 0, LAYERS), ("nhd", torch.bfloat16, 1, 3)])
def test_device_puts_store_the_bytes_of_wire_puts(cuda_server, layout, dtype, first, last):
    with tqkv.Client(cuda_server.address, timeout=60) as c, tqkv.DataPlane(cuda_server.data_address) as dp:
        m, ref = register(c), register(c)
        kv = cache(layout, dtype, seed=len(layout) + first)
        if (first, last) != (0, LAYERS):  # a layer-range put names only its layers
            kv = (tqkv.DeviceKv.paged if layout != "contiguous" else
                  lambda k, v: tqkv.DeviceKv.contiguous(k, v, BS))(kv.k_layers[first:last], kv.v_layers[first:last])
        names, slots, tokens = hashes("ipc", 4), [7, 2, 9, 0], [BS, BS, 11, 1]
        r = dp.put_blocks_device(m, names, kv, slots, tokens=tokens, first_layer=first, last_layer=last,
                                 fallback=False)
        assert (r.committed, r.staged) == ((4, 0) if (first, last) == (0, LAYERS) else (0, 4))
        dp.put_blocks(ref, wire_blocks(kv, names, slots, tokens, 0, last - first), first_layer=first,
                      last_layer=last)
        if (first, last) != (0, LAYERS):
            return  # staged parts are not readable; their bytes are compared through the whole-model cases
        got = [b.payload for b in dp.get_blocks(m, names)]
        want = [b.payload for b in dp.get_blocks(ref, names)]
        assert got == want


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_device_gets_write_the_dense_blocks_into_their_slots(cuda_server, dtype):
    with tqkv.Client(cuda_server.address, timeout=60) as c, tqkv.DataPlane(cuda_server.data_address) as dp:
        m = register(c)
        src = cache("nhd", torch.float16, seed=3)
        names = hashes("ipcget", 3)
        dp.put_blocks_device(m, names, src, [0, 1, 2], fallback=False)
        k = [torch.zeros(SLOTS, BS, HEADS, DIM, dtype=dtype, device="cuda") for _ in range(LAYERS)]
        v = [torch.zeros(SLOTS, BS, HEADS, DIM, dtype=dtype, device="cuda") for _ in range(LAYERS)]
        out = tqkv.DeviceKv.paged(k, v)
        slots = [5, 9, 0]
        got = dp.get_blocks_device(m, names, out, slots, fallback=False)
        assert [b.hash for b in got] == names
        dense = dp.get_blocks(m, names, dense=True, dtype="fp16" if dtype == torch.float16 else "fp32",
                              as_torch=True)
        for b, s in zip(dense, slots):
            assert torch.equal(out.block(k, s, BS).cpu(), b.k)
            assert torch.equal(out.block(v, s, BS).cpu(), b.v)
        untouched = [s for s in range(SLOTS) if s not in slots]
        assert all(float(t[untouched].abs().max()) == 0 for t in k + v)


def test_the_client_sends_device_blocks_over_its_data_plane(cuda_server):
    with tqkv.Client(cuda_server.address, timeout=60, data_address=cuda_server.data_address) as c:
        m = register(c)
        kv = cache("nhd", torch.float16, seed=5)
        names = hashes("ipcclient", 2)
        assert c.put_blocks_device(m, names, kv, [3, 4], fallback=False).committed == 2
        assert c.lookup(m, names).hits == 2
        out = tqkv.DeviceKv.paged([torch.zeros_like(x) for x in kv.k_layers], [torch.zeros_like(x) for x in kv.v_layers])
        c.get_blocks_device(m, names, out, [0, 1], fallback=False)
        dense = c.get_blocks(m, names, dense=True, as_torch=True)
        assert torch.equal(out.block(out.k_layers, 1, BS).cpu(), dense[1].k)


def test_a_cpu_server_falls_back_to_the_wire(server, cuda_server):
    with tqkv.Client(server.address, timeout=60) as c, tqkv.DataPlane(server.data_address) as dp:
        m = register(c)
        kv = cache("nhd", torch.float16, seed=9)
        names = hashes("ipcfb", 3)
        with pytest.raises(tqkv.FailedPrecondition, match="cpu backend"):
            dp.put_blocks_device(m, names, kv, [1, 2, 3], fallback=False)
        assert c.lookup(m, names).hits == 0
        r = dp.put_blocks_device(m, names, kv, [1, 2, 3], tokens=[BS, BS, 5])
        assert r.committed == 3
        with tqkv.Client(cuda_server.address, timeout=60) as gc, tqkv.DataPlane(cuda_server.data_address) as gdp:
            gm = register(gc)
            gdp.put_blocks_device(gm, names, kv, [1, 2, 3], tokens=[BS, BS, 5], fallback=False)
            assert [b.payload for b in dp.get_blocks(m, names)] == [b.payload for b in gdp.get_blocks(gm, names)]
        k = [torch.zeros(SLOTS, BS, HEADS, DIM, dtype=torch.float16, device="cuda") for _ in range(LAYERS)]
        out = tqkv.DeviceKv.paged(k, [torch.zeros_like(x) for x in k])
        dp.get_blocks_device(m, names[:2], out, [4, 6])
        dense = dp.get_blocks(m, names[:2], dense=True, as_torch=True)
        assert torch.equal(out.block(k, 4, BS).cpu(), dense[0].k)
        assert torch.equal(out.block(k, 6, BS).cpu(), dense[1].k)
        assert np.isclose(float(k[0][5].abs().max()), 0)
