"""Request building shared by the gRPC client (client.py) and the data plane
(data_plane.py): block hashes, model references, sequence handles, Attend
and Append requests, put blocks with their data inside or beside them."""
from . import errors
from . import tensors
from ._proto import pb
from .types import Block, Model


def _hash_bytes(h):
    if isinstance(h, str):
        return h.encode()
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h)
    raise TypeError(f"block hash must be bytes or str, got {type(h).__name__}")


def _hashes(hs):
    if isinstance(hs, (bytes, str)):
        hs = [hs]
    return [_hash_bytes(h) for h in hs]


def model_ref(model):
    """The ModelRef of a Model, a pb.ModelRef or a (model_id, fingerprint) pair."""
    if isinstance(model, Model):
        return model.ref()
    if isinstance(model, pb.ModelRef):
        return model
    model_id, fingerprint = model
    return pb.ModelRef(model_id=model_id, layout_fingerprint=fingerprint)


class Sequence:
    """Handle of a server-side decode sequence; `with` drops it on exit."""

    def __init__(self, client, sequence_id, num_tokens):
        self.client = client
        self.id = sequence_id
        self.num_tokens = num_tokens

    def append(self, layer, k, v):
        return self.client.append(self.id, layer, k, v)

    def attend(self, layer, q, positions=None, scale=0.0):
        return self.client.attend(layer, [(self.id, q, positions)], scale)[0]

    def append_attend(self, layer, k, v, q, scale=0.0):
        """A decode worker's step at one layer: appends the new tokens' k, v
        ([tokens, kv_heads, d]) and attends q at the last token, in one call."""
        return self.client.attend(layer, [(self.id, q, None, k, v)], scale)[0]

    def drop(self):
        self.client.drop_sequence(self.id)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.drop()
        except errors.NotFound:
            pass

    def __repr__(self):
        return f"Sequence({self.id!r}, num_tokens={self.num_tokens})"


def _seq_id(s):
    return s.id if isinstance(s, Sequence) else str(s)


def _append_request(sequence_id, layer, k, v):
    return pb.AppendRequest(sequence_id=_seq_id(sequence_id), layer=layer, k=tensors.to_proto(k),
                            v=tensors.to_proto(v))


def _attend_request(layer, items, scale):
    """AttendRequest of Client.attend's arguments, and the items' queries."""
    req = pb.AttendRequest(layer=layer, scale=scale)
    queries = []
    for item in items:
        seq, q = item[0], item[1]
        positions = item[2] if len(item) > 2 and item[2] is not None else ()
        msg = pb.AttendItem(sequence_id=_seq_id(seq), q=tensors.to_proto(q),
                            positions=[int(p) for p in positions])
        if len(item) > 3:
            if len(item) != 5:
                raise ValueError("an attend item with new tokens is (sequence, q, positions, k, v)")
            msg.k.CopyFrom(tensors.to_proto(item[3]))
            msg.v.CopyFrom(tensors.to_proto(item[4]))
        req.items.append(msg)
        queries.append(q)
    return req, queries


def _attend_outputs(resp, queries, return_kernel_micros):
    """The outputs as numpy arrays, or torch tensors on q's device where q was torch."""
    outs = [tensors.on_device_of(tensors.from_proto(t, as_torch=tensors.is_torch(q)), q)
            for t, q in zip(resp.outputs, queries)]
    return (outs, resp.kernel_micros) if return_kernel_micros else outs


def _as_block(x):
    if isinstance(x, Block):
        return x
    if isinstance(x, tuple):
        if len(x) == 2:
            return Block(_hash_bytes(x[0]), payload=x[1])
        if len(x) in (3, 4):
            return Block(_hash_bytes(x[0]), k=x[1], v=x[2],
                         parent=_hash_bytes(x[3]) if len(x) == 4 else b"")
    raise TypeError("blocks must be Block objects or (hash, k, v[, parent]) / "
                    "(hash, payload) tuples")


def _raw_block(b, packed, dtype):
    """(PutBlock without its data, [its data as memoryviews: the packed
    payload, or k then v]) of a Block; the data plane sends the views as the
    frame's raw payload."""
    if (b.payload is not None) != packed:
        raise ValueError("a put stream must be all packed or all dense blocks")
    msg = pb.PutBlock(block_hash=_hash_bytes(b.hash), parent_hash=_hash_bytes(b.parent or b""))
    if packed:
        return msg, [memoryview(b.payload)]
    if b.k is None or b.v is None:
        raise ValueError("a dense block needs both k and v")
    (tk, dk), (tv, dv) = tensors.to_raw(b.k, dtype), tensors.to_raw(b.v, dtype)
    msg.k.CopyFrom(tk)
    msg.v.CopyFrom(tv)
    return msg, [dk, dv]


def _block_proto(b, packed, dtype):
    """The PutBlock of a Block with its data inside (gRPC)."""
    msg, data = _raw_block(b, packed, dtype)
    if packed:
        msg.payload = bytes(data[0])
    else:
        msg.k.data, msg.v.data = bytes(data[0]), bytes(data[1])
    return msg
