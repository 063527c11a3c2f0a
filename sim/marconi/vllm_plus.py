"""vLLM+ (the paper's §5.1 baseline): vLLM's block-level prefix caching extended to hybrid
models by checkpointing an SSM state at the end of *every* token block (block size 32, the
finest the paper's vLLM+ supported), with vLLM's LRU eviction.

A block is cached as a unit -- the KV of its ``block_size`` tokens plus the state at its end --
and only whole blocks are cached (vLLM hashes full blocks only; interpretation: the paper's
description does not mention partial blocks).  A lookup hits the longest run of cached
blocks along the prompt, so a hit is always a multiple of the block size.

Held compactly: a radix tree whose edges are runs of whole blocks (children keyed by their
first block), every block in a node last used at the same time.  A request touches every
block of its prompt + output, so a parent is never older than its children and vLLM's LRU
free queue (least recently used first, a request's blocks freed tail first) always evicts
the tail block of the least recently used leaf: eviction trims that leaf block by block.
"""
from __future__ import annotations

from sim.marconi import runs as R
from sim.marconi.costs import CostModel
from sim.marconi.tree import Node, TreeCache, descendants


class BlockTree(TreeCache):
    """``serve(request)`` as :class:`sim.marconi.tree.RadixTree`'s; ``evictions`` counts blocks."""

    def __init__(self, costs: CostModel, budget_bytes: int, block_size: int = 32):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        super().__init__(costs, budget_bytes)
        self.block = int(block_size)
        self.block_bytes = costs.state_bytes + costs.kv_bytes(self.block)

    def _key(self, runs: list[R.Run]) -> tuple:
        return tuple(R.split(runs, self.block)[0] if R.total(runs) > self.block else runs)

    def lookup(self, seq: R.Seq) -> int:
        """Tokens of the longest run of cached whole blocks the prompt starts with."""
        B = self.block
        node, i, off, pos = self.root, 0, 0, 0
        while pos + B <= seq.length:
            child = node.children.get(tuple(seq.runs(i, off, B)))
            if child is None:
                break
            m, i, off = seq.match(child.runs, i, off)
            full = m // B * B
            pos += full
            if full < child.length:
                break
            node = child
        return pos

    def insert(self, seq: R.Seq) -> list[Node]:
        """Cache the whole blocks of prompt + output; every block on the path becomes most
        recently used.  Returns the path."""
        self.clock += 1
        B = self.block
        end = seq.length // B * B
        node, i, off, pos = self.root, 0, 0, 0
        path: list[Node] = []
        while pos < end:
            child = node.children.get(tuple(seq.runs(i, off, B)))
            if child is None:
                leaf = Node(node, seq.runs(i, off, end - pos), end, self.slots.take())
                leaf.key = self._key(leaf.runs)
                self.by_slot[leaf.slot] = leaf
                node.children[leaf.key] = leaf
                self.slots.kids[node.slot] += 1
                blocks = leaf.length // B
                self.used += blocks * self.block_bytes
                self.states_admitted += blocks
                path.append(leaf)
                break
            m, i2, off2 = seq.match(child.runs, i, off)
            full = m // B * B
            if full < child.length:
                child = self._split(child, full)
                i, off = seq.advance(i, off, full)
            else:
                i, off = i2, off2
            pos += full
            path.append(child)
            node = child
        last = self.slots.last
        for n in path:
            last[n.slot] = self.clock
        return path

    def _split(self, child: Node, k: int) -> Node:
        head, tail = R.split(child.runs, k)
        parent = child.parent
        mid = Node(parent, head, child.depth - child.length + k, self.slots.take())
        mid.key = child.key
        self.by_slot[mid.slot] = mid
        self.slots.last[mid.slot] = self.slots.last[child.slot]
        parent.children[mid.key] = mid
        child.runs, child.length, child.parent = tail, child.length - k, mid
        child.key = self._key(tail)
        mid.children[child.key] = child
        self.slots.kids[mid.slot] = 1
        return mid

    def evict_to_budget(self, path: list[Node]) -> None:
        if self.used <= self.budget:
            return
        if self.first_eviction_request is None:
            self.first_eviction_request = self.requests
        slots = self.slots
        for n in path:
            slots.prot[n.slot] = True
        protected = True
        B = self.block
        while self.used > self.budget:
            idx = slots.candidates(0)
            if len(idx) == 0:
                if not protected:
                    break
                for n in path:
                    slots.prot[n.slot] = False
                protected = False
                continue
            leaf = self.by_slot[int(idx[int(slots.last[idx].argmin())])]
            need = -(-(self.used - self.budget) // self.block_bytes)
            k = min(leaf.length // B, need)
            self.used -= k * self.block_bytes
            self.evictions += k
            if k * B == leaf.length:
                parent = leaf.parent
                del parent.children[leaf.key]
                slots.kids[parent.slot] -= 1
                del self.by_slot[leaf.slot]
                slots.give_back(leaf.slot)
            else:
                leaf.runs = R.split(leaf.runs, leaf.length - k * B)[0]
                leaf.length -= k * B
                leaf.depth -= k * B
        for n in path:                              # (a slot freed above is not reused yet)
            slots.prot[n.slot] = False

    def nodes(self) -> list[Node]:
        return descendants(self.root)

    def cached_prefixes(self) -> list[list[R.Run]]:
        """Every cached block end's token path: the prefixes a hit can reuse."""
        out: list[list[R.Run]] = []
        B = self.block

        def walk(node: Node, prefix: list[R.Run]) -> None:
            for child in node.children.values():
                for k in range(B, child.length + 1, B):
                    out.append(R.join(prefix, R.split(child.runs, k)[0] if k < child.length
                                      else child.runs))
                walk(child, R.join(prefix, child.runs))

        walk(self.root, [])
        return out

    def held_bytes(self) -> int:
        return sum(n.length // self.block for n in self.nodes()) * self.block_bytes
