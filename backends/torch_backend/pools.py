"""Paged cache storage: attention K/V blocks and per-block Mamba states.

* :class:`KVPool` -- per attention layer one tensor ``[num_blocks, 2, block_size, kv_heads,
  head_dim]`` (index 0 = K, after RoPE where the model has it; 1 = V) in the model dtype.  A
  sequence's token at position ``pos`` lives in block ``block_ids[pos // block_size]`` at offset ``pos % block_size``.
* :class:`StatePool` -- per Mamba layer a conv state ``[num_blocks, conv_dim, conv_kernel - 1]``
  (model dtype; it holds pre-conv inputs, so nothing is lost) and an SSM state
  ``[num_blocks, heads, head_dim, d_state]`` (always float32).
* :class:`MambaState` -- one sequence's Mamba state at a position: per Mamba layer (conv, ssm).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import TorchModelConfig

Tensor = torch.Tensor


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16,
            "float64": torch.float64}[name]


@dataclass
class MambaState:
    """Mamba state of one sequence: ``layers[i] = (conv (conv_dim, k-1), ssm (h, p, n) fp32)``
    for the i-th Mamba block of the pattern."""

    layers: list[tuple[Tensor, Tensor]]

    @classmethod
    def zeros(cls, cfg: TorchModelConfig, device=None) -> "MambaState":
        dt = torch_dtype(cfg.dtype)
        return cls([(torch.zeros(cfg.conv_dim, cfg.conv_kernel - 1, dtype=dt, device=device),
                     torch.zeros(cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state,
                                 dtype=torch.float32, device=device))
                    for _ in range(cfg.num_mamba_layers)])

    def clone(self) -> "MambaState":
        return MambaState([(c.clone(), s.clone()) for c, s in self.layers])

    def to(self, device) -> "MambaState":
        return MambaState([(c.to(device), s.to(device)) for c, s in self.layers])

    def max_abs_diff(self, other: "MambaState") -> float:
        """Largest elementwise difference over all layers (conv and ssm), as float."""
        d = 0.0
        for (c1, s1), (c2, s2) in zip(self.layers, other.layers):
            d = max(d, (c1.double() - c2.double()).abs().max().item(),
                    (s1.double() - s2.double()).abs().max().item())
        return d


class KVPool:
    """Paged K/V storage for the attention layers of ``cfg`` (layer index = order in pattern)."""

    def __init__(self, cfg: TorchModelConfig, num_blocks: int, block_size: int, device=None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.cfg = cfg
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        dt = torch_dtype(cfg.dtype)
        self.kv = [torch.zeros(num_blocks, 2, block_size, cfg.kv_heads, cfg.head_dim,
                               dtype=dt, device=self.device)
                   for _ in range(cfg.num_attention_layers)]

    def _index(self, block_ids, positions: Tensor) -> tuple[Tensor, Tensor]:
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.device)
        if positions.numel() == 0:
            return positions, positions
        need = int(positions.max().item()) // self.block_size + 1
        if len(block_ids) < need:
            raise ValueError(f"position {int(positions.max())} needs {need} blocks, "
                             f"got {len(block_ids)} block ids")
        ids = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)
        blk = ids[positions // self.block_size]
        if blk.numel() and (int(blk.min()) < 0 or int(blk.max()) >= self.num_blocks):
            raise ValueError(f"block id out of range [0, {self.num_blocks})")
        return blk, positions % self.block_size

    def write(self, layer: int, block_ids, positions, k: Tensor, v: Tensor) -> None:
        """Store ``k, v (t, kv_heads, head_dim)`` of tokens at ``positions (t,)``."""
        blk, off = self._index(block_ids, positions)
        self.kv[layer][blk, 0, off] = k.to(self.kv[layer].dtype)
        self.kv[layer][blk, 1, off] = v.to(self.kv[layer].dtype)

    def read(self, layer: int, block_ids, positions) -> tuple[Tensor, Tensor]:
        """K, V ``(t, kv_heads, head_dim)`` of tokens at ``positions (t,)``."""
        blk, off = self._index(block_ids, positions)
        return self.kv[layer][blk, 0, off], self.kv[layer][blk, 1, off]

    @property
    def bytes_per_block(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.kv)


class StatePool:
    """Per-block Mamba states (one slot per block id) for the Mamba layers of ``cfg``."""

    def __init__(self, cfg: TorchModelConfig, num_blocks: int, device=None):
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.cfg = cfg
        self.num_blocks = num_blocks
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        dt = torch_dtype(cfg.dtype)
        k1 = cfg.conv_kernel - 1
        self.conv = [torch.zeros(num_blocks, cfg.conv_dim, k1, dtype=dt, device=self.device)
                     for _ in range(cfg.num_mamba_layers)]
        self.ssm = [torch.zeros(num_blocks, cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state,
                                dtype=torch.float32, device=self.device)
                    for _ in range(cfg.num_mamba_layers)]

    def _check(self, block_id: int) -> int:
        b = int(block_id)
        if not 0 <= b < self.num_blocks:
            raise ValueError(f"block id {b} out of range [0, {self.num_blocks})")
        return b

    def load(self, block_id: int) -> MambaState:
        """A copy of the state stored at ``block_id``."""
        b = self._check(block_id)
        return MambaState([(c[b].clone(), s[b].clone()) for c, s in zip(self.conv, self.ssm)])

    def store(self, block_id: int, state: MambaState) -> None:
        b = self._check(block_id)
        if len(state.layers) != len(self.conv):
            raise ValueError(f"state has {len(state.layers)} layers, pool {len(self.conv)}")
        for i, (c, s) in enumerate(state.layers):
            self.conv[i][b].copy_(c)
            self.ssm[i][b].copy_(s)

    def copy(self, src: int, dst: int) -> None:
        s, d = self._check(src), self._check(dst)
        for t in (*self.conv, *self.ssm):
            t[d].copy_(t[s])

    @property
    def bytes_per_block(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (*self.conv, *self.ssm))
