"""Conversions between numpy arrays / torch tensors and tqkv.v1.Tensor.

numpy has no bfloat16: bf16 data travels as np.uint16 bit patterns (the high
half of the fp32 bits). An array whose dtype is named "bfloat16" (ml_dtypes)
is sent as bf16 too. torch is optional: tensors are accepted and returned only
when torch imports, and only when the caller passed a tensor.
"""
import numpy as np

from ._proto import pb

try:  # optional dependency
    import torch  # type: ignore
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

FP16, BF16, FP32 = pb.DTYPE_FP16, pb.DTYPE_BF16, pb.DTYPE_FP32

_NAMES = {
    "fp16": FP16, "float16": FP16, "half": FP16,
    "bf16": BF16, "bfloat16": BF16,
    "fp32": FP32, "float32": FP32, "float": FP32,
}
# numpy dtype used to hold each wire dtype (bf16 as raw bits).
_NUMPY = {FP16: np.dtype(np.float16), BF16: np.dtype(np.uint16), FP32: np.dtype(np.float32)}


def parse_dtype(dtype):
    """Returns the DType enum value for a name ("fp16", "bf16", "fp32", ...),
    an enum value, a numpy dtype or a torch dtype. ValueError otherwise."""
    if dtype is None:
        return FP16
    if isinstance(dtype, int) and dtype in _NUMPY:
        return dtype
    if isinstance(dtype, str):
        if dtype.lower() in _NAMES:
            return _NAMES[dtype.lower()]
        raise ValueError(f"unknown dtype {dtype!r}; use fp16, bf16 or fp32")
    if torch is not None and isinstance(dtype, torch.dtype):
        return _torch_wire_dtype(dtype)
    return _numpy_wire_dtype(np.dtype(dtype))


def numpy_dtype(dtype):
    """The numpy dtype that holds wire dtype `dtype` (np.uint16 for bf16)."""
    return _NUMPY[parse_dtype(dtype)]


def _numpy_wire_dtype(dt):
    if dt.name == "bfloat16":
        return BF16
    kind = (dt.kind, dt.itemsize)  # byte order does not matter here
    if kind == ("f", 2):
        return FP16
    if kind == ("f", 4):
        return FP32
    if kind == ("u", 2):
        return BF16
    raise ValueError(f"unsupported array dtype {dt}; use float16, float32 or "
                     "uint16 (bf16 bit patterns)")


def _torch_wire_dtype(dt):
    m = {torch.float16: FP16, torch.bfloat16: BF16, torch.float32: FP32}
    if dt not in m:
        raise ValueError(f"unsupported tensor dtype {dt}; use float16, bfloat16 or float32")
    return m[dt]


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda(x):
    return is_torch(x) and x.is_cuda


def on_device_of(out, q):
    """An Attend output `out` (host array or tensor) on CUDA query q's device;
    as it is for any other q."""
    return out.to(q.device) if is_cuda(q) else out


def _as_numpy(x):
    """(array, wire dtype) for a numpy array, array-like or torch tensor."""
    if is_torch(x):
        wire = _torch_wire_dtype(x.dtype)
        t = x.detach().to("cpu").contiguous()
        if wire == BF16:
            return t.view(torch.int16).numpy().view(np.uint16), wire
        return t.numpy(), wire
    a = np.asarray(x)
    wire = _numpy_wire_dtype(a.dtype)
    if a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return a, wire


def to_proto(x, dtype=None):
    """Packs `x` into a tqkv.v1.Tensor.

    `dtype` (optional) converts float arrays first: e.g. a float32 array with
    dtype="fp16" is sent as fp16, with dtype="bf16" rounded to bf16. Without
    it the array's own dtype decides (uint16 means bf16 bits).
    """
    a, wire = _wire_array(x, dtype)
    return pb.Tensor(dtype=wire, shape=list(a.shape), data=a.tobytes())


def to_raw(x, dtype=None):
    """(tqkv.v1.Tensor with dtype and shape only, its bytes as a flat
    memoryview) for a raw payload (DataPlane): the bytes of
    to_proto(x, dtype).data, viewed in place where `x` is already
    contiguous little-endian in that dtype."""
    a, wire = _wire_array(x, dtype)
    return pb.Tensor(dtype=wire, shape=list(a.shape)), memoryview(a.reshape(-1)).cast("B")


def _wire_array(x, dtype):
    """(contiguous little-endian array, wire dtype) of `x` as to_proto sends it."""
    a, wire = _as_numpy(x)
    if dtype is not None:
        want = parse_dtype(dtype)
        if want != wire:
            f32 = bf16_to_float32(a) if wire == BF16 else a.astype(np.float32)
            a = float32_to_bf16(f32) if want == BF16 else f32.astype(_NUMPY[want])
            wire = want
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a, wire


def from_raw(t, buf, as_torch=False):
    """The array of a raw output: `t` (dtype and shape) over `buf`, a
    writable numpy uint8 array of exactly its bytes (no copy; bf16 as
    uint16, or torch.bfloat16 with as_torch)."""
    if t.dtype not in _NUMPY:
        raise ValueError(f"tensor has unsupported dtype {t.dtype}")
    a = buf.view(_NUMPY[t.dtype]).reshape(tuple(t.shape))
    if not as_torch:
        return a
    if torch is None:
        raise RuntimeError("torch is not importable")
    if t.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_proto(t, as_torch=False):
    """Unpacks a tqkv.v1.Tensor into a numpy array (a read-only view of the
    message's bytes; bf16 as uint16) or, with as_torch, a torch tensor (a copy;
    bf16 as torch.bfloat16)."""
    if t.dtype not in _NUMPY:
        raise ValueError(f"tensor has unsupported dtype {t.dtype}")
    a = np.frombuffer(t.data, dtype=_NUMPY[t.dtype]).reshape(tuple(t.shape))
    if not as_torch:
        return a
    if torch is None:
        raise RuntimeError("torch is not importable")
    if t.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def bf16_to_float32(bits):
    """fp32 values of bf16 bit patterns (uint16 array)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x):
    """bf16 bit patterns (uint16) of fp32 values, round to nearest even;
    NaNs stay NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def to_float64(x):
    """float64 copy of a numpy array or torch tensor (uint16 read as bf16)."""
    a, wire = _as_numpy(x)
    if wire == BF16:
        return bf16_to_float32(a).astype(np.float64)
    return a.astype(np.float64)
