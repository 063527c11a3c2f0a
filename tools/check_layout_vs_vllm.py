"""Check ``sim model`` (``sim.models.derive_layout``) against vLLM 0.33.0's own pool derivation.

Two halves in one file, each run by its own interpreter:

* the *vLLM side* (``--vllm-side``, run by the oracle venv ``$HOME/.vllm-oracle/venv/bin/python``,
  importing nothing from this project) builds, for each setting, what vLLM builds before it
  allocates the pool and calls vLLM's own functions on it: ``CacheConfig`` validation (KV and
  Mamba dtypes), ``VllmConfig._reject_mismatched_float_kv_cache``, the model class's interfaces
  (``supports_eagle`` / ``supports_eagle3``) and ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config``, the architecture's ``verify_and_update_config``
  (NemotronH's SSM dtype), ``Platform.update_block_size_for_backend`` (kernel block,
  ``_align_hybrid_block_size`` with the Mamba prefill-checkpoint alignment),
  ``customize_attention_spec``, ``resolve_kv_cache_layout``, ``get_global_kv_cache_groups``
  (page unification, groups, EAGLE groups), ``_pool_bytes_per_block`` and
  ``MambaSpec.max_memory_usage_bytes``;
* the *project side* (the default, run by the project's venv) writes the settings, runs the vLLM
  side on them, runs ``derive_layout`` on the same settings and prints every difference
  (exit 1 if any).  ``--write-golden`` stores vLLM's answers in
  ``tests/models/layout_vllm_golden.csv``, which ``tests/models/test_layout_vs_vllm.py`` checks
  ``derive_layout`` against in CI (no vLLM needed there).

What is hand-built on the vLLM side (it cannot run on a CPU without a GPU, weights or a built
model), so it is an *input* here, taken from the catalogue: the HF config fields the model class
reads (head counts and sizes, Mamba dimensions); the layers the built model would register
(one object per layer of the real layer class, created without ``__init__``; for a GDN layer
the ``_checkpoint_alignment`` its ``__init__`` sets: 64 when the prefill backend is FlashInfer,
none with Triton -- vLLM picks FlashInfer on SM 9.x); the attention backend (FlashAttention, as on
H100/H200; its GPU-dependent kernel blocks -- FA4 head-256 pages on SM 10.x, the SM 9.0 FP8
head-512 tile -- do not fire on CPU and none applies to these models on Hopper); the number of
drafter attention layers (MTP module, EAGLE head: their model classes cannot be built on CPU) and
the EAGLE head's KV heads and head size; the per-layer ``FullAttentionSpec`` / ``MambaSpec`` the
layers' ``get_kv_cache_spec`` would return (built from the same inputs: block size and padding
from the platform step, shapes and dtypes from the model class, prefill checkpoint blocks as
MambaMixer2 (1) / GDN on FlashInfer (1) / MambaMixer (0) set them).  ``einops`` and
``compressed_tensors`` (missing from the oracle venv, used only by kernels and quantization) are
stubbed so that the model modules import.  Not checkable on CPU: ``mtp`` on a model without MTP
weights (vLLM fails while loading them), so the grid leaves it out.

Usage::

    python tools/check_layout_vs_vllm.py                 # compare, print differences
    python tools/check_layout_vs_vllm.py --write-golden  # also (re)write the golden table
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "models" / "layout_vllm_golden.csv"
ORACLE_PY = Path(os.environ.get("VLLM_ORACLE_PY",
                                str(Path.home() / ".vllm-oracle" / "venv" / "bin" / "python")))

SETTING = ("model", "tp", "kv", "conv", "ssm", "method", "k", "draft", "gdn")
RESULT = ("refuse", "block_size", "attention_block_size", "draft_block_size", "page_bytes",
          "conv_bytes", "ssm_bytes", "group_size", "attention_groups", "draft_groups",
          "mamba_groups", "eagle_groups", "pool_block_bytes", "mamba_blocks_per_request",
          "group_order", "eagle_group_ids")

# --------------------------------------------------------------------------------------------
# the grid (project side)

TPS = (1, 2, 4, 8)
KV_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8")
MAMBA_DTYPES = (("auto", "auto"), ("float32", "float32"), ("bfloat16", "float16"))
# more conv / SSM dtype pairs, with and without speculative rows
MORE_MAMBA_DTYPES = (("float16", "auto"), ("auto", "bfloat16"), ("float32", "bfloat16"))
SPECS = (("none", 0), ("mtp", 1), ("mtp", 3), ("eagle", 1), ("eagle", 3), ("eagle3", 2), ("ngram", 3))
# EAGLE heads of other shapes (layers x KV heads x head size): smaller / larger / non-dividing
# pages than the target's, own groups, padded or scaled blocks
DRAFTS = ("1x8x128", "1x4x128", "2x16x128", "1x8x64", "1x2x256", "1x6x96", "3x32x128")


def grid(models) -> list[dict]:
    """Every setting checked: catalogue model x TP x KV dtype x Mamba dtypes x method and k,
    plus EAGLE heads of other shapes, plus the GDN models on Triton."""
    rows = []
    for m in models:
        gdns = ("flashinfer", "triton") if m.mamba_kind == "gdn" else ("",)
        for tp in TPS:
            for kv in KV_DTYPES:
                for conv, ssm in MAMBA_DTYPES + MORE_MAMBA_DTYPES:
                    for gdn in gdns:
                        for method, k in SPECS:
                            if (conv, ssm) in MORE_MAMBA_DTYPES and method not in ("none", "ngram"):
                                continue
                            if method == "mtp" and not m.mtp_layers:
                                continue   # not checkable on CPU (see the module docstring)
                            if gdn == "triton" and (kv, conv) != ("auto", "auto"):
                                continue
                            rows.append(dict(model=m.name, tp=tp, kv=kv, conv=conv, ssm=ssm,
                                             method=method, k=k, draft="", gdn=gdn))
            for draft in DRAFTS:
                for method in ("eagle", "eagle3"):
                    rows.append(dict(model=m.name, tp=tp, kv="auto", conv="auto", ssm="auto",
                                     method=method, k=3, draft=draft, gdn=gdns[0]))
    return rows


def _model_input(m) -> dict:
    """What the vLLM side needs of a catalogue model (the HF config fields its class reads)."""
    order = m.pattern.replace("-", "").replace("E", "") if m.pattern else (
        "M" * m.num_mamba_layers + "*" * m.num_attention_layers)
    return dict(arch=m.vllm_architecture, dtype=m.dtype, kv_heads=m.kv_heads, head_dim=m.head_dim,
                q_heads=m.q_heads, hidden=m.hidden, order=order, mamba_kind=m.mamba_kind,
                conv_kernel=m.conv_kernel, mamba_heads=m.mamba_heads, mamba_head_dim=m.mamba_head_dim,
                n_groups=m.n_groups, d_state=m.d_state, d_inner=m.d_inner,
                gdn_k_heads=m.gdn_k_heads, gdn_v_heads=m.gdn_v_heads, gdn_k_dim=m.gdn_k_dim,
                gdn_v_dim=m.gdn_v_dim, mtp_attention_layers=m.mtp_attention_layers,
                draft=[m.draft_num_layers, m.draft_num_kv_heads or m.kv_heads,
                       m.draft_head_dim or m.head_dim])


def parse_draft(draft: str) -> dict:
    if not draft:
        return {}
    layers, kv, hd = (int(x) for x in draft.split("x"))
    return dict(draft_num_layers=layers, draft_num_kv_heads=kv, draft_head_dim=hd)


def sim_row(setting: dict) -> dict:
    """``derive_layout``'s answer for one setting, in the golden table's columns."""
    from sim.models import derive_layout, get_model

    s = setting
    method = {"none": "auto"}.get(s["method"], s["method"])
    kw = dict(tp=int(s["tp"]), num_speculative_tokens=int(s["k"]), kv_cache_dtype=s["kv"],
              mamba_cache_dtype=s["conv"], mamba_ssm_cache_dtype=s["ssm"],
              speculative_method=method, **parse_draft(s["draft"]))
    if s["gdn"]:
        kw["gdn_prefill_backend"] = s["gdn"]
    try:
        lay = derive_layout(get_model(s["model"]), **kw)
    except ValueError as e:
        return {"refuse": str(e).split(":", 1)[0]}
    return {"refuse": "", "block_size": lay.block_size,
            "attention_block_size": lay.attention_block_size,
            "draft_block_size": lay.draft_block_size, "page_bytes": lay.page_bytes,
            "conv_bytes": lay.conv_bytes_per_layer, "ssm_bytes": lay.ssm_bytes_per_layer,
            "group_size": lay.group_size, "attention_groups": lay.num_attention_groups,
            "draft_groups": lay.num_draft_groups, "mamba_groups": lay.num_mamba_groups,
            "eagle_groups": len(lay.eagle_groups), "pool_block_bytes": lay.pool_block_bytes,
            "mamba_blocks_per_request": lay.mamba_blocks_per_request,
            "group_order": "".join("M" if g == "mamba" else "A" for g in lay.groups),
            "eagle_group_ids": " ".join(map(str, lay.eagle_groups))}


def normalize(row: dict) -> dict:
    """A row with every result column as a string ('' when absent), for comparing."""
    return {c: ("" if row.get(c) in (None, "") else str(row[c])) for c in RESULT}


def read_golden(path: Path = GOLDEN) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def write_golden(rows: list[dict], path: Path = GOLDEN) -> None:
    buf = io.StringIO()
    buf.write("# vLLM 0.33.0's pool derivation (source: vLLM, via tools/check_layout_vs_vllm.py "
              "in the oracle venv; see its docstring for what is an input)\n")
    w = csv.DictWriter(buf, fieldnames=SETTING + RESULT, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in SETTING + RESULT})
    path.write_text(buf.getvalue())


def run_vllm_side(settings: list[dict], models: dict) -> list[dict]:
    if not ORACLE_PY.exists():
        raise SystemExit(f"no vLLM oracle venv at {ORACLE_PY} (set VLLM_ORACLE_PY)")
    payload = json.dumps({"models": models, "settings": settings})
    res = subprocess.run([str(ORACLE_PY), __file__, "--vllm-side"], input=payload, text=True,
                         capture_output=True)
    if res.returncode:
        sys.stderr.write(res.stderr[-4000:])
        raise SystemExit(f"the vLLM side failed (exit {res.returncode})")
    return json.loads(res.stdout.strip().splitlines()[-1])


def project_main(args) -> int:
    sys.path.insert(0, str(ROOT))
    from sim.models import CATALOGUE

    models = [m for m in CATALOGUE.values() if not args.models or m.name in args.models]
    settings = grid(models)
    answers = run_vllm_side(settings, {m.name: _model_input(m) for m in models})
    rows = [{**s, **normalize(a)} for s, a in zip(settings, answers)]
    bad = 0
    for r in rows:
        want, got = normalize(r), normalize(sim_row(r))
        if want != got:
            bad += 1
            if bad <= args.show:
                diff = {c: (want[c], got[c]) for c in RESULT if want[c] != got[c]}
                print("DIFF", {c: r[c] for c in SETTING}, "vLLM -> sim:", diff)
    refused = sum(1 for r in rows if r["refuse"])
    print(f"{len(rows)} settings ({refused} refused by vLLM): {bad} differ")
    if args.write_golden:
        write_golden(rows)
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------
# the vLLM side (oracle venv; imports nothing from this project)

def _stub_missing_modules() -> None:
    """``einops`` / ``compressed_tensors`` are absent from the oracle venv and used only by
    kernels and quantization; stub them so the model modules (class interfaces and the
    state-shape classmethods) import."""
    import importlib.abc
    import importlib.machinery
    import types

    class _Lazy(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = type(name, (), {"__init__": lambda self, *a, **k: None})
            setattr(self, name, value)
            return value

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("einops", "compressed_tensors"):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            mod = _Lazy(spec.name)
            mod.__path__ = []
            return mod

        def exec_module(self, module):
            pass

    sys.meta_path.append(_Finder())


class _VllmSide:
    """vLLM's own functions on one hand-built configuration per setting."""

    def __init__(self):
        _stub_missing_modules()
        import torch
        from vllm.config import CacheConfig, CompilationConfig, ParallelConfig
        from vllm.config.model import ModelConfig
        from vllm.config.speculative import SpeculativeConfig
        from vllm.config.vllm import VllmConfig
        from vllm.distributed.utils import divide
        from vllm.model_executor.layers.attention.attention import Attention
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
            QwenGatedDeltaNetAttention)
        from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
        from vllm.model_executor.models import (granitemoehybrid, jamba, nemotron_h,
                                                qwen3_next)
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
        from vllm.model_executor.models.interfaces import (supports_eagle, supports_eagle3,
                                                           supports_kv_cache_grouping)
        from vllm.platforms.interface import Platform
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
        from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
        from vllm.v1.attention.backends.utils import (get_supported_kv_cache_layouts,
                                                      resolve_kv_cache_layout)
        from vllm.v1.core import kv_cache_planning as planning
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec,
                                                get_kv_quant_mode)
        from vllm.v1.worker.utils import customize_attention_spec

        self.torch = torch
        self.divide = divide
        self.CacheConfig, self.CompilationConfig, self.ParallelConfig = (
            CacheConfig, CompilationConfig, ParallelConfig)
        self.ModelConfig, self.SpeculativeConfig, self.VllmConfig = (
            ModelConfig, SpeculativeConfig, VllmConfig)
        self.Attention = Attention
        self.mixers = {"mamba2": MambaMixer2, "mamba1": MambaMixer,
                       "gdn": QwenGatedDeltaNetAttention}
        self.classes = {c.__name__: c for c in (
            nemotron_h.NemotronHForCausalLM, granitemoehybrid.GraniteMoeHybridForCausalLM,
            jamba.JambaForCausalLM, qwen3_next.Qwen3NextForCausalLM)}
        self.MODELS_CONFIG_MAP = MODELS_CONFIG_MAP
        self.supports_eagle, self.supports_eagle3 = supports_eagle, supports_eagle3
        self.supports_kv_cache_grouping = supports_kv_cache_grouping
        self.Platform = Platform
        self.FA = FlashAttentionBackend
        self.GDN_ALIGN = FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
        self.get_supported_kv_cache_layouts = get_supported_kv_cache_layouts
        self.resolve_kv_cache_layout = resolve_kv_cache_layout
        self.planning = planning
        self.FullAttentionSpec, self.MambaSpec = FullAttentionSpec, MambaSpec
        self.get_kv_quant_mode = get_kv_quant_mode
        self.customize_attention_spec = customize_attention_spec
        # duck classes carrying vLLM's own methods and properties
        ns = {n: VllmConfig.__dict__[n] for n in (
            "num_speculative_tokens", "num_prefill_lookahead_tokens",
            "_reject_mismatched_float_kv_cache")}
        self.VC = type("HandBuiltVllmConfig", (), ns)
        self.MC = type("HandBuiltModelConfig", (), {n: ModelConfig.__dict__[n] for n in (
            "get_num_kv_heads", "get_head_size")})
        self.SC = type("HandBuiltSpeculativeConfig", (), {n: SpeculativeConfig.__dict__[n] for n in (
            "use_eagle", "needs_eagle_block_drop", "use_eagle_block_drop", "use_dflash",
            "use_dspark", "use_multi_module_mtp", "uses_draft_model")})

    # -- one setting -------------------------------------------------------------------------
    def _hf_config(self, m):
        from types import SimpleNamespace as NS

        arch = m["arch"]
        if arch == "NemotronHForCausalLM":
            return NS(model_type="nemotron_h", mamba_num_heads=m["mamba_heads"],
                      mamba_head_dim=m["mamba_head_dim"], n_groups=m["n_groups"],
                      ssm_state_size=m["d_state"], conv_kernel=m["conv_kernel"])
        if arch == "GraniteMoeHybridForCausalLM":
            di = m["mamba_heads"] * m["mamba_head_dim"]
            assert di % m["hidden"] == 0
            return NS(model_type="granitemoehybrid", hidden_size=m["hidden"],
                      mamba_expand=di // m["hidden"], mamba_n_groups=m["n_groups"],
                      mamba_n_heads=m["mamba_heads"], mamba_d_head=m["mamba_head_dim"],
                      mamba_d_state=m["d_state"], mamba_d_conv=m["conv_kernel"])
        if arch == "JambaForCausalLM":
            assert m["d_inner"] % m["hidden"] == 0
            return NS(model_type="jamba", hidden_size=m["hidden"],
                      mamba_expand=m["d_inner"] // m["hidden"], mamba_d_state=m["d_state"],
                      mamba_d_conv=m["conv_kernel"])
        if arch == "Qwen3NextForCausalLM":
            return NS(model_type="qwen3_next", linear_num_key_heads=m["gdn_k_heads"],
                      linear_num_value_heads=m["gdn_v_heads"], linear_key_head_dim=m["gdn_k_dim"],
                      linear_value_head_dim=m["gdn_v_dim"], linear_conv_kernel_dim=m["conv_kernel"])
        raise ValueError(f"no hand-built HF config for {arch}")

    def _model_config(self, m, kv_heads, head_dim, hf):
        from types import SimpleNamespace as NS

        mc = self.MC()
        mc.use_mla = False
        mc.dtype = getattr(self.torch, m["dtype"])
        mc.hf_config = mc.hf_text_config = hf
        mc.architecture = m["arch"]
        mc.is_hybrid = True
        mc.model_impl, mc.convert_type = "auto", "none"
        mc.supports_kv_cache_grouping = self.supports_kv_cache_grouping(self.classes[m["arch"]])
        mc.model_arch_config = NS(total_num_kv_heads=kv_heads, head_size=head_dim)
        return mc

    def _refusal(self, m, s):
        """vLLM's refusals for this setting, as the field the simulator names ('' if none)."""
        from pydantic import ValidationError

        try:
            cache = self.CacheConfig(cache_dtype=s["kv"], mamba_cache_dtype=s["conv"],
                                     mamba_ssm_cache_dtype=s["ssm"], mamba_cache_mode="align",
                                     enable_prefix_caching=True)
        except ValidationError as e:
            loc = e.errors()[0]["loc"][0]
            return {"cache_dtype": "kv_cache_dtype"}.get(loc, loc), None
        vc = self.VC()
        vc.cache_config = cache
        vc.model_config = self._model_config(m, m["kv_heads"], m["head_dim"], self._hf_config(m))
        try:
            vc._reject_mismatched_float_kv_cache()
        except ValueError:
            return "kv_cache_dtype", None
        # QKVParallelLinear (built with the model, not on CPU) splits the heads with vLLM's
        # ``divide``: q heads by TP, KV heads by TP or TP by KV heads (replicas)
        tp = int(s["tp"])

        def heads_split(q, kv):
            try:
                if q is not None:
                    self.divide(q, tp)
                if kv:
                    self.divide(tp, kv) if tp >= kv else self.divide(kv, tp)
            except AssertionError:
                return False
            return True

        if not heads_split(m["q_heads"], m["kv_heads"]):
            return "tp", None
        cls = self.classes[m["arch"]]
        # EAGLE-3 without SupportsEagle3 fails at model load (set_eagle3_aux_hidden_state_layers);
        # EAGLE-1 is what SupportsEagle declares
        if s["method"] == "eagle3" and not self.supports_eagle3(cls):
            return "speculative_method", None
        if s["method"] == "eagle" and not self.supports_eagle(cls):
            return "speculative_method", None
        if not heads_split(None, self._draft(m, s)[1]):
            return "draft_num_kv_heads", None
        return "", vc

    @staticmethod
    def _draft(m, s):
        """(layers, KV heads, head size) of the EAGLE head; (0, 0, 0) for other methods."""
        if s["method"] not in ("eagle", "eagle3"):
            return 0, 0, 0
        return tuple(int(x) for x in s["draft"].split("x")) if s["draft"] else tuple(m["draft"])

    def _register_layers(self, m, s, vc, method):
        """The layers the built model registers, in order, then the drafter's: (the forward
        context, the layer names by kind, the Mamba mixer class, the drafter's KV heads and
        head size)."""
        ctx = vc.compilation_config.static_forward_context
        mixer = self.mixers[m["mamba_kind"]]
        n_draft, d_kv, d_hd = 0, m["kv_heads"], m["head_dim"]
        if method == "mtp":
            n_draft = m["mtp_attention_layers"]
        elif method in ("eagle", "eagle3"):
            n_draft, d_kv, d_hd = self._draft(m, s)
        names = {"attention": [], "mamba": [], "draft": []}
        for i, c in enumerate(m["order"]):
            if c == "M":
                layer = object.__new__(mixer)
                if m["mamba_kind"] == "gdn":
                    object.__setattr__(layer, "_checkpoint_alignment",
                                       self.GDN_ALIGN if s["gdn"] == "flashinfer" else None)
                kind = "mamba"
            else:
                layer = object.__new__(self.Attention)
                object.__setattr__(layer, "attn_backend", self.FA)
                kind = "attention"
            ctx[f"model.layers.{i}"] = layer
            names[kind].append(f"model.layers.{i}")
        for j in range(n_draft):
            layer = object.__new__(self.Attention)
            object.__setattr__(layer, "attn_backend", self.FA)
            name = f"drafter.layers.{j}"
            ctx[name] = layer
            names["draft"].append(name)
        return ctx, names, mixer, d_kv, d_hd

    def derive(self, m, s):
        refuse, vc = self._refusal(m, s)
        if refuse:
            return {"refuse": refuse}
        torch = self.torch
        cls = self.classes[m["arch"]]
        tp, k, method = int(s["tp"]), int(s["k"]), s["method"]
        vc.parallel_config = self.ParallelConfig(tensor_parallel_size=tp)
        vc.compilation_config = self.CompilationConfig()
        from types import SimpleNamespace as NS

        vc.scheduler_config = NS(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=8192)
        vc.attention_config = NS(hisparse_config=None)
        vc.diffusion_config = None
        vc.kv_transfer_config = None
        if method == "none":
            vc.speculative_config = None
        else:
            sc = self.SC()
            sc.method, sc.num_speculative_tokens = method, k
            sc.disable_eagle_block_drop = False
            sc.draft_model_config = NS(hf_config=NS(num_nextn_predict_layers=1))
            vc.speculative_config = sc
        hook = self.MODELS_CONFIG_MAP.get(m["arch"])
        if hook is not None:
            hook.verify_and_update_config(vc)
        ctx, names, mixer, d_kv, d_hd = self._register_layers(m, s, vc, method)
        try:
            self.Platform.update_block_size_for_backend(vc)
        except (AssertionError, ValueError):
            return {"refuse": "tp"}
        cache = vc.cache_config
        try:
            shapes = tuple(tuple(x) for x in cls.get_mamba_state_shape_from_config(vc))
        except AssertionError:
            return {"refuse": "tp"}
        dtypes = cls.get_mamba_state_dtype_from_config(vc)
        kv_dtype = (vc.model_config.dtype if cache.cache_dtype == "auto"
                    else {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
                        cache.cache_dtype, torch.uint8))
        quant = self.get_kv_quant_mode(cache.cache_dtype)
        pc = vc.parallel_config

        def attn_spec(kv_heads, head_dim, draft):
            mc = self._model_config(m, kv_heads, head_dim, vc.model_config.hf_config)
            spec = self.FullAttentionSpec(block_size=cache.block_size,
                                          num_kv_heads=mc.get_num_kv_heads(pc),
                                          head_size=mc.get_head_size(), dtype=kv_dtype,
                                          kv_quant_mode=quant)
            spec = self.customize_attention_spec(self.FA, spec)
            from dataclasses import replace

            return replace(spec, is_draft=True) if draft else spec

        ckpt = 1 if (m["mamba_kind"] == "mamba2" or
                     (m["mamba_kind"] == "gdn" and s["gdn"] == "flashinfer")) else 0
        mamba_type = object.__new__(mixer).mamba_type
        mamba = self.MambaSpec(shapes=shapes, dtypes=tuple(dtypes), block_size=cache.mamba_block_size,
                               page_size_padded=cache.mamba_page_size_padded, mamba_type=mamba_type,
                               mamba_cache_mode=cache.mamba_cache_mode,
                               num_speculative_blocks=vc.num_speculative_tokens,
                               num_prefill_checkpoint_blocks=ckpt,
                               prefill_checkpoint_alignment=1 if ckpt else None)
        target = attn_spec(m["kv_heads"], m["head_dim"], False)
        draft = attn_spec(d_kv, d_hd, True)
        specs = {}
        for name in ctx:
            if name in names["mamba"]:
                specs[name] = mamba
            elif name in names["attention"]:
                specs[name] = target
            else:
                specs[name] = draft
        backends = [self.FA, object.__new__(mixer).get_attn_backend()]
        layouts = [x.name for x in self.get_supported_kv_cache_layouts(backends)]
        self.resolve_kv_cache_layout(vc, [layouts], specs.values())
        groups = self.planning.get_global_kv_cache_groups(vc, [dict(specs)])
        pool = self.planning._pool_bytes_per_block(vc, groups)
        draft_names = set(names["draft"])
        attn = [g for g in groups if not isinstance(g.kv_cache_spec, self.MambaSpec)]
        mam = [g for g in groups if isinstance(g.kv_cache_spec, self.MambaSpec)]
        own = [g for g in attn if set(g.layer_names) <= draft_names]
        targ = [g for g in attn if not set(g.layer_names) <= draft_names]
        pages = {g.kv_cache_spec.page_size_bytes for g in groups}
        assert len(pages) == 1, pages
        mspec = mam[0].kv_cache_spec
        conv_b = shapes[0][0] * shapes[0][1] * torch.empty(0, dtype=dtypes[0]).element_size()
        ssm_b = mspec.real_page_size_bytes - conv_b
        return {"refuse": "", "block_size": cache.block_size,
                "attention_block_size": targ[0].kv_cache_spec.block_size,
                "draft_block_size": own[0].kv_cache_spec.block_size if own else 0,
                "page_bytes": pages.pop(), "conv_bytes": conv_b, "ssm_bytes": ssm_b,
                "group_size": max(len(g.layer_names) for g in groups),
                "attention_groups": len(attn), "draft_groups": len(own),
                "mamba_groups": len(mam),
                "eagle_groups": sum(1 for g in groups if g.is_eagle_group),
                "pool_block_bytes": pool,
                "mamba_blocks_per_request": mspec.max_memory_usage_bytes(vc) // mspec.page_size_bytes,
                "group_order": "".join("M" if isinstance(g.kv_cache_spec, self.MambaSpec) else "A"
                                       for g in groups),
                "eagle_group_ids": " ".join(str(i) for i, g in enumerate(groups)
                                            if g.is_eagle_group)}


def vllm_main() -> int:
    import logging

    logging.disable(logging.WARNING)
    data = json.loads(sys.stdin.read())
    side = _VllmSide()
    out = []
    for s in data["settings"]:
        out.append(side.derive(data["models"][s["model"]], s))
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write-golden", action="store_true", help=f"write {GOLDEN.name}")
    ap.add_argument("--models", nargs="*", help="only these catalogue models")
    ap.add_argument("--show", type=int, default=30, help="differences to print")
    args = ap.parse_args(argv)
    return vllm_main() if args.vllm_side else project_main(args)


if __name__ == "__main__":
    sys.exit(main())
