"""tqkv: Python client for the tqkv GPU-resident KV-cache store.

    import tqkv
    with tqkv.Client("127.0.0.1:7070") as c:
        m = c.register_model("llama", num_layers=32, num_kv_heads=8, head_dim=128,
                             block_size=16, cache_dtype="k4v4")
        c.put_blocks(m, [tqkv.Block(b"h0", k=k0, v=v0)])   # k0: [32, 16, 8, 128] fp16
        c.lookup(m, [b"h0", b"h1"]).hits                   # 1
        c.get_blocks(m, [b"h0"], dense=True)[0].k           # dequantized fp16
"""
from .client import Client, Sequence, tls_credentials
from .cuda_ipc import DeviceKv
from .data_plane import DataPlane, data_plane_tls
from .errors import (Aborted, AlreadyExists, DataLoss, DeadlineExceeded, FailedPrecondition,
                     InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, TqkvError,
                     Unauthenticated, Unavailable)
from .tensors import bf16_to_float32, float32_to_bf16
from .layerwise import LayerwiseLoader, LayerwiseSaver
from .sharded import ShardedClient
from .types import (Block, BlockData, EvictResult, Format, LayerFormat, LookupResult, Model,
                    ModelInfo, ModelStats, PutResult, Stats, TierBytes, UnregisterResult)

__all__ = [
    "Client", "Sequence", "DataPlane", "Block", "BlockData", "EvictResult", "Format", "LayerFormat",
    "LookupResult", "Model", "ModelInfo", "ModelStats", "PutResult", "Stats", "TierBytes",
    "UnregisterResult",
    "TqkvError", "InvalidArgument", "NotFound", "FailedPrecondition", "AlreadyExists",
    "ResourceExhausted", "DataLoss", "Unavailable", "Unauthenticated", "PermissionDenied",
    "DeadlineExceeded", "Aborted", "bf16_to_float32", "float32_to_bf16",
    "LayerwiseLoader", "LayerwiseSaver", "tls_credentials", "data_plane_tls",
]
__all__ += ["ShardedClient", "DeviceKv"]
