"""CUDA torch tensors as Attend inputs: the outputs come back on the query's
device and equal, bit for bit, the outputs of the same tensors sent from the
host, over gRPC and the data plane, with new tokens appended in the same call,
for fp16, bf16 and fp32 queries, non-contiguous ones, and a call mixing host
and CUDA items. The server's backend does not matter (the CPU one here).

Skipped without torch and a CUDA device; on the GPU machine:
    dist/hf_xz/env.sh python3 -m pytest -s client/python/tests/test_cuda_tensors.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import tqkv  # noqa: E402
from helpers import hashes, unique  # noqa: E402

LAYERS, HEADS, QHEADS, DIM, BS = 2, 2, 4, 64, 16


@pytest.fixture(params=["grpc", "data"])
def cli(request, server):
    c = tqkv.Client(server.address, timeout=60, data_address="auto" if request.param == "data" else None)
    c.wait_ready(30)
    yield c
    c.close()


def sequences(c, seed, count=2):
    """`count` sequences in the same state: the same 3 stored blocks (fp16
    K/V) and the same 5 tokens appended at each layer."""
    m = c.register_model(unique("cuda-in"), num_layers=LAYERS, num_kv_heads=HEADS, num_q_heads=QHEADS,
                         head_dim=DIM, block_size=BS, cache_dtype="k4v4")
    g = torch.Generator().manual_seed(seed)
    names = hashes(unique("h"), 3)
    c.put_blocks(m, [tqkv.Block(h, k=torch.randn(LAYERS, BS, HEADS, DIM, generator=g).half().numpy(),
                                v=torch.randn(LAYERS, BS, HEADS, DIM, generator=g).half().numpy())
                     for h in names])
    tails = [(torch.randn(5, HEADS, DIM, generator=g).half().numpy(),
              torch.randn(5, HEADS, DIM, generator=g).half().numpy()) for _ in range(LAYERS)]
    seqs = []
    for _ in range(count):
        s = c.create_sequence(m, names)
        for layer, (k, v) in enumerate(tails):
            c.append(s, layer, k, v)
        seqs.append(s)
    return seqs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_queries_match_host_queries(cli, dtype):
    a, b = sequences(cli, 1)
    q = torch.randn(3, QHEADS, DIM, dtype=torch.float32).to(dtype)
    want = cli.attend(1, [(a, q, [10, 30, 52])])[0]
    got = cli.attend(1, [(a, q.cuda(), [10, 30, 52])])[0]
    assert got.device.type == "cuda" and got.dtype == dtype and got.shape == q.shape
    assert torch.equal(got.cpu(), want)
    # A non-contiguous CUDA query (every other head of a wider tensor).
    wide = torch.randn(1, 2 * QHEADS, DIM, dtype=torch.float32).to(dtype)
    want = cli.attend(0, [(b, wide[:, ::2].contiguous())])[0]
    got = cli.attend(0, [(b, wide.cuda()[:, ::2])])[0]
    assert torch.equal(got.cpu(), want)


def test_append_and_attend_from_cuda_equals_the_host_call(cli):
    ha, hb = sequences(cli, 2)  # two sequences in the same state
    g = torch.Generator().manual_seed(7)
    for step in range(3):
        q = torch.randn(1, QHEADS, DIM, generator=g).half()
        k, v = torch.randn(1, HEADS, DIM, generator=g).half(), torch.randn(1, HEADS, DIM, generator=g).half()
        for layer in range(LAYERS):
            want = cli.attend(layer, [(ha, q, None, k, v)])[0]
            got = cli.attend(layer, [(hb, q.cuda(), None, k.cuda(), v.cuda())])[0]
            assert got.is_cuda and torch.equal(got.cpu(), want), (step, layer)


def test_a_call_mixing_host_and_cuda_items(cli):
    a, b = sequences(cli, 3)
    qa = torch.randn(2, QHEADS, DIM).half()
    qb = np.random.default_rng(4).standard_normal((1, QHEADS, DIM)).astype(np.float32)
    wa, wb = cli.attend(0, [(a, qa, [0, 40]), (b, qb)])
    ga, gb = cli.attend(0, [(a, qa.cuda(), [0, 40]), (b, qb)])
    assert ga.is_cuda and torch.equal(ga.cpu(), wa)
    assert isinstance(gb, np.ndarray) and np.array_equal(gb, wb)


def test_outputs_are_ordered_on_the_current_stream(cli):
    """A consumer on the current stream sees the output without a sync."""
    (a,) = sequences(cli, 5, count=1)
    q = torch.randn(1, QHEADS, DIM).half().cuda()
    want = cli.attend(0, [(a, q.cpu())])[0]
    total = torch.zeros((), dtype=torch.float64, device="cuda")
    for _ in range(20):
        total += cli.attend(0, [(a, q)])[0].double().sum()
    assert total.item() == pytest.approx(20 * want.double().sum().item(), rel=1e-12)
