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

The rules where Marconi's published code reads the paper otherwise (``sim.marconi.rules``):
``evict: before-insert`` evicts before the insertion, by the code's estimate of the bytes it
will add, with nothing protected and on the code's clock (a match before the insertion ticks
and refreshes as a lookup does); ``lru_refresh: descended`` also refreshes the node a match
leaves in the middle of its edge; ``merge_time: later`` gives a node merged into its child the
later of the two accesses; ``flops`` and ``efficiency_bytes`` price a node's FLOP efficiency.
"""
from __future__ import annotations

from typing import Any

from sim.marconi import runs as R
from sim.marconi.costs import CostModel
from sim.marconi.rules import DEFAULT, Rules
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
    ``evict_to_budget`` and, for ``evict: before-insert``, ``probe`` and ``evict_bytes``."""

    def __init__(self, costs: CostModel, budget_bytes: int, rules: Rules = DEFAULT):
        self.costs = costs
        self.rules = rules
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

    def serve(self, request: R.Request, on_insert: Any = None) -> int:
        """Serve one request; ``on_insert`` (a callable) runs between the lookup and the
        eviction -- after the insertion's first clock tick with ``evict: before-insert``, as
        Marconi's code tunes alpha inside the insertion -- and may read ``last_hit``."""
        return self.serve_seqs(request.prompt_seq(), request.full_seq(), on_insert)

    def serve_seqs(self, prompt: R.Seq, seq: R.Seq, on_insert: Any = None) -> int:
        """``serve`` from a request's prompt and prompt + output, laid out already (a replay
        of the same requests many times lays them out once)."""
        self.requests += 1
        hit = self.last_hit = self.lookup(prompt)
        if self.rules.before_insert:
            self.clock += 1                         # the insertion begins
            if on_insert is not None:
                on_insert()
            need = self.probe(seq)
            if self.used + need > self.budget:
                self.evict_bytes(self.used + need - self.budget)
            self.insert(seq, tick=False)
            return hit
        path = self.insert(seq)
        if on_insert is not None:
            on_insert()
        self.evict_to_budget(path)
        return hit

    def lookup(self, seq: R.Seq) -> int:
        raise NotImplementedError

    def insert(self, seq: R.Seq, tick: bool = True) -> list[Node]:
        raise NotImplementedError

    def evict_to_budget(self, path: list[Node]) -> None:
        raise NotImplementedError

    def probe(self, seq: R.Seq) -> Any:
        """``evict: before-insert``: the match Marconi's code runs before an insertion (a clock
        tick; refreshes as a lookup) and its estimate of the bytes the insertion adds."""
        raise NotImplementedError

    def evict_bytes(self, amount: Any) -> None:
        """``evict: before-insert``: evict until at least ``amount`` bytes are freed."""
        raise NotImplementedError

    def _begin_eviction(self) -> None:
        if self.first_eviction_request is None:
            self.first_eviction_request = self.requests


class RadixTree(TreeCache):
    """The cache.  ``serve(request)`` looks the prompt up, inserts prompt + output, evicts to
    the budget and returns the hit in tokens.  ``policy`` is an eviction rule of
    ``sim.marconi.eviction``."""

    def __init__(self, costs: CostModel, budget_bytes: int, policy: Any, rules: Rules = DEFAULT):
        super().__init__(costs, budget_bytes, rules)
        self.policy = policy
        self._descended = rules.lru_refresh == "descended"
        self._later = rules.merge_time == "later"
        self._layers = None
        if rules.flops == "marconi":
            if costs.layers is None:
                from sim.errors import ConfigError
                raise ConfigError("marconi.rules.flops", "marconi needs the model's layer shapes "
                                  "(a catalogue model or a CostModel with layers)")
            self._layers = costs.layers
        self._prefix_bytes = rules.efficiency_bytes == "prefix"

    # ------------------------------------------------------------------ serving

    def lookup(self, seq: R.Seq) -> int:
        """Tokens of the prompt whose prefill a hit skips: the depth of the deepest node whose
        whole path the prompt contains."""
        self.clock += 1
        hit_nodes, left, _ = self._match(seq)
        return hit_nodes[-1].depth if hit_nodes else 0

    def probe(self, seq: R.Seq) -> int:
        """Marconi's estimate: a state (two when the sequence leaves an edge in the middle: the
        branch point's too) and the KV of the tokens past the longest match."""
        self.clock += 1
        _, left, matched = self._match(seq)
        c = self.costs
        return (2 if left is not None else 1) * c.state_bytes + c.kv_bytes(seq.length - matched)

    def _match(self, seq: R.Seq) -> tuple[list[Node], Node | None, int]:
        """Walk ``seq`` down the tree and refresh what a match refreshes: the nodes whose
        whole edge it contains, the node whose edge it leaves in the middle (if any) and the
        tokens matched in all."""
        node, i, off, pos = self.root, 0, 0, 0
        hit_nodes: list[Node] = []
        left: Node | None = None
        while pos < seq.length:
            child = node.children.get(seq.key(i, off))
            if child is None:
                break
            m, i, off = seq.match(child.runs, i, off)
            pos += m
            if m < child.length:
                left = child
                break
            hit_nodes.append(child)
            node = child
        last = self.slots.last
        if hit_nodes:
            for n in (hit_nodes if self.policy.touch_path else hit_nodes[-1:]):
                last[n.slot] = self.clock
        if left is not None and self._descended and self.policy.touch_path:
            last[left.slot] = self.clock
        return hit_nodes, left, pos

    def insert(self, seq: R.Seq, tick: bool = True) -> list[Node]:
        """Insert a finished request's prompt + output; returns the path to its end node.
        ``tick``: False when the insertion's clock tick came before (``before-insert``)."""
        if tick:
            self.clock += 1
        node, i, off, pos = self.root, 0, 0, 0
        path: list[Node] = []
        new: list[Node] = []
        tails: list[Node] = []
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
                tails.append(child)
                child = self._split(child, m)
                new.append(child)
            path.append(child)
            node = child
        last = self.slots.last
        if self.policy.touch_path:
            touched = path
            if self._descended and tick:            # (before-insert: refreshed by the probe)
                touched = path + tails
        elif tick:
            touched = new or path[-1:]
        else:                                       # the probe refreshed the deepest match
            touched = new
        for n in touched:
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
        parent = node.depth - node.length
        if self._layers is not None:
            saved: float = self._layers.node_saving(parent, node.depth)
        else:
            saved = c.prefill_flops(parent, node.depth)
        held = c.state_bytes + c.kv_bytes(node.depth if self._prefix_bytes else node.length)
        self.slots.eff[node.slot] = saved / held if held else 0.0

    # ------------------------------------------------------------------ eviction

    def evict_to_budget(self, path: list[Node]) -> None:
        if self.used <= self.budget:
            return
        self._begin_eviction()
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

    def evict_bytes(self, amount: int) -> None:
        self._begin_eviction()
        self.clock += 1
        slots = self.slots
        freed = 0
        while freed < amount:
            idx = slots.candidates(self.policy.max_kids)
            if len(idx) == 0:
                break
            chosen = self.policy.choose(slots, idx, self.clock, self._first_in_tree_order)
            freed += self._evict(self.by_slot[chosen])

    def _first_in_tree_order(self, idx: Any) -> int:
        """Of the slots ``idx`` (tied candidates), the one whose node comes first depth first,
        children in the order they were first cached (the order Marconi's code lists them)."""
        def position(slot: int) -> tuple[int, ...]:
            node = self.by_slot[int(slot)]
            out: list[int] = []
            while node.parent is not None:
                out.append(list(node.parent.children.values()).index(node))
                node = node.parent
            return tuple(reversed(out))

        return int(min(idx, key=position))

    def _evict(self, node: Node) -> int:
        """A leaf goes with its KV and state; a node with one child loses its state and its
        edge joins the child's (the KV stays: the child's prefix needs it).  Returns the bytes
        freed."""
        self.evictions += 1
        parent = node.parent
        freed = self.costs.state_bytes
        if not node.children:
            freed += self.costs.kv_bytes(node.length)
            del parent.children[node.key]
            self.slots.kids[parent.slot] -= 1
        else:
            (child,) = node.children.values()
            child.runs = R.join(node.runs, child.runs)
            child.length += node.length
            child.key = node.key
            child.parent = parent
            parent.children[node.key] = child
            if self._later:
                last = self.slots.last
                last[child.slot] = max(last[child.slot], last[node.slot])
            self._price(child)
        self.used -= freed
        del self.by_slot[node.slot]
        self.slots.give_back(node.slot)
        return freed

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
