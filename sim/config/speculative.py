"""The ``speculative`` section of a scenario, and speculative decoding as the cache
sees it (``SpecDecode``)."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from sim.errors import ConfigError
from sim.config.fields import check_int, check_num


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding as the cache sees it."""

    method: str | None = None          # eagle | eagle3 | mtp | None
    num_speculative_tokens: int = 0
    multi_module_mtp: bool = False     # vLLM: min(num_nextn_predict_layers, k) > 1

    @property
    def uses_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp") and self.num_speculative_tokens > 0

    @property
    def num_prefill_lookahead(self) -> int:
        if not self.uses_eagle:
            return 0
        return self.num_speculative_tokens if self.multi_module_mtp else 1


# vLLM methods whose lookahead the cache model does not follow: vLLM 0.33.0 reserves no
# drafting slots and no prefill lookahead for them (use_eagle() is False), or a whole draft
# model's layers and an extra slot (draft_model), or a fill-in query (dflash, dspark)
_OTHER_METHODS = ("ngram", "ngram_gpu", "suffix", "draft_model", "dflash", "dspark",
                  "extract_hidden_states", "custom_class")


@dataclass(frozen=True)
class SpeculativeSection:
    method: str | None = None                # eagle | eagle3 | mtp
    num_speculative_tokens: int = 0
    mean_accepted_tokens: float = 0.0        # drafts accepted per decode step
    num_mtp_modules: int = 1                 # >1 with k>1: multi-module MTP (vLLM's rule)
    # the EAGLE head whose layers join the KV pool (None: the model's default, one layer
    # shaped like the target's attention; see ``sim model NAME --speculative-method eagle``)
    draft_num_layers: int | None = None
    draft_num_kv_heads: int | None = None
    draft_head_dim: int | None = None

    def validate(self, p="speculative."):
        if self.method in _OTHER_METHODS:
            raise ConfigError(p + "method", f"{self.method} is not modelled: vLLM 0.33.0 resolves "
                              f"its lookahead differently from the EAGLE family (drafting slots, "
                              f"prefill lookahead, drafter KV); use eagle, eagle3 or mtp")
        if self.method not in (None, "eagle", "eagle3", "mtp"):
            raise ConfigError(p + "method", f"must be eagle, eagle3 or mtp, got {show(self.method)}")
        check_int(p, "num_speculative_tokens", self.num_speculative_tokens, 0)
        check_num(p, "mean_accepted_tokens", self.mean_accepted_tokens, 0.0,
                  float(self.num_speculative_tokens))
        check_int(p, "num_mtp_modules", self.num_mtp_modules, 1)
        if self.method and self.num_speculative_tokens == 0:
            raise ConfigError(p + "num_speculative_tokens", f"must be >= 1 with method {self.method}")
        for name in ("draft_num_layers", "draft_num_kv_heads", "draft_head_dim"):
            check_int(p, name, getattr(self, name), 1, allow_none=True)
            if getattr(self, name) is not None and self.method not in ("eagle", "eagle3"):
                raise ConfigError(p + name, f"sets the EAGLE head's shape: only with method "
                                  f"eagle or eagle3, not {self.method or 'none'}")

    def layout_args(self) -> dict:
        """What ``sim.models.derive_layout`` needs of this section."""
        return dict(num_speculative_tokens=self.num_speculative_tokens if self.method else 0,
                    speculative_method=self.method or "auto",
                    draft_num_layers=self.draft_num_layers,
                    draft_num_kv_heads=self.draft_num_kv_heads, draft_head_dim=self.draft_head_dim)

    def spec_decode(self) -> SpecDecode:
        multi = (self.method == "mtp" and min(self.num_mtp_modules, self.num_speculative_tokens) > 1)
        return SpecDecode(self.method, self.num_speculative_tokens if self.method else 0, multi)
