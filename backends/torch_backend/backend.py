"""The torch backend: every scheduled chunk runs for real on the cache model's blocks.

For each step the engine hands over the scheduled items (request, tokens, cached
context).  The backend

1. performs the copy-on-write copies the cache model queued this step (a partial
   prefix hit's private copy of a KV block; a Mamba partial-tail state moved to its
   own block) *before* the forward, as vLLM's model runner does;
2. runs each item's tokens through the hybrid stack: attention reads the K/V of
   cached positions from the request's full-attention block table and writes its
   own; Mamba resumes from the state in the Mamba block the prefix hit points at
   (or from the request's running state when it continues its own prefill/decode)
   and writes the state after the chunk into the block the cache model keys at
   that position;
3. returns the measured step time (CUDA events on GPU, perf_counter on CPU).

A decode step runs all its scheduled positions: the last sampled token and the
speculative drafts.  The first drafts the acceptance pattern accepts are the tokens
the sequence continues with, the rest are wrong guesses.  K/V is written for every
position (a rejected draft's slot is overwritten when the sequence reaches it) and
the Mamba layers keep one state per position, the state of the last kept token
becoming the request's state (vLLM's align mode with speculative decoding).

With ``verify`` on, the hidden states of every position a request's first prefill
computed (from its resume point) and of its last decode step are compared with an
uncached float32 pass over the same tokens with the same weights (a bfloat16 run
is held to its weights' float32 result, within ``TOLERANCE``): the property every
check-point policy and the speculative roll-back rely on.  ``plant`` deliberately
breaks the run so tests can show the check catches it: ``state_off_by_one`` hands
over the Mamba state of position p-1 as if it were p's at a resume;
``spec_last_state`` keeps the state after the last scheduled draft instead of the
last accepted token's.

Tolerances (max abs error of the hidden states): float32 1e-4; bfloat16 0.25.  On
athena-tiny honest bf16 runs stay below 7.2e-2 of the float32 reference and the
planted off-by-one state misses by 3.2 or more (fp32: 4.9e-6 vs >= 3.2).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from backends.torch_backend.config import TorchModelConfig
from backends.torch_backend.model import HybridStack, forward_chunk
from backends.torch_backend.pools import KVPool, MambaState, StatePool
from sim.cache.hashing import LITERAL
from sim.cache.rules import cdiv

TOLERANCE = {"float32": 1e-4, "bfloat16": 0.25}
_PRIME = 1_000_003


@dataclass
class VerifyRecord:
    request_id: str
    prompt_tokens: int
    resumed_at: int
    max_abs_err: float
    kind: str = "prefill"       # "prefill": its first prefill; "decode": its last decode step


@dataclass
class TorchRunStats:
    records: list[VerifyRecord] = field(default_factory=list)
    forward_s: float = 0.0


class TorchBackend:
    def __init__(self, cfg: TorchModelConfig, kv_manager, scheduler, num_blocks: int,
                 block_size: int, device: str = "cpu", verify: bool = False,
                 plant: str | None = None):
        self.cfg = cfg
        self.device = torch.device(device)
        if self.device.type == "cpu":
            # one thread: small shapes run faster and step times stay repeatable
            # (sim calibrate measures the same way)
            torch.set_num_threads(1)
        self.model = HybridStack(cfg, self.device)
        self.kv = kv_manager
        self.sched = scheduler
        self.block_size = block_size
        self.kv_pool = KVPool(cfg, num_blocks, block_size, self.device)
        self.state_pool = StatePool(cfg, num_blocks, self.device)
        self.running: dict[str, MambaState] = {}
        self.resumed_at: dict[str, int] = {}
        self.verify = verify
        self.plant = plant
        self.stats = TorchRunStats()
        self.cuda = self.device.type == "cuda"
        self.prefill_hs: dict[str, list[torch.Tensor]] = {}
        # The check's reference: one uncached pass of the same weights in float32.  A bf16 run
        # is held to what its weights compute, not to another bf16 run's rounding.
        self.reference = self.model if cfg.dtype == "float32" else fp32_copy(self.model)

    # ----------------------------------------------------------------- tokens --
    def token_ids(self, sim_req, start: int, end: int) -> torch.Tensor:
        """Token ids of positions [start, end): stream tokens hashed into the vocab;
        positions past the known tokens are this request's next output tokens."""
        c = sim_req.cache
        vocab = self.cfg.vocab
        parts = []
        pos = 0
        for s, st, n in c.runs:
            lo, hi = max(start, pos), min(end, pos + n)
            if lo < hi:
                idx = torch.arange(st + lo - pos, st + hi - pos, dtype=torch.int64)
                base = 0 if s == LITERAL else (s * _PRIME) % vocab
                parts.append((idx + base) % vocab)
            pos += n
        if end > pos:
            # not yet appended output tokens: stream out/<id> continues after the prompt
            first = max(start, pos) - c.num_prompt_tokens
            idx = torch.arange(first, first + end - max(start, pos), dtype=torch.int64)
            parts.append((idx + (sim_req.out_stream * _PRIME) % vocab) % vocab)
        return torch.cat(parts).to(self.device)

    # ------------------------------------------------------------------ steps --
    def _copies(self) -> None:
        for kind, src, dst in self.kv.last_copies:
            if kind == "mamba":
                self.state_pool.copy(src.block_id, dst.block_id)
            elif kind == "full":
                for layer_kv in self.kv_pool.kv:
                    layer_kv[dst.block_id].copy_(layer_kv[src.block_id])

    def _accepted(self, it) -> tuple[int, int]:
        """(tokens of the item that are the sequence's own, tokens the step keeps).

        A prefill chunk is all its own.  A decode step schedules the last sampled token and
        ``spec_tokens`` drafts; the first ``acc`` drafts are accepted (they equal the tokens
        the sequence goes on with), the rest are rejected guesses (padding drafts of a new
        request are never accepted).  The step keeps 1 + acc, cut where the request reaches
        its ``max_tokens`` (read as the scheduler's update will)."""
        if it.is_prefill:
            return it.num_tokens, it.num_tokens
        s = self.sched
        if it.padded:
            acc = 0
        else:
            if s.accept_list is not None:
                al = s.accept_list
                acc = al[min(s.sched_time, len(al) - 1)]
            else:
                acc = s.accepted_at(s.step_index)
            acc = min(acc, it.spec_tokens)
        own = 1 + acc
        r = it.req
        left = r.max_tokens - r.num_output
        return own, max(1, min(own, left))

    def draft_ids(self, sim_req, start: int, own: int, n: int) -> torch.Tensor:
        """Token ids of a decode step's ``n`` scheduled positions from ``start``: the first
        ``own`` are the sequence's own tokens (the last sampled one and the accepted drafts),
        the rest rejected drafts -- each a token the sequence does *not* continue with."""
        ids = self.token_ids(sim_req, start, start + n)
        if own < n:
            ids = ids.clone()
            ids[own:] = (ids[own:] + 1) % self.cfg.vocab
        return ids

    def step_time(self, items) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            t_start = torch.cuda.Event(enable_timing=True)
            t_end = torch.cuda.Event(enable_timing=True)
            t_start.record()
        t0 = time.perf_counter()
        self._copies()
        pending_verify = []
        bs = self.block_size
        for it in items:
            r = it.req
            c = r.cache
            rid = c.request_id
            start = it.context
            n = it.num_tokens
            own, kept = self._accepted(it)
            end = start + kept
            fa = [b.block_id for b in self.kv.group_blocks(c, "full")]
            mb = self.kv.group_blocks(c, "mamba")
            if start == 0:
                state_in = None
                self.resumed_at[rid] = 0
                self.prefill_hs.pop(rid, None)       # (a recompute after preemption)
            elif rid in self.running and it.new_hit == 0:
                state_in = self.running[rid]
            else:
                # a prefix hit: resume from the state keyed in the hit's Mamba block
                self.resumed_at[rid] = start
                self.prefill_hs.pop(rid, None)
                state_in = self._resume_state(r, start, mb)
            with torch.inference_mode():
                if it.is_prefill:
                    hs, state_out = self.model.run(self.token_ids(r, start, end), start, fa,
                                                   self.kv_pool, state_in)
                else:
                    # every scheduled position runs, drafts included (their K/V is written;
                    # a rejected draft's is overwritten when the sequence reaches that
                    # position); the Mamba layers keep one state per position and the state
                    # of the last kept token becomes the request's state
                    hs, states = self.model.run(self.draft_ids(r, start, own, n), start, fa,
                                                self.kv_pool, state_in, steps=True)
                    pick = n - 1 if self.plant == "spec_last_state" else kept - 1
                    state_out = states[pick].clone()
            self.running[rid] = state_out
            idx = cdiv(end, bs) - 1
            if idx < len(mb) and not mb[idx].is_null:
                self.state_pool.store(mb[idx].block_id, state_out)
            if self.verify:
                self._collect(it, r, hs[:kept], start, end, pending_verify)
        if self.cuda:
            t_end.record()
            torch.cuda.synchronize()
            dt = t_start.elapsed_time(t_end) / 1e3
        else:
            dt = time.perf_counter() - t0
        self.stats.forward_s += dt
        for kind, r, hs, lo, end in pending_verify:   # not timed
            with torch.inference_mode():
                ref, _ = self.reference.run(self.token_ids(r, 0, end), 0,
                                            list(range(cdiv(end, self.block_size))),
                                            self._ref_pool(end), None)
            err = float((hs.float() - ref[lo:end].float()).abs().max())
            self.stats.records.append(VerifyRecord(
                r.cache.request_id, r.cache.num_prompt_tokens,
                self.resumed_at.get(r.cache.request_id, 0), err, kind))
        return dt

    # ----------------------------------------------------------------- verify --
    def _collect(self, it, r, hs, start: int, end: int, pending: list) -> None:
        """Keep what the check compares: every position the request's first prefill computed
        (from its resume point to the end of the prompt), and, on the step that finishes it,
        the last kept decode position (after all its speculative steps)."""
        rid = r.cache.request_id
        if (it.is_prefill or it.padded) and not r.first_prefill_done:
            self.prefill_hs.setdefault(rid, []).append(hs)
            if end >= r.cache.num_tokens:
                got = torch.cat(self.prefill_hs.pop(rid))
                pending.append(("prefill", r, got, end - got.shape[0], end))
        elif not it.is_prefill and r.max_tokens - r.num_output <= end - start:
            pending.append(("decode", r, hs[-1:], end - 1, end))

    def _ref_pool(self, n: int) -> KVPool | None:
        if not self.cfg.num_attention_layers:
            return None
        return KVPool(self.reference.cfg, cdiv(n, self.block_size), self.block_size, self.device)

    def _resume_state(self, r, start: int, mamba_blocks) -> MambaState:
        if self.plant == "state_off_by_one":
            # the bug a check-point policy must never have: the state of p-1 used as p's
            with torch.inference_mode():
                ids = self.token_ids(r, 0, start - 1)
                pool = KVPool(self.cfg, cdiv(start, self.block_size) + 1, self.block_size,
                              self.device)
                _, st = forward_chunk(self.model, ids, 0,
                                      list(range(cdiv(start, self.block_size) + 1)), pool,
                                      self.block_size, None)
            return st
        blk = mamba_blocks[cdiv(start, self.block_size) - 1]
        if blk.is_null:
            raise RuntimeError(f"{r.cache.request_id}: no Mamba state block at the hit {start}")
        return self.state_pool.load(blk.block_id)

    def forget(self, rid: str) -> None:
        self.running.pop(rid, None)
        self.resumed_at.pop(rid, None)
        self.prefill_hs.pop(rid, None)


def fp32_copy(model: HybridStack) -> HybridStack:
    """``model`` with the same (already rounded) weights in float32."""
    ref = HybridStack(model.cfg.with_(dtype="float32"), model.device)
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return ref
