"""A router's own history of what it sent where (``cluster.router.view: approximate``).

No replica is asked: the router assumes a replica holds whatever prompts it was sent, until
its own rule forgets them.

* ``RunTree``: SGLang's cache-aware router tree (``sgl-router/src/tree.rs``), one radix
  tree shared by every worker ("tenant"), each node remembering which tenants were sent its
  text and when.  SGLang keys it by the request's *characters*; our workloads carry token
  identities, not text, so here a "character" is a token and the tree's edges are runs of
  consecutive tokens of one stream (``(stream, start, length)``, as ``sim/cache/hashing.py``
  describes a prompt): two prompts share a prefix exactly when their token identities do.
  Insert on route stamps the path with the time; matching returns the tokens matched (a
  match ending inside an edge counts the tokens matched there) and an owner of the deepest
  node reached; eviction removes, per tenant, its least recently used leaves until it holds
  at most ``max_tree_size`` tokens.
* ``BlockHistory``: a per-replica set of prompt block keys with an expiry or an LRU bound:
  Dynamo's approximate indexer (``--no-kv-events``: blocks a request was routed with are
  assumed cached for ``router_ttl_s``; at most ``router_max_tree_size`` blocks, pruned to
  ``router_prune_target_ratio`` of it, oldest first) and llm-d's approximate prefix scorer
  (blocks added at dispatch into an LRU of ``lru_capacity_per_server`` entries).  The
  overlap is the leading prompt blocks held.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable

Run = tuple[Any, int, int]      # (stream name, start, length)


def runs_of(prompt: Iterable) -> list[Run]:
    """A workload record's segments as maximal runs (a segment continuing the previous
    one's stream at its end is the same run)."""
    out: list[list] = []
    for name, off, n in prompt:
        if n <= 0:
            continue
        if out and out[-1][0] == name and out[-1][1] + out[-1][2] == off:
            out[-1][2] += n
        else:
            out.append([name, off, n])
    return [tuple(r) for r in out]      # type: ignore[misc]


class _Node:
    __slots__ = ("edge", "length", "children", "parent", "tenants", "creator")

    def __init__(self, edge: list[Run], parent: "_Node | None", creator: int):
        self.edge = edge
        self.length = sum(r[2] for r in edge)
        self.children: dict[tuple[Any, int], _Node] = {}
        self.parent = parent
        self.tenants: dict[int, float] = {}     # tenant -> last access (insertion ordered)
        self.creator = creator


def _common(edge: list[Run], runs: list[Run], j: int) -> tuple[int, int, int]:
    """Tokens of ``edge`` matching ``runs[j:]`` from their starts: (tokens, runs of the
    edge wholly matched, tokens into the next edge run)."""
    n = 0
    ei = 0
    into = 0
    r_off = 0
    while ei < len(edge) and j < len(runs):
        es, eo, en = edge[ei]
        rs, ro, rn = runs[j]
        if es != rs or eo + into != ro + r_off:
            break
        k = min(en - into, rn - r_off)
        n += k
        into += k
        r_off += k
        if into == en:
            ei += 1
            into = 0
        if r_off == rn:
            j += 1
            r_off = 0
    return n, ei, into


def _cut(runs: list[Run], tokens: int) -> tuple[list[Run], list[Run]]:
    """``runs`` split after ``tokens`` tokens."""
    head: list[Run] = []
    left = tokens
    for i, (s, o, n) in enumerate(runs):
        if left >= n:
            head.append((s, o, n))
            left -= n
            continue
        if left > 0:
            head.append((s, o, left))
            return head, [(s, o + left, n - left)] + list(runs[i + 1:])
        return head, list(runs[i:])
    return head, []


def _advance(runs: list[Run], j: int, off: int, tokens: int) -> tuple[int, int]:
    """Position (run, offset) ``tokens`` tokens after (``j``, ``off``)."""
    while tokens > 0 and j < len(runs):
        k = min(tokens, runs[j][2] - off)
        tokens -= k
        off += k
        if off == runs[j][2]:
            j += 1
            off = 0
    return j, off


class RunTree:
    """SGLang's approximate radix tree, over token runs (see the module docstring).
    ``stamp_path``: the 2024 router stamps every node of an inserted or matched path with
    the time; ``owner``: which tenant of the deepest node a match names ("first": the first
    to be sent it, "creator": the one whose insert made the node)."""

    def __init__(self, tenants: int, stamp_path: bool = True, owner: str = "first"):
        self.root = _Node([], None, -1)
        self.size = [0] * tenants           # tokens each tenant holds
        self.stamp_path = stamp_path
        self.owner = owner

    def insert(self, prompt: Iterable, tenant: int, now: float) -> None:
        runs = runs_of(prompt)
        node = self.root
        j, off = 0, 0
        total = sum(r[2] for r in runs)
        done = 0
        while done < total:
            first = (runs[j][0], runs[j][1] + off)
            child = node.children.get(first)
            rest = [(runs[j][0], runs[j][1] + off, runs[j][2] - off)] + list(runs[j + 1:])
            if child is None:
                leaf = _Node(rest, node, tenant)
                node.children[first] = leaf
                self._own(leaf, tenant, now)
                return
            n, _, _ = _common(child.edge, rest, 0)
            if n < child.length:        # split the edge after n tokens
                head, tail = _cut(child.edge, n)
                mid = _Node(head, node, child.creator)
                mid.tenants = dict(child.tenants)
                node.children[first] = mid
                child.edge = tail
                child.length -= n
                child.parent = mid
                mid.children[(tail[0][0], tail[0][1])] = child
                child = mid
            self._own(child, tenant, now)
            done += n
            j, off = _advance(runs, j, off, n)
            node = child
        return

    def _own(self, node: _Node, tenant: int, now: float) -> None:
        if tenant not in node.tenants:
            self.size[tenant] += node.length
        node.tenants[tenant] = now

    def match(self, prompt: Iterable, now: float) -> tuple[int, int]:
        """(tokens matched, the tenant named by the deepest node reached; -1: none)."""
        runs = runs_of(prompt)
        node = self.root
        j, off = 0, 0
        matched = 0
        owner = -1
        path = []
        while j < len(runs):
            first = (runs[j][0], runs[j][1] + off)
            child = node.children.get(first)
            if child is None or not child.tenants:
                break
            rest = [(runs[j][0], runs[j][1] + off, runs[j][2] - off)] + list(runs[j + 1:])
            n, _, _ = _common(child.edge, rest, 0)
            if n == 0:
                break
            matched += n
            path.append(child)
            owner = child.creator if self.owner == "creator" and child.creator in \
                child.tenants else next(iter(child.tenants))
            if n < child.length:
                break
            j, off = _advance(runs, j, off, n)
            node = child
        if self.stamp_path and path and owner >= 0:
            for nd in path:
                if owner in nd.tenants:
                    nd.tenants[owner] = now
        return matched, owner

    def held_by(self, prompt: Iterable, tenant: int) -> int:
        """Tokens of the prompt's longest prefix matched through nodes ``tenant`` was
        sent (what the tree says that tenant holds of it)."""
        runs = runs_of(prompt)
        node = self.root
        j, off = 0, 0
        matched = 0
        while j < len(runs):
            child = node.children.get((runs[j][0], runs[j][1] + off))
            if child is None or tenant not in child.tenants:
                break
            rest = [(runs[j][0], runs[j][1] + off, runs[j][2] - off)] + list(runs[j + 1:])
            n, _, _ = _common(child.edge, rest, 0)
            matched += n
            if n < child.length:
                break
            j, off = _advance(runs, j, off, n)
            node = child
        return matched

    def evict(self, max_size: int) -> None:
        """Per tenant over ``max_size`` tokens, its least recently used leaves (a node no
        child of which it owns) go until it holds at most ``max_size``."""
        for t in range(len(self.size)):
            if self.size[t] <= max_size:
                continue
            leaves = []
            self._leaves(self.root, t, leaves)
            leaves.sort(key=lambda nd: nd.tenants[t])
            k = 0
            while self.size[t] > max_size and k < len(leaves):
                nd = leaves[k]
                k += 1
                self._drop(nd, t)
                p = nd.parent
                if p is not None and p is not self.root and t in p.tenants and not any(
                        t in c.tenants for c in p.children.values()):
                    # its parent became a leaf of t: in LRU order among the rest
                    i = k
                    while i < len(leaves) and leaves[i].tenants[t] <= p.tenants[t]:
                        i += 1
                    leaves.insert(i, p)

    def _leaves(self, node: _Node, t: int, out: list) -> bool:
        has = False
        for c in node.children.values():
            if t in c.tenants:
                has = True
                if not self._leaves(c, t, out):
                    out.append(c)
        return has

    def _drop(self, node: _Node, t: int) -> None:
        if t not in node.tenants:
            return
        del node.tenants[t]
        self.size[t] -= node.length
        if not node.tenants and not node.children and node.parent is not None:
            p = node.parent
            for k, c in list(p.children.items()):
                if c is node:
                    del p.children[k]


class BlockHistory:
    """Per replica, the prompt block keys it was sent, each kept until ``ttl_ns`` after it
    was last sent (``ttl_ns`` None: no expiry) and, past ``capacity`` keys, the oldest
    dropped down to ``prune_to`` of it (LRU)."""

    def __init__(self, replicas: int, capacity: int, ttl_ns: int | None = None,
                 prune_to: float = 1.0):
        self.held: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
        self.capacity = capacity
        self.ttl_ns = ttl_ns
        self.prune_to = prune_to

    def add(self, i: int, keys: list[int], now: int) -> None:
        held = self.held[i]
        until = now + self.ttl_ns if self.ttl_ns is not None else 0
        for k in keys:
            if k in held:
                held.move_to_end(k)
            held[k] = until
        if len(held) > self.capacity:
            keep = int(self.capacity * self.prune_to)
            while len(held) > keep:
                held.popitem(last=False)

    def overlap(self, i: int, keys: list[int], now: int) -> int:
        """Leading keys of ``keys`` held (and not expired) by replica ``i``."""
        held = self.held[i]
        n = 0
        ttl = self.ttl_ns is not None
        for k in keys:
            until = held.get(k)
            if until is None or (ttl and until <= now):
                break
            n += 1
        return n

    def size(self, i: int) -> int:
        return len(self.held[i])
