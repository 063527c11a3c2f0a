"""The torch backend: every scheduled chunk runs for real on the cache model's blocks.

For each step the engine hands over a step plan (``backends.base.StepPlan``: per scheduled
request its tokens, the new tokens, the cached context, the drafts accepted and the tokens
kept); the backend reads nothing else of the engine or the scheduler.  It

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
speculative drafts.  The first ``accepted`` drafts (the plan says how many) are the tokens
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
planted off-by-one state misses by 3.2 or more (fp32: below 1e-5, 3.3e-6 to 5.0e-6 seen so
far as the measured step times change what runs together, vs >= 3.2).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from backends.base import StepItem, StepPlan
from backends.torch_backend.config import TorchModelConfig
from backends.torch_backend.model import HybridStack, forward_chunk
from backends.torch_backend.pools import KVPool, MambaState, StatePool
from sim.cache.hashing import LITERAL
from sim.cache.rules import cdiv
from sim.errors import ConfigError

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
    jumps = False   # every step runs for real

    def __init__(self, cfg: TorchModelConfig, kv_manager, num_blocks: int,
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
    def token_ids(self, it: StepItem, start: int, end: int) -> torch.Tensor:
        """Token ids of positions [start, end) of ``it``'s request: stream tokens hashed into
        the vocab; positions past the known tokens are this request's next output tokens."""
        c = it.tokens
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
            parts.append((idx + (it.out_stream * _PRIME) % vocab) % vocab)
        return torch.cat(parts).to(self.device)

    # ------------------------------------------------------------------ steps --
    def _copies(self) -> None:
        for kind, src, dst in self.kv.last_copies:
            if kind == "mamba":
                self.state_pool.copy(src.block_id, dst.block_id)
            elif kind == "full":
                for layer_kv in self.kv_pool.kv:
                    layer_kv[dst.block_id].copy_(layer_kv[src.block_id])

    def draft_ids(self, it: StepItem, start: int, own: int, n: int) -> torch.Tensor:
        """Token ids of a decode step's ``n`` scheduled positions from ``start``: the first
        ``own`` are the sequence's own tokens (the last sampled one and the accepted drafts),
        the rest rejected drafts -- each a token the sequence does *not* continue with."""
        ids = self.token_ids(it, start, start + n)
        if own < n:
            ids = ids.clone()
            ids[own:] = (ids[own:] + 1) % self.cfg.vocab
        return ids

    def step_time(self, plan: StepPlan) -> float:
        for rid in plan.finished:
            self.forget(rid)
        if self.cuda:
            torch.cuda.synchronize()
            t_start = torch.cuda.Event(enable_timing=True)
            t_end = torch.cuda.Event(enable_timing=True)
            t_start.record()
        t0 = time.perf_counter()
        self._copies()
        pending_verify = []
        bs = self.block_size
        for it in plan.items:
            c = it.tokens
            rid = it.request_id
            start = it.context
            n = it.num_tokens
            # a prefill chunk is all the sequence's own; of a decode step the last sampled
            # token and the accepted drafts are (they equal the tokens the sequence goes on
            # with), the other drafts are rejected guesses; the step keeps ``kept`` positions
            # (the plan cuts them at the request's max_tokens)
            own = n if it.is_prefill else 1 + it.accepted
            kept = it.kept
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
                state_in = self._resume_state(it, start, mb)
            ckpt = self.kv.prefill_checkpoint(c) if it.is_prefill else None
            with torch.inference_mode():
                if ckpt is not None and start < ckpt[0] < end:
                    # an internal prefill checkpoint: the state after ``pos`` tokens goes into
                    # the block the cache model keyed there, read out of the chunk's one pass
                    # (vLLM's SSD kernel hands it out of the same launch: no second forward)
                    pos, cidx = ckpt
                    hs, state_out, state_ck = self.model.run(
                        self.token_ids(it, start, end), start, fa, self.kv_pool, state_in,
                        state_at=pos - start)
                    if cidx < len(mb) and not mb[cidx].is_null:
                        self.state_pool.store(mb[cidx].block_id, state_ck)
                elif it.is_prefill:
                    hs, state_out = self.model.run(self.token_ids(it, start, end), start, fa,
                                                   self.kv_pool, state_in)
                else:
                    # every scheduled position runs, drafts included (their K/V is written;
                    # a rejected draft's is overwritten when the sequence reaches that
                    # position); the Mamba layers keep one state per position and the state
                    # of the last kept token becomes the request's state
                    hs, states = self.model.run(self.draft_ids(it, start, own, n), start, fa,
                                                self.kv_pool, state_in, steps=True)
                    pick = n - 1 if self.plant == "spec_last_state" else kept - 1
                    state_out = states[pick].clone()
            self.running[rid] = state_out
            idx = cdiv(end, bs) - 1
            if idx < len(mb) and not mb[idx].is_null:
                self.state_pool.store(mb[idx].block_id, state_out)
            if self.verify:
                self._collect(it, hs[:kept], end, pending_verify)
        if self.cuda:
            t_end.record()
            torch.cuda.synchronize()
            dt = t_start.elapsed_time(t_end) / 1e3
        else:
            dt = time.perf_counter() - t0
        self.stats.forward_s += dt
        for kind, it, hs, lo, end in pending_verify:   # not timed
            with torch.inference_mode():
                ref, _ = self.reference.run(self.token_ids(it, 0, end), 0,
                                            list(range(cdiv(end, self.block_size))),
                                            self._ref_pool(end), None)
            err = float((hs.float() - ref[lo:end].float()).abs().max())
            self.stats.records.append(VerifyRecord(
                it.request_id, it.tokens.num_prompt_tokens,
                self.resumed_at.get(it.request_id, 0), err, kind))
        return dt

    # ----------------------------------------------------------------- verify --
    def _collect(self, it: StepItem, hs, end: int, pending: list) -> None:
        """Keep what the check compares: every position the request's first prefill computed
        (from its resume point to the end of the prompt), and, on the step that finishes it,
        the last kept decode position (after all its speculative steps)."""
        rid = it.request_id
        if (it.is_prefill or it.padded) and it.first_prefill:
            self.prefill_hs.setdefault(rid, []).append(hs)
            if end >= it.tokens.num_tokens:
                got = torch.cat(self.prefill_hs.pop(rid))
                pending.append(("prefill", it, got, end - got.shape[0], end))
        elif not it.is_prefill and it.finishes:
            pending.append(("decode", it, hs[-1:], end - 1, end))

    def _ref_pool(self, n: int) -> KVPool | None:
        if not self.cfg.num_attention_layers:
            return None
        return KVPool(self.reference.cfg, cdiv(n, self.block_size), self.block_size, self.device)

    def _resume_state(self, it: StepItem, start: int, mamba_blocks) -> MambaState:
        if self.plant == "state_off_by_one":
            # the bug a check-point policy must never have: the state of p-1 used as p's
            with torch.inference_mode():
                ids = self.token_ids(it, 0, start - 1)
                pool = KVPool(self.cfg, cdiv(start, self.block_size) + 1, self.block_size,
                              self.device)
                _, st = forward_chunk(self.model, ids, 0,
                                      list(range(cdiv(start, self.block_size) + 1)), pool,
                                      self.block_size, None)
            return st
        blk = mamba_blocks[cdiv(start, self.block_size) - 1]
        if blk.is_null:
            raise RuntimeError(f"{it.request_id}: no Mamba state block at the hit {start}")
        return self.state_pool.load(blk.block_id)

    def time_from_sums(self, n: int, T: int, C: int, TC: int, TT: int) -> float:
        raise NotImplementedError("the torch backend times every step for real (jumps = False)")

    def forget(self, rid: str) -> None:
        self.running.pop(rid, None)
        self.resumed_at.pop(rid, None)
        self.prefill_hs.pop(rid, None)


def fp32_copy(model: HybridStack) -> HybridStack:
    """``model`` with the same (already rounded) weights in float32."""
    ref = HybridStack(model.cfg.with_(dtype="float32"), model.device)
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return ref


def build_backend(sc, dep, plant: str | None = None) -> TorchBackend:
    """``backend.kind: torch``: the real-compute backend over the deployment's blocks, the
    model scaled as the scenario's ``backend`` section says."""
    b = sc.backend
    pattern = sc.model.pattern or ""
    n_layers = b.layers or (len(pattern) if pattern else 4)
    cfg = TorchModelConfig.scaled(sc.model, num_layers=n_layers, width_div=b.width_div,
                                  dtype=b.dtype, seed=sc.seed)
    device = b.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend.device", "cuda requested but no GPU is visible")
    return TorchBackend(cfg, dep.kv, dep.num_blocks, dep.layout.block_size, device=device,
                        verify=b.verify, plant=plant)
