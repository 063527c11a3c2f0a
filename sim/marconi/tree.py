"""Marconi's prefix cache: one token-level radix tree holding, per node, the KV of its edge's
tokens (all attention layers) and one SSM state at the node's end (all Mamba layers).

Admission (paper §4.1, "judicious admission"): a sequence admits a state only

* at its end -- after the request, prompt + output is inserted and the state after the last
  decoded token is kept (input-and-output reuse: the next turn of a conversation);
* at a branch point -- where the sequence leaves a cached edge in the middle.  Marconi finds
  it by speculatively inserting the prompt before prefill and checkpoints the state there
  during prefill (purely-input reuse: a shared system prompt, first reused by its third
  request).  Leaving the tree exactly at a node end needs no new state.

So every node holds a state (a leaf is a sequence end, an inner node a branch point), and a
lookup hits the deepest node whose whole path the prompt contains: the prefix it reuses is
exactly what the tree holds, KV and state.  The KV of every token is kept (it is paid for
anyway while the request runs).

Memory: ``state_bytes`` per node plus ``kv_bytes_per_token`` per edge token; after each
request the tree evicts until it fits the budget.  Interpretation: eviction runs after the
insertion with the request's own path protected (its nodes are in use, as a running
request's nodes are locked in SGLang), and only when everything else is gone does the
request's own path go, leaf first -- so a request larger than the budget leaves nothing.
"""
from __future__ import annotations

from typing import Any

from sim.marconi import runs as R
from sim.marconi.costs import CostModel
from sim.marconi.slots import Slots


class Node:
    __slots__ = ("parent", "children", "runs", "length", "depth", "slot", "key")

    def __init__(self, parent: Node | None, runs: list[R.Run], depth: int, slot: int):
        self.parent = parent
        self.children: dict[tuple[Any, int], Node] = {}
        self.runs = runs
        self.length = R.total(runs)
        self.depth = depth                      # tokens from the root to this node's end
        self.slot = slot
        self.key = (runs[0][0], runs[0][1]) if runs else None   # its first token


class TreeCache:
    """What Marconi's tree and its "vLLM+" block baseline share: the root, the slot columns,
    the counters, and ``serve`` (look the prompt up, insert prompt + output, evict to the
    budget, return the hit in tokens); each supplies ``lookup``, ``insert`` and
    ``evict_to_budget``."""

    def __init__(self, costs: CostModel, budget_bytes: int):
        self.costs = costs
        self.budget = int(budget_bytes)
        self.slots = Slots()
        self.root = Node(None, [], 0, self.slots.take())
        self.slots.prot[self.root.slot] = True  # never a candidate
        self.by_slot: dict[int, Node] = {self.root.slot: self.root}
        self.used = 0                           # bytes held
        self.clock = 0.0
        self.evictions = 0                      # nodes evicted (leaf removals and state drops)
        self.states_admitted = 0
        self.requests = 0
        self.first_eviction_request: int | None = None   # requests served when eviction began

    def serve(self, request: R.Request) -> int:
        self.requests += 1
        hit = self.lookup(request.prompt_seq())
        path = self.insert(request.full_seq())
        self.evict_to_budget(path)
        return hit

    def lookup(self, seq: R.Seq) -> int:
        raise NotImplementedError

    def insert(self, seq: R.Seq) -> list[Node]:
        raise NotImplementedError

    def evict_to_budget(self, path: list[Node]) -> None:
        raise NotImplementedError


class RadixTree(TreeCache):
    """The cache.  ``serve(request)`` looks the prompt up, inserts prompt + output, evicts to
    the budget and returns the hit in tokens.  ``policy`` is an eviction rule of
    ``sim.marconi.eviction``."""

    def __init__(self, costs: CostModel, budget_bytes: int, policy: Any):
        super().__init__(costs, budget_bytes)
        self.policy = policy

    # ------------------------------------------------------------------ serving

    def lookup(self, seq: R.Seq) -> int:
        """Tokens of the prompt whose prefill a hit skips: the depth of the deepest node whose
        whole path the prompt contains."""
        self.clock += 1
        node, i, off, pos = self.root, 0, 0, 0
        hit_nodes: list[Node] = []
        while pos < seq.length:
            child = node.children.get(seq.key(i, off))
            if child is None:
                break
            m, i, off = seq.match(child.runs, i, off)
            pos += m
            if m < child.length:
                break
            hit_nodes.append(child)
            node = child
        if hit_nodes:
            last = self.slots.last
            for n in (hit_nodes if self.policy.touch_path else hit_nodes[-1:]):
                last[n.slot] = self.clock
            return hit_nodes[-1].depth
        return 0

    def insert(self, seq: R.Seq) -> list[Node]:
        """Insert a finished request's prompt + output; returns the path to its end node."""
        self.clock += 1
        node, i, off, pos = self.root, 0, 0, 0
        path: list[Node] = []
        new: list[Node] = []
        while pos < seq.length:
            child = node.children.get(seq.key(i, off))
            if child is None:                       # leaves the tree at a node end
                leaf = self._add(node, seq.runs(i, off), seq.length)
                path.append(leaf)
                new.append(leaf)
                break
            m, i, off = seq.match(child.runs, i, off)
            pos += m
            if m < child.length:                    # leaves (or ends) inside an edge: branch point
                child = self._split(child, m)
                new.append(child)
            path.append(child)
            node = child
        last = self.slots.last
        for n in (path if self.policy.touch_path else new or path[-1:]):
            last[n.slot] = self.clock
        return path

    # ------------------------------------------------------------------ structure

    def _new_node(self, parent: Node, runs: list[R.Run], depth: int) -> Node:
        node = Node(parent, runs, depth, self.slots.take())
        self.by_slot[node.slot] = node
        self._price(node)
        self.used += self.costs.state_bytes
        self.states_admitted += 1
        return node

    def _add(self, parent: Node, runs: list[R.Run], depth: int) -> Node:
        leaf = self._new_node(parent, runs, depth)
        parent.children[leaf.key] = leaf
        self.slots.kids[parent.slot] += 1
        self.used += self.costs.kv_bytes(leaf.length)
        return leaf

    def _split(self, child: Node, k: int) -> Node:
        """Cut ``child``'s edge after ``k`` tokens: a new node (with a state) ends there."""
        head, tail = R.split(child.runs, k)
        parent = child.parent
        mid = self._new_node(parent, head, child.depth - child.length + k)
        parent.children[mid.key] = mid
        child.runs, child.length = tail, child.length - k
        child.key = (tail[0][0], tail[0][1])
        child.parent = mid
        mid.children[child.key] = child
        self.slots.kids[mid.slot] = 1
        self._price(child)
        return mid

    def _price(self, node: Node) -> None:
        """FLOP efficiency (Eq. 1): what a hit at this node saves over a hit at its parent --
        prefilling the edge's tokens after the parent's prefix -- per byte the node holds
        (its state and its edge's KV).  Interpretation: the saving is counted relative to the
        parent, because evicting the node falls back to the parent's state."""
        c = self.costs
        saved = c.prefill_flops(node.depth - node.length, node.depth)
        held = c.state_bytes + c.kv_bytes(node.length)
        self.slots.eff[node.slot] = saved / held if held else 0.0

    # ------------------------------------------------------------------ eviction

    def evict_to_budget(self, path: list[Node]) -> None:
        if self.used <= self.budget:
            return
        if self.first_eviction_request is None:
            self.first_eviction_request = self.requests
        self.clock += 1
        slots = self.slots
        for n in path:
            slots.prot[n.slot] = True
        protected = True
        while self.used > self.budget:
            idx = slots.candidates(self.policy.max_kids)
            if len(idx) == 0:
                if not protected:
                    break
                for n in path:                      # only the request's own path is left
                    slots.prot[n.slot] = False
                protected = False
                continue
            self._evict(self.by_slot[self.policy.choose(slots, idx, self.clock)])
        for n in path:
            slots.prot[n.slot] = False

    def _evict(self, node: Node) -> None:
        """A leaf goes with its KV and state; a node with one child loses its state and its
        edge joins the child's (the KV stays: the child's prefix needs it)."""
        self.evictions += 1
        parent = node.parent
        self.used -= self.costs.state_bytes
        if not node.children:
            self.used -= self.costs.kv_bytes(node.length)
            del parent.children[node.key]
            self.slots.kids[parent.slot] -= 1
        else:
            (child,) = node.children.values()
            child.runs = R.join(node.runs, child.runs)
            child.length += node.length
            child.key = node.key
            child.parent = parent
            parent.children[node.key] = child
            self._price(child)
        del self.by_slot[node.slot]
        self.slots.give_back(node.slot)

    # ------------------------------------------------------------------ inspection

    def nodes(self) -> list[Node]:
        """Every node but the root, parents before children."""
        return descendants(self.root)

    def cached_prefixes(self) -> list[list[R.Run]]:
        """The token path of every node (each has a state): the prefixes a hit can reuse."""
        out: list[list[R.Run]] = []

        def walk(node: Node, prefix: list[R.Run]) -> None:
            for child in node.children.values():
                p = R.join(prefix, child.runs)
                out.append(p)
                walk(child, p)

        walk(self.root, [])
        return out

    def held_bytes(self) -> int:
        """Bytes recounted from the nodes (``used`` is kept incrementally)."""
        return sum(self.costs.state_bytes + self.costs.kv_bytes(n.length) for n in self.nodes())


def descendants(root: Node) -> list[Node]:
    """Every node below ``root``, parents before children (both trees' inspection)."""
    out: list[Node] = []
    stack = list(root.children.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out
