"""Bulk reads and puts, Attend and Append over tqkv's data plane (TCP next to gRPC; TLS
when the server has TLS: pass tls=tqkv.data_plane_tls(...)).

    with tqkv.DataPlane("127.0.0.1:50052", token=None) as dp:
        blocks = dp.get_blocks(model, [b"h0", b"h1"])   # [BlockData], payload = bytes
        views = dp.get_blocks(model, hashes, copy=False)  # payloads as memoryviews of one buffer
        dense = dp.get_blocks(model, hashes, dense=True)  # k, v [layers, block_size, kv_heads, d]
        dp.put_blocks(model, [tqkv.Block(h, k=k, v=v)])   # as Client.put_blocks (two-phase)
        out = dp.attend(layer, [(seq, q)])[0]             # as Client.attend, without gRPC
        out = dp.attend(layer, [(seq, q, None, k, v)])[0] # append this step's k, v, then attend

Same tenancy, fingerprint checks and error classes as Client.get_blocks
and Client.put_blocks. Wire format: proto/tqkv/v1/tqkv.proto, "Data plane":
the preface b"TQKVDP02", then per request `u32 N, u64 P, DataPlaneRequest (N
bytes), raw payload (P bytes)`; per reply `u32 H, u64 P, DataPlaneReply (H
bytes), payloads (P bytes)`. attend and append send their tensors as the
raw payload, from the arrays' memory, and attend receives its outputs
into one buffer that the returned arrays view.

Not thread-safe: use one DataPlane per thread.
"""
import array
import fcntl
import itertools
import mmap
import os
import select
import socket
import ssl
import struct
import time

import grpc
import numpy as np

from . import errors
from ._proto import pb
from . import tensors
from ._requests import _as_block, _hash_bytes, _hashes, _raw_block, _seq_id, model_ref
from .types import TIER_NAMES, Block, BlockData, Format, PutResult

_PREFACE = b"TQKVDP02"
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def data_plane_tls(ca_file=None, cert_file=None, key_file=None):
    """An ssl.SSLContext for a data plane with TLS (DataPlane's and Client's
    `data_tls`): trust the PEM CAs of `ca_file` (None: the system's roots);
    with `cert_file` and `key_file` (PEM), present that client certificate
    (servers with mutual TLS). The server's certificate must name the host
    of the address (or DataPlane's `server_name`). A failed handshake shows
    as errors.Unavailable on the calls."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


class DataPlane:
    def __init__(self, address, token=None, timeout=30.0, *, tls=None, server_name=None,
                 reply_poll=0.0, shared_memory_bytes=0):
        """address: the server's data-plane HOST:PORT (tqkv-server prints it as
        `data plane listening on`), or unix:PATH for its Unix-domain socket
        on this host (tqkv-server --data_socket; no TLS there). tls: an
        ssl.SSLContext (data_plane_tls)
        for a server with TLS; None: plain TCP. server_name: the name the
        server's certificate must carry (default: the address's host).
        reply_poll: seconds a call polls its socket for the reply before
        sleeping in recv (a decode loop that waits on every reply anyway
        saves the thread's wake-up; a core stays busy meanwhile; plain TCP
        only). Default 0: sleep at once. shared_memory_bytes (unix:PATH
        only): share that much memory with the server (a sealed memfd passed
        at connect; proto "Same-host shared memory"): the tensors of puts,
        attend and append, and the replies' payloads (outputs, read blocks),
        go through it instead of the socket where they fit. Default 0."""
        if shared_memory_bytes and not address.startswith("unix:"):
            raise ValueError(f"data plane {address}: memory is shared only over a unix: address")
        self._shared_bytes = int(shared_memory_bytes)
        self._shared = None  # (fd, mmap) once made
        if address.startswith("unix:"):
            if tls is not None:
                raise ValueError(f"data plane {address}: a Unix-domain socket has no TLS")
            self._addr = address[len("unix:"):]
        else:
            host, _, port = address.rpartition(":")
            self._addr = (host.strip("[]"), int(port))
        self._token = token
        self._timeout = timeout
        self._tls = tls
        self._server_name = server_name or (self._addr[0] if isinstance(self._addr, tuple) else None)
        self._reply_poll = reply_poll
        self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._shared is not None:
            self._shared[1].close()
            os.close(self._shared[0])
            self._shared = None

    def _share_memory(self, sock):
        """Maps a sealed memfd (once) and shares it with the server over the
        fresh connection `sock`."""
        if self._shared is None:
            fd = os.memfd_create("tqkv-data-plane", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, self._shared_bytes)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
                self._shared = (fd, mmap.mmap(fd, self._shared_bytes))
            except BaseException:
                os.close(fd)
                raise
        req = pb.DataPlaneRequest(share_memory=pb.ShareMemory())
        if self._token:
            req.authorization = "Bearer " + self._token
        body = req.SerializeToString()
        sock.sendmsg([struct.pack("<IQ", len(body), 0) + body],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [self._shared[0]]))])
        reply, _ = self._read_reply(sock, "DataShareMemory")
        if reply.shared_memory_bytes != self._shared_bytes:
            raise errors.TqkvError(f"the server mapped {reply.shared_memory_bytes} of {self._shared_bytes} "
                                   "shared bytes", code=grpc.StatusCode.INTERNAL, method="DataShareMemory")

    def _connect(self):
        if self._sock is None:
            try:
                if isinstance(self._addr, str):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(self._timeout)
                    try:
                        s.connect(self._addr)
                    except BaseException:
                        s.close()
                        raise
                else:
                    s = socket.create_connection(self._addr, timeout=self._timeout)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    if self._tls is not None:
                        s = self._tls.wrap_socket(s, server_hostname=self._server_name)
                    # Under TLS 1.3 a server that refuses the client's
                    # certificate says so after the client's handshake ends:
                    # this write can be the first to see it.
                    s.sendall(_PREFACE)
                    self._sock = s
                    if self._shared_bytes:
                        self._share_memory(s)
                except BaseException:
                    self._sock = None
                    s.close()
                    raise
            except OSError as e:  # ssl.SSLError included
                raise errors.Unavailable(f"data plane {self._addr}: {e}",
                                         method="DataGetBlocks") from e
        return self._sock

    def _recv_into(self, view):
        got = 0
        while got < len(view):
            n = self._sock.recv_into(view[got:])
            if n == 0:
                self.close()
                raise errors.Unavailable("data plane connection closed by the server",
                                         method="DataGetBlocks")
            got += n

    def _poll_for_reply(self, sock):
        if self._reply_poll <= 0 or self._tls is not None:
            return
        until = time.monotonic() + self._reply_poll
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while not poller.poll(0) and time.monotonic() < until:
            pass

    def _send(self, sock, parts):
        if self._tls is not None:  # SSL sockets have no sendmsg
            for part in parts:
                sock.sendall(part)
            return
        parts = [memoryview(x).cast("B") for x in parts if len(x)]
        while parts:
            n = sock.sendmsg(parts[:1024])
            while parts and n >= len(parts[0]):
                n -= len(parts[0])
                parts.pop(0)
            if n:
                parts[0] = parts[0][n:]

    def _exchange(self, req, method, payload=(), into=None):
        """Sends a DataPlaneRequest with its raw `payload` (buffers);
        returns (DataPlaneReply, payload bytearray), or (reply, `into`)
        when the reply's payload is received into that buffer (a numpy
        uint8 array of exactly its size)."""
        if self._token:
            req.authorization = "Bearer " + self._token
        raw = sum(memoryview(x).nbytes for x in payload)
        sock = self._connect()
        if self._shared is not None:  # the payload (and the reply's) through the shared memory where it fits
            shm = self._shared[1]
            if 0 < raw <= len(shm):
                at = 0
                for x in payload:
                    b = memoryview(x).cast("B")
                    shm[at:at + b.nbytes] = b
                    at += b.nbytes
                reply_at = min(len(shm), (raw + 63) // 64 * 64)
                req.shared.CopyFrom(pb.SharedPayload(offset=0, bytes=raw, reply_offset=reply_at,
                                                     reply_capacity=len(shm) - reply_at))
                payload, raw = (), 0
            elif raw == 0:
                req.shared.CopyFrom(pb.SharedPayload(reply_capacity=len(shm)))
        body = req.SerializeToString()
        try:
            self._send(sock, [struct.pack("<IQ", len(body), raw) + body, *payload])
            self._poll_for_reply(sock)
            reply, payload = self._read_reply(sock, method, into)
        except socket.timeout as e:
            self.close()
            raise errors.DeadlineExceeded("data plane call timed out", method=method) from e
        except OSError as e:
            self.close()
            raise errors.Unavailable(f"data plane: {e}", method=method) from e
        if reply.shared_reply_bytes:
            shm, n = self._shared[1], reply.shared_reply_bytes
            src = memoryview(shm)[req.shared.reply_offset:req.shared.reply_offset + n]
            if into is not None and n == into.nbytes:
                memoryview(into).cast("B")[:] = src
                payload = into
            else:
                payload = bytearray(src)
            src.release()
        return reply, payload

    def _read_reply(self, sock, method, into=None):
        """One reply: (DataPlaneReply, its socket payload: `into` when that
        buffer has its size, else a bytearray); its error raised."""
        prefix = bytearray(12)
        self._recv_into(memoryview(prefix))
        h, p = struct.unpack("<IQ", prefix)
        head = bytearray(h)
        self._recv_into(memoryview(head))
        if into is not None and p == into.nbytes:
            self._recv_into(memoryview(into))
            payload = into
        else:
            payload = bytearray(p)
            self._recv_into(memoryview(payload))
        reply = pb.DataPlaneReply.FromString(bytes(head))
        if reply.code != 0:
            code = _CODES.get(reply.code, grpc.StatusCode.UNKNOWN)
            cls = errors._BY_CODE.get(code, errors.TqkvError)
            raise cls(reply.message, code=code, method=method)
        return reply, payload

    def get_blocks(self, model, hashes, *, first_layer=0, last_layer=0, with_format=False,
                   copy=True, dense=False, dtype="fp16", as_torch=False):
        """A BlockData per requested hash, in order (all or an error).

        payload: bytes of layers [first_layer, last_layer); with copy=False,
        memoryviews into one buffer of the whole reply. format: the model's
        Format when with_format. dense=True (model: a Model from
        register_model): `k`, `v` arrays [layers, block_size, kv_heads, d] in
        `dtype` (numpy, bf16 as uint16; torch when as_torch), decoded by the
        server. Raises NotFound
        for a missing block, FailedPrecondition for a stale fingerprint,
        ResourceExhausted for a dense reply over the server's message limit
        (ask for fewer blocks), Unauthenticated, ...
        """
        wire_dtype = tensors.parse_dtype(dtype) if dense else 0
        req = pb.DataPlaneRequest(
            get_blocks=pb.GetBlocksRequest(model=model_ref(model), block_hashes=_hashes(hashes),
                                           first_layer=first_layer, last_layer=last_layer,
                                           dense=dense, dense_dtype=wire_dtype),
            with_format=with_format)
        reply, payload = self._exchange(req, "DataGetBlocks")
        fmt = Format.from_proto(reply.format) if reply.HasField("format") else None
        view = memoryview(payload)
        out, at = [], 0
        for b in reply.blocks:
            part = view[at:at + b.payload_bytes]
            at += b.payload_bytes
            tier = TIER_NAMES.get(b.tier, str(b.tier))
            if dense:
                layers = (last_layer or model.num_layers) - first_layer
                shape = [layers, model.block_size, model.num_kv_heads, model.head_dim]
                half = len(part) // 2
                k, v = (tensors.from_proto(pb.Tensor(dtype=wire_dtype, shape=shape, data=bytes(x)), as_torch)
                        for x in (part[:half], part[half:]))
                out.append(BlockData(b.block_hash, tier, k=k, v=v))
            else:
                out.append(BlockData(b.block_hash, tier, payload=bytes(part) if copy else part, format=fmt))
        return out

    def put_blocks(self, model, blocks, *, first_layer=0, last_layer=0, durable=False, dtype=None,
                   frame_bytes=8 << 20):
        """Client.put_blocks over the data plane: the same blocks, result and
        errors, as one two-phase stream of frames of about `frame_bytes`, the
        commit frame last. Nothing is visible until the commit succeeds; an
        error (or a broken connection) commits nothing. Not retried.
        """
        it = iter(blocks)
        first = next(it, None)
        first = None if first is None else _as_block(first)
        packed = first is not None and first.payload is not None
        frame = pb.DataPlanePut(header=pb.PutHeader(model=model_ref(model), first_layer=first_layer,
                                                    last_layer=last_layer, packed=packed, durable=durable))
        failure = None
        payload = []  # the frame's tensors (or packed payloads), sent from their memory

        def send(frame):
            nonlocal failure
            try:
                return self._exchange(pb.DataPlaneRequest(put=frame), "DataPutBlocks", payload)[0]
            except errors.TqkvError as e:
                if isinstance(e, errors.Unavailable) or frame.commit:
                    raise failure or e
                failure = failure or e
                return None

        size = 0
        try:
            source = [] if first is None else itertools.chain([first], (_as_block(x) for x in it))
            for b in source:
                msg, data = _raw_block(b, packed, dtype)
                size += sum(x.nbytes for x in data)
                frame.blocks.append(msg)
                payload.extend(data)
                if size >= frame_bytes:
                    send(frame)
                    frame, size = pb.DataPlanePut(), 0
                    payload.clear()
                    if failure is not None:
                        break
        except BaseException:
            self.close()  # the server drops the stream: nothing commits
            raise
        frame.commit = True
        r = send(frame).put
        return PutResult(r.committed, r.already_present, r.staged, r.packed_bytes, r.dense_equivalent_bytes)

    def put_blocks_device(self, model, hashes, kv, slots, *, tokens=None, parents=None, first_layer=0,
                          last_layer=0, durable=False, fallback=True, frame_blocks=4096):
        """put_blocks of K/V that lie in this process's GPU memory (a
        tqkv.DeviceKv over torch CUDA tensors): block i is slot slots[i] of
        `kv`, tokens[i] tokens (default: full blocks), parent parents[i].
        The server encodes straight from that memory by CUDA IPC (same host,
        loopback, CUDA backend). One two-phase stream; returns its PutResult.
        When the server cannot map the memory (FailedPrecondition) and
        `fallback`, the blocks are copied to the host and put over the data
        plane instead. Waits for the device's queued work first."""
        hashes = list(hashes)
        tokens = [0] * len(hashes) if tokens is None else [int(t) for t in tokens]
        parents = [b""] * len(hashes) if parents is None else list(parents)
        if not (len(slots) == len(tokens) == len(parents) == len(hashes)):
            raise ValueError("one slot, token count and parent per hash")
        kv.synchronize()
        frames = []
        for at in range(0, max(1, len(hashes)), frame_blocks):
            frame = pb.DataPlanePut(device=kv.proto)
            if at == 0:
                frame.header.CopyFrom(pb.PutHeader(model=model_ref(model), first_layer=first_layer,
                                                   last_layer=last_layer, durable=durable))
            for h, s, t, p in zip(hashes[at:at + frame_blocks], slots[at:at + frame_blocks],
                                  tokens[at:at + frame_blocks], parents[at:at + frame_blocks]):
                frame.blocks.append(pb.PutBlock(block_hash=_hash_bytes(h), parent_hash=_hash_bytes(p or b""),
                                                device_slot=int(s), device_tokens=t))
            frames.append(frame)
        frames[-1].commit = True
        try:
            for i, frame in enumerate(frames):
                reply, _ = self._exchange(pb.DataPlaneRequest(put=frame), "DataPutBlocks")
        except errors.FailedPrecondition:
            if not fallback:
                raise
            if not frames[i].commit:
                self._end_put()
            block_size = kv.block_size
            blocks = (Block(_hash_bytes(h), k=kv.block(kv.k_layers, s, t or block_size).cpu(),
                            v=kv.block(kv.v_layers, s, t or block_size).cpu(), parent=_hash_bytes(p or b""))
                      for h, s, t, p in zip(hashes, slots, tokens, parents))
            return self.put_blocks(model, blocks, first_layer=first_layer, last_layer=last_layer,
                                   durable=durable)
        r = reply.put
        return PutResult(r.committed, r.already_present, r.staged, r.packed_bytes, r.dense_equivalent_bytes)

    def _end_put(self):
        """Ends a failed put stream whose commit frame was not sent (the
        server answers it with the stream's error)."""
        try:
            self._exchange(pb.DataPlaneRequest(put=pb.DataPlanePut(commit=True)), "DataPutBlocks")
        except errors.TqkvError:
            pass

    def get_blocks_device(self, model, hashes, kv, slots, *, first_layer=0, last_layer=0, fallback=True):
        """Dense blocks decoded straight into this process's GPU memory: block
        i into slot slots[i] of `kv` (a tqkv.DeviceKv), block_size tokens, in
        kv's dtype. Returns a BlockData (hash, tier) per block. When the server
        cannot map the memory (FailedPrecondition) and `fallback`, the blocks
        are read dense over the data plane and copied in."""
        hashes = _hashes(hashes)
        req = pb.DataPlaneRequest(get_blocks=pb.GetBlocksRequest(
            model=model_ref(model), block_hashes=hashes, first_layer=first_layer, last_layer=last_layer,
            device_out=kv.proto, device_slots=[int(s) for s in slots]))
        try:
            reply, _ = self._exchange(req, "DataGetBlocks")
        except errors.FailedPrecondition:
            if not fallback:
                raise
            out = self.get_blocks(model, hashes, first_layer=first_layer, last_layer=last_layer, dense=True,
                                  dtype=kv.dtype, as_torch=True)
            for b, s in zip(out, slots):
                kv.write_block(int(s), b.k, b.v)
            return [BlockData(b.hash, b.tier) for b in out]
        return [BlockData(b.block_hash, TIER_NAMES.get(b.tier, str(b.tier))) for b in reply.blocks]

    def attend(self, layer, items, scale=0.0, *, return_kernel_micros=False):
        """Client.attend over the data plane: same arguments, outputs and
        errors. The tensors travel as the frame's raw payload; the outputs
        are views of one buffer received in place (writable numpy arrays,
        or torch CPU tensors over them where q was a CPU tensor; a CUDA
        query's output is copied to its device)."""
        req = pb.AttendRequest(layer=layer, scale=scale)
        payload, queries, out_bytes = [], [], 0
        for item in items:
            seq, q = item[0], item[1]
            positions = item[2] if len(item) > 2 and item[2] is not None else ()
            if len(item) not in (2, 3, 5):
                raise ValueError("an attend item with new tokens is (sequence, q, positions, k, v)")
            msg = pb.AttendItem(sequence_id=_seq_id(seq), positions=[int(p) for p in positions])
            for field, x in zip(("q", "k", "v"), (q, *item[3:5])):
                t, data = tensors.to_raw(x)
                getattr(msg, field).CopyFrom(t)
                payload.append(data)
                if field == "q":  # the output has q's dtype and shape
                    out_bytes += data.nbytes
            req.items.append(msg)
            queries.append(q)
        out = np.empty(out_bytes, dtype=np.uint8)
        reply, buf = self._exchange(pb.DataPlaneRequest(attend=req), "DataAttend", payload, out)
        if buf is not out:
            raise errors.TqkvError(f"data plane Attend reply has {len(buf)} payload bytes, expected {out_bytes}",
                                   code=grpc.StatusCode.INTERNAL, method="DataAttend")
        outs, at = [], 0
        for t, q in zip(reply.attend.outputs, queries):
            n = int(np.prod(t.shape)) * tensors.numpy_dtype(t.dtype).itemsize
            o = tensors.from_raw(t, out[at:at + n], as_torch=tensors.is_torch(q))
            outs.append(tensors.on_device_of(o, q))
            at += n
        return (outs, reply.attend.kernel_micros) if return_kernel_micros else outs

    def append(self, sequence_id, layer, k, v):
        """Client.append over the data plane: that layer's token count (k and v
        travel as the frame's raw payload)."""
        (tk, dk), (tv, dv) = tensors.to_raw(k), tensors.to_raw(v)
        req = pb.AppendRequest(sequence_id=_seq_id(sequence_id), layer=layer, k=tk, v=tv)
        reply, _ = self._exchange(pb.DataPlaneRequest(append=req), "DataAppend", [dk, dv])
        return reply.append.num_tokens
