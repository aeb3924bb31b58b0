"""Client-side conversions (no server)."""
import grpc
import numpy as np
import pytest

import tqkv
from tqkv import errors, tensors
from tqkv._proto import pb


def test_numpy_round_trip_each_dtype():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    for arr, wire in ((x.astype(np.float16), pb.DTYPE_FP16), (x, pb.DTYPE_FP32),
                      (tqkv.float32_to_bf16(x), pb.DTYPE_BF16)):
        t = tensors.to_proto(arr)
        assert t.dtype == wire and list(t.shape) == [2, 3, 4]
        back = tensors.from_proto(t)
        assert back.dtype == arr.dtype and np.array_equal(back, arr)


def test_conversion_on_send():
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    t = tensors.to_proto(x, dtype="fp16")
    assert t.dtype == pb.DTYPE_FP16
    assert np.array_equal(tensors.from_proto(t), x.astype(np.float16))
    t = tensors.to_proto(x, dtype="bf16")
    got = tqkv.bf16_to_float32(tensors.from_proto(t))
    assert np.allclose(got, x, rtol=2 ** -8)


def test_bf16_rounding_is_nearest_even():
    # 1 + 2^-8 is exactly half way between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, np.inf, np.nan], np.float32)
    b = tqkv.float32_to_bf16(x)
    assert b[0] == 0x3F80 and b[1] == 0x3F80 and b[2] == 0x3F82
    back = tqkv.bf16_to_float32(b)
    assert back[3] == -2.5 and np.isinf(back[4]) and np.isnan(back[5])


def test_non_contiguous_and_big_endian_inputs():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)[:, ::2]
    assert np.array_equal(tensors.from_proto(tensors.to_proto(x)), x)
    be = np.arange(6, dtype=">f4")
    assert np.array_equal(tensors.from_proto(tensors.to_proto(be)), be.astype(np.float32))


def test_unsupported_dtypes_are_rejected():
    with pytest.raises(ValueError):
        tensors.to_proto(np.zeros(3, np.float64))
    with pytest.raises(ValueError):
        tensors.to_proto(np.zeros(3, np.int32))
    with pytest.raises(ValueError):
        tensors.parse_dtype("fp8")


def test_error_mapping_keeps_code_and_builtin_types():
    class FakeRpcError(grpc.RpcError):
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

        def details(self):
            return "bad thing"

    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT), "PutBlocks")
    assert isinstance(e, tqkv.InvalidArgument) and isinstance(e, ValueError)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "PutBlocks" in str(e)
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND))
    assert isinstance(e, KeyError) and str(e).startswith("NOT_FOUND")
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL))
    assert type(e) is tqkv.TqkvError and e.code == grpc.StatusCode.INTERNAL


def test_format_pages_split():
    f = pb.FormatDescriptor(block_bytes=2 * (16 * 2 * 68 * 2), block_size=16, num_kv_heads=2,
                            head_dim=128, bit_order="lsb-first")
    for i in range(2):
        f.layers.add(cache_dtype="k4v4", offset=i * 16 * 2 * 68 * 2, k_page_bytes=16 * 2 * 68,
                     v_page_bytes=16 * 2 * 68, k_row_bytes=68, v_row_bytes=68)
    fmt = tqkv.Format.from_proto(f)
    payload = bytes(range(256)) * (f.block_bytes // 256) + bytes(f.block_bytes % 256)
    pages = fmt.pages(payload)
    assert len(pages) == 2 and pages[1][0].shape == (16, 2, 68)
    assert pages[1][1].tobytes() == payload[f.block_bytes - 16 * 2 * 68:]
    one = fmt.pages(payload[fmt.layers[1].offset:], first_layer=1)
    assert np.array_equal(one[0][0], pages[1][0])
    with pytest.raises(ValueError):
        fmt.pages(payload[:-1])
