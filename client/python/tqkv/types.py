"""Plain result types returned by `tqkv.Client` (no protobuf in user code)."""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ._proto import pb

TIER_NAMES = {pb.TIER_UNSPECIFIED: "unspecified", pb.TIER_GPU: "gpu",
              pb.TIER_HOST: "host", pb.TIER_DISK: "disk"}


@dataclass(frozen=True)
class LayerFormat:
    """Where one layer's pages sit in a packed block (offsets from block start)."""
    cache_dtype: str
    offset: int
    k_page_bytes: int
    v_page_bytes: int
    k_row_bytes: int
    v_row_bytes: int


@dataclass(frozen=True)
class Format:
    """A model's packed block layout: per layer a K page then a V page, each
    [block_size, num_kv_heads, row_bytes] (FormatDescriptor in the proto)."""
    layers: tuple
    block_bytes: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    bit_order: str

    @classmethod
    def from_proto(cls, f):
        return cls(
            layers=tuple(LayerFormat(l.cache_dtype, l.offset, l.k_page_bytes, l.v_page_bytes,
                                     l.k_row_bytes, l.v_row_bytes) for l in f.layers),
            block_bytes=f.block_bytes, block_size=f.block_size,
            num_kv_heads=f.num_kv_heads, head_dim=f.head_dim, bit_order=f.bit_order)

    def range_bytes(self, first_layer=0, last_layer=None):
        """Bytes of the layer range [first_layer, last_layer) of one block."""
        last = len(self.layers) if not last_layer else last_layer
        return sum(l.k_page_bytes + l.v_page_bytes for l in self.layers[first_layer:last])

    def pages(self, payload, first_layer=0, last_layer=None):
        """Splits a packed payload of layers [first_layer, last_layer) into a
        list of (k_page, v_page) uint8 arrays [block_size, num_kv_heads, row]
        (views of `payload`, no copy)."""
        last = len(self.layers) if not last_layer else last_layer
        buf = np.frombuffer(payload, dtype=np.uint8)
        if buf.size != self.range_bytes(first_layer, last):
            raise ValueError(f"payload has {buf.size} bytes, layers [{first_layer}, {last}) "
                             f"need {self.range_bytes(first_layer, last)}")
        base = self.layers[first_layer].offset if last > first_layer else 0
        out = []
        rows = self.block_size * self.num_kv_heads
        for l in self.layers[first_layer:last]:
            k0 = l.offset - base
            k = buf[k0:k0 + l.k_page_bytes]
            v = buf[k0 + l.k_page_bytes:k0 + l.k_page_bytes + l.v_page_bytes]
            out.append((k.reshape(self.block_size, self.num_kv_heads, l.k_page_bytes // rows),
                        v.reshape(self.block_size, self.num_kv_heads, l.v_page_bytes // rows)))
        return out


@dataclass(frozen=True)
class Model:
    """A registered model: pass it to every data call."""
    model_id: int
    fingerprint: str
    format: Format
    created: bool
    name: str = ""
    num_layers: int = 0
    num_kv_heads: int = 0
    num_q_heads: int = 0
    head_dim: int = 0
    block_size: int = 0

    def ref(self):
        return pb.ModelRef(model_id=self.model_id, layout_fingerprint=self.fingerprint)


@dataclass
class Block:
    """One block to put: dense `k`/`v` ([layers, tokens, kv_heads, d]; numpy
    fp16/fp32/uint16-as-bf16 or torch) or packed `payload` bytes."""
    hash: bytes
    k: object = None
    v: object = None
    payload: Optional[bytes] = None
    parent: bytes = b""


@dataclass(frozen=True)
class PutResult:
    committed: int
    already_present: int
    staged: int
    packed_bytes: int
    dense_equivalent_bytes: int


@dataclass(frozen=True)
class LookupResult:
    hits: int                # consecutive leading hits
    tiers: List[str]         # "gpu" / "host" / "disk" per hit


@dataclass
class BlockData:
    """One block returned by get_blocks: `payload` (packed, with `format`) or
    dense `k`/`v` [layers, block_size, kv_heads, d]."""
    hash: bytes
    tier: str
    payload: Optional[bytes] = None
    format: Optional[Format] = None
    k: object = None
    v: object = None


@dataclass(frozen=True)
class TierBytes:
    blocks: int
    bytes: int
    dense_equivalent_bytes: int
    packed_k_bytes: int
    packed_v_bytes: int
    norms_metadata_bytes: int
    dense_window_bytes: int


@dataclass(frozen=True)
class ModelStats:
    model_id: int
    model_name: str
    compression_ratio: float
    # tier name -> TierBytes. A block read back from disk is promoted to host
    # and counts in both tiers until one copy goes.
    tiers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Stats:
    tenant: str
    backend: str
    models: List[ModelStats]
    data_plane_address: str = ""  # as bound; "" when the data plane is off

    def model(self, model_id):
        for m in self.models:
            if m.model_id == model_id:
                return m
        raise KeyError(model_id)

    @classmethod
    def from_proto(cls, r):
        models = []
        for m in r.models:
            tiers = {TIER_NAMES.get(t.tier, str(t.tier)): TierBytes(
                t.blocks, t.bytes, t.dense_equivalent_bytes, t.packed_k_bytes,
                t.packed_v_bytes, t.norms_metadata_bytes, t.dense_window_bytes) for t in m.tiers}
            models.append(ModelStats(m.model_id, m.model_name, m.compression_ratio, tiers))
        return cls(r.tenant, r.backend, models, r.data_plane_address)


@dataclass(frozen=True)
class ModelInfo:
    """A registered model as `Client.list_models` reports it: `model` works in
    every data call; the stored blocks (each once), their bytes and the
    model's live decode sequences."""
    model: Model
    blocks: int
    bytes: int
    sequences: int

    @classmethod
    def from_proto(cls, m):
        lay = m.registration.layout
        model = Model(model_id=m.model_id, fingerprint=m.layout_fingerprint,
                      format=Format.from_proto(m.format), created=False, name=m.model_name,
                      num_layers=lay.num_layers, num_kv_heads=lay.num_kv_heads,
                      num_q_heads=lay.num_q_heads, head_dim=lay.head_dim,
                      block_size=lay.block_size)
        return cls(model, m.blocks, m.bytes, m.sequences)


@dataclass(frozen=True)
class UnregisterResult:
    """What a forced unregistration removed."""
    blocks: int
    bytes: int
    sequences: int
    staged: int


@dataclass(frozen=True)
class EvictResult:
    blocks: int
    bytes: int
