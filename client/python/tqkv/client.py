"""`tqkv.Client`: a synchronous Python client for the tqkv.v1 gRPC service.

Thread safety: a Client may be shared by threads (gRPC channels are).
Retries: calls that are safe to repeat are retried with exponential backoff
and jitter when the server answers UNAVAILABLE (the contract's "retry the same
call"). Append is never retried (a repeat would append twice); a PutBlocks
stream is retried only when `blocks` is a sequence (a generator cannot be
replayed) - a failed stream commits nothing, so a replay is safe. A GetBlocks
stream that breaks with UNAVAILABLE resumes from the first block not yet
received.
"""
import collections.abc
import itertools
import random
import threading
import time

import grpc

from . import errors
from . import tensors
from ._proto import pb, pb_grpc
from .data_plane import DataPlane
from ._requests import (Sequence, _append_request, _as_block, _attend_outputs, _attend_request,  # noqa: F401
                        _block_proto, _hash_bytes, _hashes, _raw_block, _seq_id, model_ref)
from .types import (TIER_NAMES, Block, BlockData, EvictResult, Format, LookupResult, Model,
                    ModelInfo, PutResult, Stats, UnregisterResult)

_DEFAULT_MAX_MESSAGE = 1 << 30


# Dense reads over the data plane ask for at most this many bytes a request
# (the server refuses replies over its --max_message_bytes, 64 MiB by default).
_DENSE_CHUNK_BYTES = 32 << 20


def tls_credentials(ca_file=None, cert_file=None, key_file=None):
    """grpc.ChannelCredentials for a tqkv server with TLS (pass as Client's
    `credentials`): trust the PEM CAs of `ca_file` (None: the system's
    roots); with `cert_file` and `key_file` (PEM), present that client
    certificate (servers with mutual TLS). A failed handshake shows as
    errors.Unavailable on the calls."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together")

    def read(path):
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()
    return grpc.ssl_channel_credentials(root_certificates=read(ca_file),
                                        private_key=read(key_file),
                                        certificate_chain=read(cert_file))


class Client:
    """Connects to a tqkv server.

    address: "host:port". token: bearer token sent as `authorization` metadata
    (None: no auth). timeout: per-attempt deadline in seconds for unary calls
    and whole streams. retries/backoff_s/max_backoff_s: UNAVAILABLE retry
    policy (attempts after the first; first delay; cap). credentials: a
    grpc.ChannelCredentials for TLS, e.g. tls_credentials(...) (default
    plaintext). data_tls/data_server_name: DataPlane's `tls` and
    `server_name` (a server with TLS has it on its data plane too: pass
    data_tls=data_plane_tls(...) with the same files). data_address: the
    server's data-plane "host:port" (tqkv-server prints it), "unix:PATH"
    for its Unix-domain socket on this host (--data_socket; data_tls is not
    used there), or "auto" to ask the server (Stats) on first use; when set, packed
    get_blocks/iter_blocks and attend go over the data plane (one connection
    per thread) instead of gRPC, with the same results and errors.
    data_reply_poll: DataPlane's `reply_poll`.
    data_shared_memory_bytes: DataPlane's `shared_memory_bytes`, for a
    unix: data_address (ignored on TCP).
    """

    def __init__(self, address, token=None, timeout=30.0, *, retries=5, backoff_s=0.05,
                 max_backoff_s=2.0, credentials=None, max_message_bytes=_DEFAULT_MAX_MESSAGE,
                 options=(), data_address=None, data_tls=None, data_server_name=None,
                 data_reply_poll=0.0, data_shared_memory_bytes=0):
        opts = [("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes)] + list(options)
        if credentials is not None:
            self._channel = grpc.secure_channel(address, credentials, options=opts)
        else:
            self._channel = grpc.insecure_channel(address, options=opts)
        self._kv = pb_grpc.KvStoreStub(self._channel)
        self._admin = pb_grpc.AdminStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.address = address
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.data_address = data_address
        self._data_tls = data_tls
        self._data_server_name = data_server_name
        self._data_reply_poll = data_reply_poll
        self._data_shared_memory_bytes = data_shared_memory_bytes
        self._token = token
        self._dp = threading.local()

    # ---- lifecycle ---------------------------------------------------------
    def close(self):
        dp = getattr(self._dp, "conn", None)
        if dp is not None:
            dp.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout=10.0):
        """Blocks until the channel connects; errors.Unavailable on timeout."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise errors.Unavailable(f"{self.address} not reachable within {timeout}s",
                                     method="wait_ready") from None

    # ---- plumbing ----------------------------------------------------------
    def _sleep(self, attempt):
        d = min(self.max_backoff_s, self.backoff_s * (2 ** attempt))
        time.sleep(d * (0.5 + random.random() / 2))

    def _data_plane_call(self, fn, retry=True):
        """fn(DataPlane) on this thread's data-plane connection, retried like
        _call on Unavailable (the connection is re-opened) when `retry`."""
        attempt = 0
        while True:
            dp = getattr(self._dp, "conn", None)
            if dp is None:
                if self.data_address == "auto":
                    self.data_address = self._discover_data_plane()
                unix = self.data_address.startswith("unix:")  # this host, no TLS on it
                dp = self._dp.conn = DataPlane(self.data_address, token=self._token,
                                               timeout=self.timeout,
                                               tls=None if unix else self._data_tls,
                                               server_name=self._data_server_name,
                                               reply_poll=self._data_reply_poll,
                                               shared_memory_bytes=self._data_shared_memory_bytes if unix else 0)
            try:
                return fn(dp)
            except errors.Unavailable:
                if not retry or attempt >= self.retries:
                    raise
                self._sleep(attempt)
                attempt += 1

    def _discover_data_plane(self):
        """The data-plane address the server reports, its wildcard host replaced
        by the host this client reaches the server on."""
        addr = self._call("Stats", self._kv.Stats, pb.StatsRequest()).data_plane_address
        if not addr:
            raise errors.FailedPrecondition("the server's data plane is off (--data_listen=off)",
                                            method="Stats")
        host, _, port = addr.rpartition(":")
        if host in ("0.0.0.0", "[::]", "::", ""):
            host = self.address.rpartition(":")[0]
        return f"{host}:{port}"

    def _call(self, method, fn, request, *, retry=True):
        attempt = 0
        while True:
            try:
                return fn(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                if retry and e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    self._sleep(attempt)
                    attempt += 1
                    continue
                raise errors.from_rpc_error(e, method) from None

    _ref = staticmethod(model_ref)

    # ---- models ------------------------------------------------------------
    def register_model(self, name, *, num_layers, num_kv_heads, head_dim, block_size,
                       num_q_heads=None, dtype="fp16", cache_dtype="k4v4",
                       layer_cache_dtypes=None, dense_first_layers=0, dense_last_layers=0,
                       recipe_metadata_json="", rotation="", rotation_seed=0,
                       block_hash_scheme=""):
        """Registers (or re-attaches to an identical registration of) a model.

        Returns a `Model` with model_id, fingerprint, the packed `format` and
        `created` (False when an identical registration existed). Raises
        AlreadyExists when `name` is registered with a different layout or
        codec, InvalidArgument for an unusable layout or cache dtype.
        """
        req = pb.RegisterModelRequest(
            model_name=name,
            layout=pb.ModelLayout(num_layers=num_layers, num_kv_heads=num_kv_heads,
                                  num_q_heads=num_q_heads if num_q_heads else num_kv_heads,
                                  head_dim=head_dim, block_size=block_size,
                                  dtype=tensors.parse_dtype(dtype)),
            codec=pb.CodecConfig(cache_dtype=cache_dtype,
                                 layer_cache_dtypes=dict(layer_cache_dtypes or {}),
                                 dense_first_layers=dense_first_layers,
                                 dense_last_layers=dense_last_layers,
                                 recipe_metadata_json=recipe_metadata_json,
                                 rotation=rotation, rotation_seed=rotation_seed),
            block_hash_scheme=block_hash_scheme)
        r = self._call("RegisterModel", self._kv.RegisterModel, req)
        lay = req.layout
        return Model(model_id=r.model_id, fingerprint=r.layout_fingerprint,
                     format=Format.from_proto(r.format), created=r.created, name=name,
                     num_layers=lay.num_layers, num_kv_heads=lay.num_kv_heads,
                     num_q_heads=lay.num_q_heads, head_dim=lay.head_dim,
                     block_size=lay.block_size)

    # ---- blocks ------------------------------------------------------------
    def put_blocks(self, model, blocks, *, first_layer=0, last_layer=0, durable=False,
                   dtype=None):
        """Streams blocks to the server; nothing is visible until the stream
        commits, then all of them are.

        blocks: an iterable of `Block` (or tuples (hash, k, v[, parent]) for
        dense, (hash, payload) for packed); all dense or all packed. Dense k/v
        are [layers in range, tokens <= block_size, kv_heads, d]; `dtype`
        optionally converts them before sending ("fp16", "bf16", "fp32").
        Layers [first_layer, last_layer) (0: all). durable: acknowledged only
        once synced to disk. Returns a PutResult. Raises InvalidArgument (bad
        shapes, sizes or dtypes), FailedPrecondition (fingerprint),
        AlreadyExists (different bytes under a stored hash),
        ResourceExhausted (budget or message size); an exception raised while
        iterating `blocks` cancels the stream (nothing committed) and is
        re-raised. With a data_address the stream goes over the data plane
        (DataPlane.put_blocks), with the same semantics.
        """
        replayable = isinstance(blocks, collections.abc.Sequence)
        if self.data_address:  # a broken stream commits nothing: replayable input is retried
            return self._data_plane_call(lambda dp: dp.put_blocks(
                model, blocks, first_layer=first_layer, last_layer=last_layer, durable=durable, dtype=dtype),
                retry=replayable)
        ref = self._ref(model)
        attempt = 0
        while True:
            it = iter(blocks)
            try:
                first = _as_block(next(it))
            except StopIteration:
                first = None
            packed = first is not None and first.payload is not None
            header = pb.PutHeader(model=ref, first_layer=first_layer, last_layer=last_layer,
                                  packed=packed, durable=durable)
            failure = []

            def requests(first=first, it=it):
                yield pb.PutBlocksRequest(header=header)
                if first is None:
                    return
                try:
                    for b in itertools.chain([first], (_as_block(x) for x in it)):
                        yield pb.PutBlocksRequest(block=_block_proto(b, packed, dtype))
                except BaseException as e:  # cancel the stream: nothing commits
                    failure.append(e)
                    raise

            try:
                r = self._kv.PutBlocks(requests(), timeout=self.timeout, metadata=self._metadata)
                return PutResult(r.committed, r.already_present, r.staged, r.packed_bytes,
                                 r.dense_equivalent_bytes)
            except grpc.RpcError as e:
                if failure:
                    raise failure[0] from None
                if (replayable and e.code() == grpc.StatusCode.UNAVAILABLE
                        and attempt < self.retries):
                    self._sleep(attempt)
                    attempt += 1
                    continue
                raise errors.from_rpc_error(e, "PutBlocks") from None

    def put(self, model, hashes, k=None, v=None, *, payloads=None, parents=None, **kw):
        """Convenience over put_blocks: hashes[i] gets k[i], v[i] (dense,
        [n, layers, tokens, kv_heads, d]) or payloads[i] (packed)."""
        hs = _hashes(hashes)
        parents = parents or [b""] * len(hs)
        if payloads is not None:
            bl = [Block(h, payload=p, parent=_hash_bytes(pa))
                  for h, p, pa in zip(hs, payloads, parents)]
        else:
            bl = [Block(h, k=k[i], v=v[i], parent=_hash_bytes(parents[i]))
                  for i, h in enumerate(hs)]
        return self.put_blocks(model, bl, **kw)

    def lookup(self, model, hashes):
        """Counts consecutive leading hits of a prefix chain. Returns a
        LookupResult(hits, tiers)."""
        r = self._call("Lookup", self._kv.Lookup,
                       pb.LookupRequest(model=self._ref(model), block_hashes=_hashes(hashes)))
        return LookupResult(r.hits, [TIER_NAMES.get(t, str(t)) for t in r.tiers])

    def iter_blocks(self, model, hashes, *, first_layer=0, last_layer=0, dense=False,
                    dtype="fp16", as_torch=False):
        """Yields a BlockData per requested hash, in order, as they stream in.

        Packed (default): `payload` bytes of layers [first_layer, last_layer)
        and the `format`. dense=True: `k`, `v` arrays [layers, block_size,
        kv_heads, d] in `dtype` (numpy, bf16 as uint16; torch when as_torch).
        Raises NotFound for a missing block, FailedPrecondition for a stale
        fingerprint, DataLoss for a block that failed its checksum.
        """
        if self.data_address and not dense:
            yield from self._data_plane_call(lambda dp: dp.get_blocks(
                model, hashes, first_layer=first_layer, last_layer=last_layer, with_format=True))
            return
        if self.data_address and hasattr(model, "block_size"):  # dense: the server decodes, in chunks
            hs = _hashes(hashes)
            layers = (last_layer or model.num_layers) - first_layer
            block = 2 * layers * model.block_size * model.num_kv_heads * model.head_dim * 4
            step, i = max(1, _DENSE_CHUNK_BYTES // block), 0
            while i < len(hs) or (i == 0 and not hs):
                try:
                    got = self._data_plane_call(lambda dp: dp.get_blocks(
                        model, hs[i:i + step], first_layer=first_layer, last_layer=last_layer, dense=True,
                        dtype=dtype, as_torch=as_torch))
                except errors.ResourceExhausted:
                    if step == 1:
                        raise
                    step //= 2  # a server with a smaller --max_message_bytes
                    continue
                yield from got
                i += max(step, 1)
            return
        hs = _hashes(hashes)
        ref = self._ref(model)
        fmt = None
        done = 0
        attempt = 0
        while done < len(hs) or (done == 0 and not hs):
            req = pb.GetBlocksRequest(model=ref, block_hashes=hs[done:], first_layer=first_layer,
                                      last_layer=last_layer, dense=dense,
                                      dense_dtype=tensors.parse_dtype(dtype) if dense else 0)
            try:
                for r in self._kv.GetBlocks(req, timeout=self.timeout, metadata=self._metadata):
                    if r.HasField("format"):
                        fmt = Format.from_proto(r.format)
                    tier = TIER_NAMES.get(r.tier, str(r.tier))
                    if dense:
                        yield BlockData(r.block_hash, tier,
                                        k=tensors.from_proto(r.k, as_torch),
                                        v=tensors.from_proto(r.v, as_torch))
                    else:
                        yield BlockData(r.block_hash, tier, payload=r.payload, format=fmt)
                    done += 1
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    self._sleep(attempt)
                    attempt += 1
                    continue
                raise errors.from_rpc_error(e, "GetBlocks") from None

    def put_blocks_device(self, model, hashes, kv, slots, **kw):
        """DataPlane.put_blocks_device on this client's data plane: blocks whose
        K/V lie in this process's GPU memory (a tqkv.DeviceKv), encoded by a
        same-host CUDA server straight from it, else sent over the wire.
        Needs a data_address (FailedPrecondition otherwise)."""
        self._need_data_plane("put_blocks_device")
        return self._data_plane_call(lambda dp: dp.put_blocks_device(model, hashes, kv, slots, **kw))

    def get_blocks_device(self, model, hashes, kv, slots, **kw):
        """DataPlane.get_blocks_device on this client's data plane: dense
        blocks decoded into slots of this process's GPU memory."""
        self._need_data_plane("get_blocks_device")
        return self._data_plane_call(lambda dp: dp.get_blocks_device(model, hashes, kv, slots, **kw))

    def _need_data_plane(self, method):
        if not self.data_address:
            raise errors.FailedPrecondition(f"{method} needs the data plane: create the Client with data_address",
                                            code=grpc.StatusCode.FAILED_PRECONDITION, method=method)

    def get_blocks(self, model, hashes, **kw):
        """List form of iter_blocks (same arguments)."""
        return list(self.iter_blocks(model, hashes, **kw))

    def pin(self, model, hashes, ttl_ms=0):
        """Pins blocks against eviction for a lease of ttl_ms (server-capped).
        Returns the number pinned."""
        return self._call("Pin", self._kv.Pin, pb.PinRequest(
            model=self._ref(model), block_hashes=_hashes(hashes), ttl_ms=ttl_ms)).pinned

    def unpin(self, model, hashes):
        """Releases pins; returns the number unpinned."""
        return self._call("Unpin", self._kv.Unpin, pb.UnpinRequest(
            model=self._ref(model), block_hashes=_hashes(hashes))).unpinned

    def delete(self, model, hashes):
        """Deletes blocks; returns the number deleted."""
        return self._call("Delete", self._kv.Delete, pb.DeleteRequest(
            model=self._ref(model), block_hashes=_hashes(hashes))).deleted

    def evict(self, model_id=0, max_bytes=0, drop=False):
        """Admin: evicts up to max_bytes (0: no limit) of a model (0: every model
        of the tenant), spilling to disk or dropping. Returns EvictResult."""
        if isinstance(model_id, Model):
            model_id = model_id.model_id
        r = self._call("Evict", self._admin.Evict,
                       pb.EvictRequest(model_id=model_id, max_bytes=max_bytes, drop=drop))
        return EvictResult(r.blocks, r.bytes)

    def list_models(self):
        """The caller's tenant's registered models: a list of `ModelInfo`."""
        r = self._call("ListModels", self._kv.ListModels, pb.ListModelsRequest())
        return [ModelInfo.from_proto(m) for m in r.models]

    def unregister_model(self, model_id, force=False):
        """Admin: unregisters a model so its name may be registered again with
        another layout. Raises FailedPrecondition while it has stored blocks,
        live sequences or staged blocks, unless `force`, which removes them
        first (pinned and on-disk blocks included). Returns UnregisterResult."""
        if isinstance(model_id, Model):
            model_id = model_id.model_id
        r = self._call("UnregisterModel", self._admin.UnregisterModel,
                       pb.UnregisterModelRequest(model_id=model_id, force=force))
        return UnregisterResult(r.blocks, r.bytes, r.sequences, r.staged)

    def stats(self, model_id=0):
        """Per-model, per-tier byte accounting of the caller's tenant."""
        if isinstance(model_id, Model):
            model_id = model_id.model_id
        return Stats.from_proto(self._call("Stats", self._kv.Stats,
                                           pb.StatsRequest(model_id=model_id)))

    # ---- sequences ---------------------------------------------------------
    def create_sequence(self, model, hashes=(), tail_k=None, tail_v=None, ttl_ms=0,
                        last_block_tokens=0):
        """Creates a decode sequence over stored blocks (pinned while it lives)
        plus optional dense tail tokens [layers, tokens, kv_heads, d]. When the
        last stored block was put with fewer than block_size tokens, pass
        their count as `last_block_tokens`. Returns a `Sequence` (a context
        manager that drops it)."""
        req = pb.CreateSequenceRequest(model=self._ref(model), block_hashes=_hashes(hashes),
                                       ttl_ms=ttl_ms, last_block_tokens=last_block_tokens)
        if tail_k is not None:
            req.tail_k.CopyFrom(tensors.to_proto(tail_k))
        if tail_v is not None:
            req.tail_v.CopyFrom(tensors.to_proto(tail_v))
        r = self._call("CreateSequence", self._kv.CreateSequence, req)
        return Sequence(self, r.sequence_id, r.num_tokens)

    def append(self, sequence_id, layer, k, v):
        """Appends tokens' K/V ([tokens, kv_heads, d]) to one layer of a
        sequence; returns that layer's token count. Never retried."""
        if self.data_address:
            return self._data_plane_call(lambda dp: dp.append(sequence_id, layer, k, v), retry=False)
        req = _append_request(sequence_id, layer, k, v)
        return self._call("Append", self._kv.Append, req, retry=False).num_tokens

    def attend(self, layer, items, scale=0.0, *, return_kernel_micros=False):
        """Attention of queries over stored sequences at one layer.

        items: iterable of (sequence, q), (sequence, q, positions) or
        (sequence, q, positions, k, v), q of shape [num_queries, q_heads, d];
        positions per query (None or empty: decode at the last token); k, v:
        new tokens [tokens, kv_heads, d] appended to the sequence first, in
        the same call (both happen or neither). Returns one output
        [num_queries, q_heads, d] per item in q's dtype - a torch tensor when
        q was one, on q's device. scale 0: 1/sqrt(d). A call that appends is
        never retried.
        """
        items = list(items)
        retry = not any(len(it) > 3 for it in items)
        if self.data_address:
            return self._data_plane_call(lambda dp: dp.attend(
                layer, items, scale, return_kernel_micros=return_kernel_micros), retry=retry)
        req, queries = _attend_request(layer, items, scale)
        r = self._call("Attend", self._kv.Attend, req, retry=retry)
        return _attend_outputs(r, queries, return_kernel_micros)

    def drop_sequence(self, sequence_id):
        self._call("DropSequence", self._kv.DropSequence,
                   pb.DropSequenceRequest(sequence_id=_seq_id(sequence_id)))
