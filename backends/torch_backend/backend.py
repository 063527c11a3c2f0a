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

With ``verify`` on, each request's last-token hidden state at the end of its
prefill is compared with a from-scratch prefill of the same tokens: the property
every check-point policy relies on.  ``plant`` deliberately breaks a resume (hands
over the Mamba state of position p-1 as if it were p's) so tests can show the
check catches it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from backends.torch_backend.config import TorchModelConfig
from backends.torch_backend.model import HybridStack, forward_chunk, forward_scratch
from backends.torch_backend.pools import KVPool, MambaState, StatePool
from sim.cache.hashing import LITERAL
from sim.cache.rules import cdiv

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}
_PRIME = 1_000_003


@dataclass
class VerifyRecord:
    request_id: str
    prompt_tokens: int
    resumed_at: int
    max_abs_err: float


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

    def _kept_tokens(self, it) -> int:
        if it.is_prefill:
            return it.num_tokens
        s = self.sched
        if s.accept_list is not None:
            al = s.accept_list
            acc = al[min(s.sched_time, len(al) - 1)]
        else:
            acc = s.accepted_at(s.step_index)
        return 1 + min(acc, it.spec_tokens)

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
            n = self._kept_tokens(it)
            end = start + n
            fa = [b.block_id for b in self.kv.group_blocks(c, "full")]
            mb = self.kv.group_blocks(c, "mamba")
            if start == 0:
                state_in = None
                self.resumed_at[rid] = 0
            elif rid in self.running and it.new_hit == 0:
                state_in = self.running[rid]
            else:
                # a prefix hit: resume from the state keyed in the hit's Mamba block
                self.resumed_at[rid] = start
                state_in = self._resume_state(r, start, mb)
            ids = self.token_ids(r, start, end)
            with torch.inference_mode():
                last, state_out = forward_chunk(self.model, ids, start, fa, self.kv_pool, bs,
                                                state_in)
            self.running[rid] = state_out
            idx = cdiv(end, bs) - 1
            if idx < len(mb) and not mb[idx].is_null:
                self.state_pool.store(mb[idx].block_id, state_out)
            if (self.verify and it.is_prefill and end == c.num_tokens
                    and not r.first_prefill_done):
                pending_verify.append((r, last, end))
        if self.cuda:
            t_end.record()
            torch.cuda.synchronize()
            dt = t_start.elapsed_time(t_end) / 1e3
        else:
            dt = time.perf_counter() - t0
        self.stats.forward_s += dt
        for r, last, end in pending_verify:   # not timed
            with torch.inference_mode():
                ref = forward_scratch(self.model, self.token_ids(r, 0, end), self.block_size)
            err = float((last.float() - ref.float()).abs().max())
            self.stats.records.append(VerifyRecord(r.cache.request_id, r.cache.num_prompt_tokens,
                                                   self.resumed_at.get(r.cache.request_id, 0), err))
        return dt

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
