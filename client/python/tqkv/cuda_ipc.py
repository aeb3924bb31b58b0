"""Same-host K/V in GPU memory: a worker's torch CUDA tensors handed to
tqkv-server by CUDA IPC handle instead of over the wire (proto "Same-host
GPU memory"). The server encodes straight from the worker's cache on a put
and decodes straight into it on a get.

    kv = tqkv.DeviceKv.paged(k_caches, v_caches)     # per layer [blocks, block_size, kv_heads, d]
    dp.put_blocks_device(model, hashes, kv, slots)   # block i from slot slots[i]
    dp.get_blocks_device(model, hashes, kv, slots)   # and back

Layouts: vLLM's paged cache [num_blocks, block_size, kv_heads, head_dim]
(any strides with head_dim contiguous: NHD or HND), and a contiguous
[tokens, kv_heads, head_dim] tensor (DeviceKv.contiguous; slot = token //
block_size). The server takes handles only from connections on its own
loopback or Unix-domain socket and only with its CUDA backend; otherwise the calls fall back to
sending the bytes (put) or receiving them (get) over the data plane.
"""
from ._proto import pb
from . import tensors


def _torch():
    import torch  # only callers with CUDA tensors get here
    return torch


_IPC_HANDLE_BYTES = 64


def _ipc_handle(shared):
    """The cudaIpcMemHandle_t bytes of torch's shareable handle: the bare
    handle, or (torch 2.x) a version byte, the kind ('c': a cudaMalloc
    block) and the handle."""
    if len(shared) == _IPC_HANDLE_BYTES:
        return shared
    if len(shared) == _IPC_HANDLE_BYTES + 2 and shared[1:2] == b"c":
        return shared[2:]
    raise ValueError("torch shares this tensor's memory as an expandable segment, not a CUDA IPC handle of a "
                     "cudaMalloc block; run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")


class DeviceKv:
    """The DeviceKv of per-layer K and V CUDA tensors (one pair per layer of
    the call's layer range, all of one dtype and one layout)."""

    def __init__(self, k_layers, v_layers, *, block_stride, token_stride, head_stride, block_size):
        if len(k_layers) != len(v_layers) or not k_layers:
            raise ValueError("one K and one V tensor per layer, at least one layer")
        torch = _torch()
        first = k_layers[0]
        if not first.is_cuda:
            raise ValueError("DeviceKv needs CUDA tensors")
        self.k_layers, self.v_layers = list(k_layers), list(v_layers)
        self.block_size = block_size
        self.dtype = tensors.parse_dtype(first.dtype)
        es = first.element_size()
        msg = pb.DeviceKv(dtype=self.dtype, block_stride=block_stride * es, token_stride=token_stride * es,
                          head_stride=head_stride * es)
        handles = {}
        for k, v in zip(self.k_layers, self.v_layers):
            entry = []
            for t in (k, v):
                if t.dtype != first.dtype or t.device != first.device or t.stride()[-1] != 1:
                    raise ValueError("every layer's K and V must share dtype and device, head_dim contiguous")
                storage = t.untyped_storage()
                shared = storage._share_cuda_()  # (device, handle, size, offset in the allocation, ...)
                handle, offset = _ipc_handle(bytes(shared[1])), int(shared[3]) + t.storage_offset() * es
                if handle not in handles:
                    handles[handle] = len(handles)
                entry += [handles[handle], offset]
            msg.layers.append(pb.DeviceKv.Layer(k_buffer=entry[0], k_offset=entry[1], v_buffer=entry[2],
                                                v_offset=entry[3]))
        msg.ipc_handles.extend(handles)
        self.proto = msg
        self.device = first.device
        self._torch = torch

    @classmethod
    def paged(cls, k_layers, v_layers):
        """Per layer [num_blocks, block_size, kv_heads, head_dim] views
        (vLLM's paged caches; the kv_heads and block_size dims may be
        swapped in memory: any strides with head_dim contiguous)."""
        t = k_layers[0]
        if t.dim() != 4:
            raise ValueError("paged caches are [num_blocks, block_size, kv_heads, head_dim]")
        s = t.stride()
        for x in (*k_layers, *v_layers):
            if x.stride() != s or x.shape != t.shape:
                raise ValueError("every layer's K and V must have one shape and one layout")
        return cls(k_layers, v_layers, block_stride=s[0], token_stride=s[1], head_stride=s[2],
                   block_size=t.shape[1])

    @classmethod
    def contiguous(cls, k_layers, v_layers, block_size):
        """Per layer [tokens, kv_heads, head_dim]: slot s is tokens
        [s·block_size, (s+1)·block_size)."""
        t = k_layers[0]
        if t.dim() != 3:
            raise ValueError("contiguous K/V are [tokens, kv_heads, head_dim]")
        s = t.stride()
        return cls(k_layers, v_layers, block_stride=block_size * s[0], token_stride=s[0], head_stride=s[1],
                   block_size=block_size)

    def synchronize(self):
        """Waits for the device's queued work (the worker's writes to the
        caches) to finish: the server reads the memory as it is when the
        frame arrives."""
        self._torch.cuda.synchronize(self.device)

    def block(self, layer_tensors, slot, tokens):
        """[layers, tokens, kv_heads, head_dim] of one block, on the device."""
        torch = self._torch
        rows = []
        for t in layer_tensors:
            if t.dim() == 4:
                rows.append(t[slot, :tokens])
            else:
                rows.append(t[slot * self.block_size:slot * self.block_size + tokens])
        return torch.stack(rows)

    def write_block(self, slot, k, v):
        """Writes one block's [layers, block_size, kv_heads, d] K and V (on
        any device) into the slot."""
        for c, src in ((self.k_layers, k), (self.v_layers, v)):
            src = src.to(self.device)
            for i, t in enumerate(c):
                if t.dim() == 4:
                    t[slot].copy_(src[i])
                else:
                    t[slot * self.block_size:(slot + 1) * self.block_size].copy_(src[i])
