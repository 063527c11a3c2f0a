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

Rules where Marconi's published code differs (``sim.marconi.rules``):

* ``partial_block: true`` caches a sequence's last, partial block too -- a node of its own
  (its KV and a state), always a leaf, keyed by its tokens.  A lookup that has matched every
  whole block it can then hits the first such partial child (in the order cached) whose tokens
  the prompt contains; an insertion that finds a partial child it contains, and no child
  matching more of the next block, fills it with its own tokens (the node becomes a whole
  block, its key and place among its siblings renewed) and goes on below it;
* ``evict: before-insert`` evicts before the insertion, by the code's estimate (a state and a
  block of KV for every block past the blocks the sequence matches, the root counted as one
  of them), nothing protected; a lookup and the match before the insertion tick the clock and
  refresh every whole block they match, as the insertion refreshes its path (a node is split
  where a refresh ends, so that its blocks still share one time).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any

from sim.marconi import runs as R
from sim.marconi.costs import CostModel
from sim.marconi.rules import DEFAULT, Rules
from sim.marconi.tree import Node, TreeCache, descendants


class BlockTree(TreeCache):
    """``serve(request)`` as :class:`sim.marconi.tree.RadixTree`'s; ``evictions`` counts blocks
    (a partial block counts one)."""

    def __init__(self, costs: CostModel, budget_bytes: int, block_size: int = 32,
                 rules: Rules = DEFAULT):
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        super().__init__(costs, budget_bytes, rules)
        self.block = int(block_size)
        self.block_bytes = costs.state_bytes + costs.kv_bytes(self.block)
        self.partial = rules.partial_block
        self.clocked = rules.before_insert          # lookups tick and refresh

    def _key(self, runs: list[R.Run]) -> tuple:
        return tuple(R.split(runs, self.block)[0] if R.total(runs) > self.block else runs)

    # ------------------------------------------------------------------ serving

    def lookup(self, seq: R.Seq) -> int:
        """Tokens of the longest run of cached whole blocks the prompt starts with (and, with
        ``partial_block``, of a cached partial block after them)."""
        if self.clocked:
            self.clock += 1
        node, i, off, pos, at_end = self._descend(seq)
        if self.partial and at_end:
            part = self._contained_partial(node, seq, i, off)
            if part is not None:
                pos += part.length
        return pos

    def probe(self, seq: R.Seq) -> Fraction:
        """Marconi's estimate of what inserting ``seq`` adds: a state and a block of KV for
        every block past the nodes its match reaches, the root counted as one of them."""
        self.clock += 1
        node, i, off, pos, at_end = self._descend(seq)
        nodes = 1 + pos // self.block
        if self.partial and at_end and self._contained_partial(node, seq, i, off) is not None:
            nodes += 1
        extra = seq.length - self.block * nodes
        c = self.costs
        return Fraction(extra * c.state_bytes, self.block) + c.kv_bytes(extra)

    def _descend(self, seq: R.Seq) -> tuple[Node, int, int, int, bool]:
        """Match whole blocks down the tree: the last node reached, the cursor and tokens
        after it, and whether the match stopped at that node's end (not inside an edge).  On
        the code's clock the blocks matched are refreshed (a node split where they end)."""
        B = self.block
        node, i, off, pos = self.root, 0, 0, 0
        last = self.slots.last
        while pos + B <= seq.length:
            child = node.children.get(tuple(seq.runs(i, off, B)))
            if child is None:
                break
            m, i2, off2 = seq.match(child.runs, i, off)
            full = m // B * B
            if full < child.length:
                if self.clocked:
                    child = self._split(child, full)
                    last[child.slot] = self.clock
                i, off = seq.advance(i, off, full)
                return child, i, off, pos + full, False
            i, off = i2, off2
            pos += full
            node = child
            if self.clocked:
                last[node.slot] = self.clock
        return node, i, off, pos, True

    def _contained_partial(self, node: Node, seq: R.Seq, i: int, off: int) -> Node | None:
        """The first partial child of ``node`` (in the order cached) whose tokens ``seq``
        holds from cursor ``(i, off)``."""
        B = self.block
        for child in node.children.values():
            if child.length < B and seq.match(child.runs, i, off)[0] == child.length:
                return child
        return None

    def _partial_to_fill(self, node: Node, seq: R.Seq, i: int, off: int) -> Node | None:
        """Insertion, no child matching the next whole block: the partial child the sequence
        contains, provided no child of ``node`` matches more of the sequence's next block."""
        B = self.block
        first = seq.key(i, off)
        best = 0
        found: Node | None = None
        for child in node.children.values():
            k0 = child.key[0]
            if (k0[0], k0[1]) != first:
                continue
            m = seq.match(list(child.key), i, off)[0]
            if m > best:
                best = m
                found = child if child.length < B and m == child.length else None
            elif m == best and found is None and child.length < B and m == child.length:
                found = child
        return found

    def insert(self, seq: R.Seq, tick: bool = True) -> list[Node]:
        """Cache the whole blocks of prompt + output (and the partial last block with
        ``partial_block``); every block on the path becomes most recently used.  Returns the
        path."""
        if tick:
            self.clock += 1
        B = self.block
        end = seq.length if self.partial else seq.length // B * B
        node, i, off, pos = self.root, 0, 0, 0
        path: list[Node] = []
        while pos < end:
            child = node.children.get(tuple(seq.runs(i, off, B))) if end - pos >= B else None
            if child is None:
                if self.partial:
                    part = self._partial_to_fill(node, seq, i, off)
                    if part is not None:
                        path.extend(self._fill(node, part, seq, i, off, end - pos))
                        break
                path.extend(self._add(node, seq, i, off, end - pos))
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

    def _add(self, parent: Node, seq: R.Seq, i: int, off: int, tokens: int) -> list[Node]:
        """New nodes below ``parent`` for ``tokens`` tokens from cursor ``(i, off)``: one for
        the whole blocks, one for a partial block after them."""
        B = self.block
        full = tokens // B * B
        out: list[Node] = []
        if full:
            leaf = self._node(parent, seq.runs(i, off, full))
            blocks = full // B
            self.used += blocks * self.block_bytes
            self.states_admitted += blocks
            out.append(leaf)
            parent = leaf
            i, off = seq.advance(i, off, full)
        if tokens > full:
            out.append(self._new_partial(parent, seq.runs(i, off, tokens - full)))
        return out

    def _new_partial(self, parent: Node, runs: list[R.Run]) -> Node:
        part = self._node(parent, runs)
        self.used += self.costs.state_bytes + self.costs.kv_bytes(part.length)
        self.states_admitted += 1
        return part

    def _node(self, parent: Node, runs: list[R.Run]) -> Node:
        node = Node(parent, runs, parent.depth + R.total(runs), self.slots.take())
        node.key = self._key(node.runs)
        self.by_slot[node.slot] = node
        parent.children[node.key] = node
        self.slots.kids[parent.slot] += 1
        return node

    def _fill(self, parent: Node, part: Node, seq: R.Seq, i: int, off: int,
              tokens: int) -> list[Node]:
        """The partial child ``part``, which the sequence's next ``tokens`` tokens contain,
        takes them: up to a whole block in place (its key renewed, its place among its
        siblings now the last), the rest below it."""
        if tokens == part.length:
            return [part]
        B = self.block
        c = self.costs
        self.used -= c.state_bytes + c.kv_bytes(part.length)
        del parent.children[part.key]
        own = min(tokens, B) if tokens < B else tokens // B * B
        part.runs = seq.runs(i, off, own)
        part.length = own
        part.depth = parent.depth + own
        part.key = self._key(part.runs)
        parent.children[part.key] = part
        if own < B:
            self.used += c.state_bytes + c.kv_bytes(own)
            self.states_admitted += 1
            return [part]
        blocks = own // B
        self.used += blocks * self.block_bytes
        self.states_admitted += blocks
        out = [part]
        if tokens > own:
            i, off = seq.advance(i, off, own)
            out.append(self._new_partial(part, seq.runs(i, off, tokens - own)))
        return out

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

    # ------------------------------------------------------------------ eviction

    def evict_to_budget(self, path: list[Node]) -> None:
        if self.used <= self.budget:
            return
        self._begin_eviction()
        slots = self.slots
        for n in path:
            slots.prot[n.slot] = True
        protected = True
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
            self._trim(leaf, self.used - self.budget)
        for n in path:                              # (a slot freed above is not reused yet)
            slots.prot[n.slot] = False

    def evict_bytes(self, amount: Any) -> None:
        self._begin_eviction()
        self.clock += 1
        slots = self.slots
        freed: Any = 0
        while freed < amount:
            idx = slots.candidates(0)
            if len(idx) == 0:
                break
            leaf = self.by_slot[int(idx[int(slots.last[idx].argmin())])]
            freed += self._trim(leaf, amount - freed)

    def _trim(self, leaf: Node, excess: Any) -> int:
        """Evict the tail blocks of ``leaf`` that ``excess`` bytes need (all of them at most;
        a partial block goes whole).  Returns the bytes freed."""
        B = self.block
        if leaf.length < B:
            freed = self.costs.state_bytes + self.costs.kv_bytes(leaf.length)
            k = 1
            gone = True
        else:
            need = -(-excess // self.block_bytes)
            k = min(leaf.length // B, need)
            freed = k * self.block_bytes
            gone = k * B == leaf.length
        self.used -= freed
        self.evictions += k
        if gone:
            parent = leaf.parent
            del parent.children[leaf.key]
            self.slots.kids[parent.slot] -= 1
            del self.by_slot[leaf.slot]
            self.slots.give_back(leaf.slot)
        else:
            leaf.runs = R.split(leaf.runs, leaf.length - k * B)[0]
            leaf.length -= k * B
            leaf.depth -= k * B
        return freed

    # ------------------------------------------------------------------ inspection

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
                if child.length < B:
                    out.append(R.join(prefix, child.runs))
                walk(child, R.join(prefix, child.runs))

        walk(self.root, [])
        return out

    def held_bytes(self) -> int:
        B = self.block
        c = self.costs
        return sum(n.length // B * self.block_bytes if n.length >= B
                   else c.state_bytes + c.kv_bytes(n.length) for n in self.nodes())
