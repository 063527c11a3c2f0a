"""The ``speculative`` section of a scenario, and speculative decoding as the cache
sees it (``SpecDecode``)."""
from __future__ import annotations

from dataclasses import dataclass

from sim.config.errors import ConfigError
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


@dataclass(frozen=True)
class SpeculativeSection:
    method: str | None = None                # eagle | eagle3 | mtp
    num_speculative_tokens: int = 0
    mean_accepted_tokens: float = 0.0        # drafts accepted per decode step
    num_mtp_modules: int = 1                 # >1 with k>1: multi-module MTP (vLLM's rule)

    def validate(self, p="speculative."):
        if self.method not in (None, "eagle", "eagle3", "mtp"):
            raise ConfigError(p + "method", f"must be eagle, eagle3 or mtp, got {self.method!r}")
        check_int(p, "num_speculative_tokens", self.num_speculative_tokens, 0)
        check_num(p, "mean_accepted_tokens", self.mean_accepted_tokens, 0.0,
                  float(self.num_speculative_tokens))
        check_int(p, "num_mtp_modules", self.num_mtp_modules, 1)
        if self.method and self.num_speculative_tokens == 0:
            raise ConfigError(p + "num_speculative_tokens", f"must be >= 1 with method {self.method}")

    def spec_decode(self) -> SpecDecode:
        multi = (self.method == "mtp" and min(self.num_mtp_modules, self.num_speculative_tokens) > 1)
        return SpecDecode(self.method, self.num_speculative_tokens if self.method else 0, multi)
