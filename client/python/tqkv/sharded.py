"""`tqkv.ShardedClient`: one client over many tqkv servers.

Each request goes to the shard that owns its routing key under weighted
rendezvous hashing (`tqkv.rendezvous`, the same arithmetic as the C++
client's, so both route every key alike); batched calls are split by shard,
sent in parallel and merged back in request order.

Routing key: the first block hash of a block's prefix chain. A chain, its
prefixes and the sequences built on it live on one shard, so lookup,
get_blocks, create_sequence, append and attend of one chain are single-shard
calls. The price: a hot prefix (a shared system prompt) and every chain that
extends it are served by one shard. Where a call alone does not show a
block's chain, pass `routing_keys` (one for all blocks, or one per block); a
block asked for under another key than it was put under reads as a miss,
never as other bytes.

Shards that are down: a call failing with Unavailable or DeadlineExceeded
(after the per-shard client's retries) marks the shard down for
`down_interval_s`, during which it is not waited for; `lookup` answers its
chains as misses, calls that ask for its blocks or sequences raise
`Unavailable` naming it. Every error a shard raises keeps its class, reads
"shard HOST:PORT: ..." and carries `.shard`.

Membership: a list of "host:port[=weight]" or a DNS name ("host:port", e.g. a
Kubernetes headless Service) resolved with getaddrinfo and again every
`resolve_interval_s`. A shard's address is its identity: list stable names
where pod IPs change on restart. Adding or removing one of N shards moves
about 1/N of the chains (they read as misses until put again).

Models are registered on every shard; a shard that was down or joined later
gets the registration before its first call for that model.

Thread safety: a ShardedClient may be shared by threads.
"""
import concurrent.futures
import socket
import threading
import time

from . import errors
from .client import Client, Sequence, _as_block, _hash_bytes, _hashes
from .rendezvous import Ring
from .types import EvictResult, LookupResult, Model, PutResult

_DOWN = (errors.Unavailable, errors.DeadlineExceeded)


def parse_servers(servers):
    """[(address, weight)] from "a:1,b:2=2", or a list of "a:1[=w]" strings or
    (address, weight) pairs. ValueError for a malformed or repeated entry."""
    if isinstance(servers, str):
        servers = [s for s in servers.split(",")]
    out, seen = [], set()
    for s in servers:
        if isinstance(s, tuple):
            addr, weight = s
        else:
            addr, _, w = s.strip().partition("=")
            weight = float(w) if w else 1.0
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not weight > 0:
            raise ValueError(f"shard '{s}' is not host:port[=positive weight]")
        if addr in seen:
            raise ValueError(f"shard {addr} is listed twice")
        seen.add(addr)
        out.append((addr, float(weight)))
    if not out:
        raise ValueError("no servers")
    return out


def resolve(host_port):
    """One (address, 1.0) per distinct address of host_port, sorted
    ("ip:port", "[ip6]:port"). socket.gaierror when the name does not resolve."""
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"'{host_port}' is not host:port")
    addrs = set()
    for family, _, _, _, sa in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM):
        addrs.add(f"[{sa[0]}]:{port}" if family == socket.AF_INET6 else f"{sa[0]}:{port}")
    if not addrs:
        raise socket.gaierror(f"{host_port} has no addresses")
    return [(a, 1.0) for a in sorted(addrs)]


def _named(e, shard):
    """e's class and code, message "shard SHARD: ...", with .shard set."""
    if getattr(e, "shard", None) is not None:
        return e
    out = type(e)(f"shard {shard}: {e.details}", code=e.code, method=e.method)
    out.shard = shard
    return out


class _Shard:
    """A member: a lazily made tqkv.Client and a down window."""

    def __init__(self, address, client_kwargs):
        self.name = address
        self._kwargs = client_kwargs
        self._mu = threading.Lock()
        self._client = None
        self._down_until = float("-inf")
        self._last_error = None
        self.models = set()

    def acquire(self, now):
        with self._mu:
            if now < self._down_until:
                e = errors.Unavailable(f"shard {self.name} is down: {self._last_error}", method="")
                e.shard = self.name
                raise e
            if self._client is None:
                kw = dict(self._kwargs)
                # Its own connections: a fresh client after a down window does
                # not inherit another channel's reconnect backoff.
                kw["options"] = list(kw.get("options", ())) + [("grpc.use_local_subchannel_pool", 1)]
                self._client = Client(self.name, **kw)
            return self._client

    def report(self, e, now, down_for):
        if not isinstance(e, _DOWN):
            return
        with self._mu:
            self._down_until = now + down_for
            self._last_error = e
            old, self._client = self._client, None
            self.models.clear()
        if old is not None:
            old.close()

    def close(self):
        with self._mu:
            if self._client is not None:
                self._client.close()
                self._client = None


class ShardedClient:
    """servers: "a:1,b:2=2" or a list of "host:port[=weight]" / (address,
    weight); or dns="host:port". resolve_interval_s: how often dns is
    resolved again (30). down_interval_s: how long a shard that failed with
    Unavailable/DeadlineExceeded is skipped (2). clock: seconds, for those
    windows (time.monotonic). Other keyword arguments (token, timeout,
    retries, credentials, data_address, ...) go to each shard's tqkv.Client.
    """

    def __init__(self, servers=None, *, dns=None, resolve_interval_s=30.0, down_interval_s=2.0,
                 clock=time.monotonic, **client_kwargs):
        if (servers is None) == (dns is None):
            raise ValueError("pass exactly one of servers and dns")
        self._dns = dns
        self._resolve_interval = resolve_interval_s
        self._down_for = down_interval_s
        self._clock = clock
        self._kwargs = client_kwargs
        self._mu = threading.Lock()
        self._resolve_mu = threading.Lock()
        self._shards = {}
        self._ring = None
        self._models = {}  # model_id -> (name, register kwargs, fingerprint)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16)
        self.set_servers(resolve(dns) if dns else parse_servers(servers))
        self._next_resolve = clock() + resolve_interval_s

    # ---- membership ----------------------------------------------------------
    def set_servers(self, servers):
        """Replaces the members (kept shards keep their connections)."""
        members = parse_servers(servers)
        with self._mu:
            shards = {a: self._shards.get(a) or _Shard(a, self._kwargs) for a, _ in members}
            for a, s in self._shards.items():
                if a not in shards:
                    s.close()
            self._shards, self._ring = shards, Ring(members)

    def _members(self):
        if self._dns and self._resolve_mu.acquire(blocking=False):
            try:
                now = self._clock()
                if now >= self._next_resolve:
                    self._next_resolve = now + self._resolve_interval
                    try:
                        self.set_servers(resolve(self._dns))
                    except (OSError, ValueError):
                        pass  # keep the current members until the next interval
            finally:
                self._resolve_mu.release()
        with self._mu:
            return self._shards, self._ring

    @property
    def shards(self):
        return [a for a, _ in self._members()[1].shards]

    def shard_for(self, routing_key):
        """The address of the shard that owns `routing_key` (bytes or str)."""
        shards, ring = self._members()
        return ring.shards[ring.owner(_hash_bytes(routing_key))][0]

    def _owner(self, key):
        shards, ring = self._members()
        return shards[ring.shards[ring.owner(key)][0]]

    # ---- plumbing ------------------------------------------------------------
    def _on(self, shard, model, fn):
        """fn(client) on `shard` (with `model` registered there), its errors
        named after the shard."""
        now = self._clock()
        try:
            c = shard.acquire(now)
            mid = model.model_id if isinstance(model, Model) else getattr(model, "model_id", 0)
            reg = self._models.get(mid)
            if reg is not None and mid not in shard.models:
                m = c.register_model(reg[0], **reg[1])
                if m.fingerprint != reg[2]:
                    raise errors.FailedPrecondition(
                        f"model '{reg[0]}' has fingerprint {m.fingerprint} there, {reg[2]} on the other shards")
                shard.models.add(mid)
            return fn(c)
        except errors.TqkvError as e:
            shard.report(e, self._clock(), self._down_for)
            raise _named(e, shard.name) from None

    def _split(self, keys):
        """[(shard, [item indices])] in order of first item."""
        groups = {}
        for i, k in enumerate(keys):
            groups.setdefault(self._owner(k), []).append(i)
        return list(groups.items()) or [(self._owner(b""), [])]

    def _parallel(self, groups, fn):
        """fn(shard, items) per group, concurrently; the first error in group order."""
        futures = [self._pool.submit(fn, s, items) for s, items in groups]
        results, first = [], None
        for f in futures:
            try:
                results.append(f.result())
            except errors.TqkvError as e:
                first = first or e
                results.append(None)
        return results, first

    @staticmethod
    def _keys(hashes, routing_keys):
        if routing_keys is None:
            return [hashes[0]] * len(hashes) if hashes else []
        if isinstance(routing_keys, (bytes, str)):
            return [_hash_bytes(routing_keys)] * len(hashes)
        keys = [_hash_bytes(k) for k in routing_keys]
        if len(keys) == 1:
            return keys * len(hashes)
        if len(keys) != len(hashes):
            raise errors.InvalidArgument(f"{len(keys)} routing keys for {len(hashes)} blocks")
        return keys

    # ---- models --------------------------------------------------------------
    def register_model(self, name, **kw):
        """Client.register_model on every shard; returns a reachable shard's
        Model. FailedPrecondition when shards disagree on the fingerprint;
        another shard error raised named; Unavailable when none is reachable."""
        shards, _ = self._members()
        results = [None] * len(shards)

        def one(i, shard):
            try:
                results[i] = shard.acquire(self._clock()).register_model(name, **kw)
            except errors.TqkvError as e:
                shard.report(e, self._clock(), self._down_for)
                results[i] = _named(e, shard.name)

        list(self._pool.map(one, range(len(shards)), shards.values()))
        first, down = None, None
        for shard, r in zip(shards.values(), results):
            if isinstance(r, _DOWN):
                down = down or r
            elif isinstance(r, errors.TqkvError):
                raise r
            elif first is None:
                first = r
            elif (r.fingerprint, r.model_id) != (first.fingerprint, first.model_id):
                raise errors.FailedPrecondition(
                    f"shard {shard.name}: model '{name}' registered as {r.model_id}/{r.fingerprint}, "
                    f"other shards say {first.model_id}/{first.fingerprint}", method="RegisterModel")
        if first is None:
            raise errors.Unavailable(f"no shard reachable; {down}", method="RegisterModel")
        self._models[first.model_id] = (name, kw, first.fingerprint)
        for shard, r in zip(shards.values(), results):
            if isinstance(r, Model):
                shard.models.add(first.model_id)
        return first

    # ---- blocks --------------------------------------------------------------
    def put_blocks(self, model, blocks, *, routing_keys=None, **kw):
        """Client.put_blocks split by shard. Without routing_keys a block
        without parent starts a chain, one whose parent is an earlier block of
        the call joins its chain, any other raises InvalidArgument (its chain
        began in an earlier call). Each shard's stream commits on its own; a
        shard's error is raised after the others committed. Returns the
        summed PutResult."""
        blocks = [_as_block(b) for b in blocks]
        if routing_keys is None:
            keys, key_of = [], {}
            for i, b in enumerate(blocks):
                parent = _hash_bytes(b.parent or b"")
                if not parent:
                    key = _hash_bytes(b.hash)
                elif parent in key_of:
                    key = key_of[parent]
                else:
                    raise errors.InvalidArgument(
                        f"blocks[{i}] continues a chain that starts before this call: pass routing_keys")
                key_of[_hash_bytes(b.hash)] = key
                keys.append(key)
        else:
            keys = self._keys(blocks, routing_keys)
        results, err = self._parallel(self._split(keys), lambda s, items: self._on(
            s, model, lambda c: c.put_blocks(model, [blocks[i] for i in items], **kw)))
        if err is not None:
            raise err
        return PutResult(*(sum(getattr(r, f) for r in results) for f in PutResult.__dataclass_fields__))

    def lookup(self, model, hashes, routing_key=None):
        """Leading hits of a chain on its shard (routing_key default: its
        first hash). A down shard answers LookupResult(0, [])."""
        hs = _hashes(hashes)
        key = _hash_bytes(routing_key) if routing_key is not None else (hs[0] if hs else b"")
        try:
            return self._on(self._owner(key), model, lambda c: c.lookup(model, hs))
        except _DOWN:
            return LookupResult(0, [])

    def get_blocks(self, model, hashes, *, routing_keys=None, **kw):
        """Client.get_blocks split by shard, in request order. Unavailable
        naming a down shard."""
        hs = _hashes(hashes)
        out = [None] * len(hs)

        def one(shard, items):
            got = self._on(shard, model, lambda c: c.get_blocks(model, [hs[i] for i in items], **kw))
            for i, b in zip(items, got):
                out[i] = b

        _, err = self._parallel(self._split(self._keys(hs, routing_keys)), one)
        if err is not None:
            raise err
        return out

    def _count(self, method, model, hashes, routing_keys, *args):
        hs = _hashes(hashes)
        results, err = self._parallel(self._split(self._keys(hs, routing_keys)), lambda s, items: self._on(
            s, model, lambda c: getattr(c, method)(model, [hs[i] for i in items], *args)))
        if err is not None:
            raise err
        return sum(results)

    def pin(self, model, hashes, ttl_ms=0, *, routing_keys=None):
        return self._count("pin", model, hashes, routing_keys, ttl_ms)

    def unpin(self, model, hashes, *, routing_keys=None):
        return self._count("unpin", model, hashes, routing_keys)

    def delete(self, model, hashes, *, routing_keys=None):
        return self._count("delete", model, hashes, routing_keys)

    def stats(self, model_id=0):
        """{shard address: Stats or the TqkvError it raised}."""
        return self._fan_out(lambda c: c.stats(model_id))

    def evict(self, model_id=0, max_bytes=0, drop=False):
        """{shard address: EvictResult or the TqkvError it raised}."""
        return self._fan_out(lambda c: c.evict(model_id, max_bytes, drop))

    def _fan_out(self, fn):
        shards, _ = self._members()

        def one(shard):
            try:
                return self._on(shard, None, fn)
            except errors.TqkvError as e:
                return e
        return dict(zip(shards.keys(), self._pool.map(one, shards.values())))

    # ---- sequences -----------------------------------------------------------
    def create_sequence(self, model, hashes=(), *, routing_key=None, **kw):
        """Client.create_sequence on the chain's shard (routing_key default:
        the first hash). The Sequence's id is "SHARD/ID"."""
        hs = _hashes(hashes)
        key = _hash_bytes(routing_key) if routing_key is not None else (hs[0] if hs else b"")
        shard = self._owner(key)
        seq = self._on(shard, model, lambda c: c.create_sequence(model, hs, **kw))
        return Sequence(self, f"{shard.name}/{seq.id}", seq.num_tokens)

    def _sequence_shard(self, sequence_id):
        sid = sequence_id.id if isinstance(sequence_id, Sequence) else str(sequence_id)
        name, sep, local = sid.rpartition("/")
        shard = self._members()[0].get(name) if sep else None
        if shard is None:
            raise errors.NotFound(f"sequence '{sid}' has no shard among the members", method="Attend")
        return shard, local

    def append(self, sequence_id, layer, k, v):
        shard, local = self._sequence_shard(sequence_id)
        return self._on(shard, None, lambda c: c.append(local, layer, k, v))

    def attend(self, layer, items, scale=0.0, *, return_kernel_micros=False):
        """Client.attend with items split by their sequences' shards and
        outputs in item order; new tokens are atomic per shard only."""
        items = list(items)
        groups = {}
        for i, it in enumerate(items):
            shard, local = self._sequence_shard(it[0])
            groups.setdefault(shard, []).append((i, (local,) + tuple(it[1:])))
        outs, micros = [None] * len(items), []

        def one(shard, part):
            o, us = self._on(shard, None, lambda c: c.attend(
                layer, [x for _, x in part], scale, return_kernel_micros=True))
            for (i, _), y in zip(part, o):
                outs[i] = y
            micros.append(us)

        _, err = self._parallel(list(groups.items()), one)
        if err is not None:
            raise err
        return (outs, sum(micros)) if return_kernel_micros else outs

    def drop_sequence(self, sequence_id):
        shard, local = self._sequence_shard(sequence_id)
        self._on(shard, None, lambda c: c.drop_sequence(local))

    # ---- lifecycle -----------------------------------------------------------
    def close(self):
        with self._mu:
            for s in self._shards.values():
                s.close()
        self._pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
