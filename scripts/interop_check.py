#!/usr/bin/env python3
"""Compare our logits with the reference library's on the same tokens (docs/INTEROP.md, "Checking").

Usage: scripts/interop_check.py --hf HF_DIR --logits OURS.safetensors [MORE.safetensors ...] [--fla FLA_SRC]
                                [--device cuda] [--tol TOL] [--prefix 64]

HF_DIR is what `llmtrain export --format hf` wrote; each OURS.safetensors what `llmtrain eval --dump-logits` wrote
for the same checkpoint (input_ids i32 [n], logits f32 [n, vocab]; e.g. one from --backend cpu and one from
--backend cuda). The reference model is loaded in float32:
  - config.json with a model_type: flash-linear-attention's (FLA) class for it, from the source tree FLA_SRC
    (a checkout of fla-org/flash-linear-attention, or for momentum_deltanet the `flash-linear-attention`
    folder of HuuYuLong/MomentumDeltaNet), loaded with the class's from_pretrained;
  - otherwise (Mamba-3) mamba_ssm's MambaLMHeadModel from a MambaConfig, weights by load_state_dict.
Every parameter of the loaded model is checked to equal the file's tensor (transformers only warns about
missing or unexpected weights and would leave them at their initialisation). The reference then runs on
input_ids; its logits are compared with each file's. Checks ("variants"): `full` (the whole window; FLA's
delta-rule layers take their chunked kernels), `prefix` (the first --prefix tokens: FLA's delta-rule layers
switch to their fused recurrent kernels at <= 64 tokens), for Mamba2 also `torch` (FLA's pure-PyTorch path
instead of mamba_ssm's Triton kernels, when those were used; it runs first, and a variant that fails is
listed under "failed_variants" while the others are still compared).

Prints one JSON line per logits file: the largest absolute difference over all variants, the largest |logit|,
their ratio, the fraction of positions whose argmax agrees (full window), and each variant's numbers.
Exits 0 when every ratio is at most the tolerance, 1 when one exceeds it, 2 when something cannot be loaded or
run (the message says what).

Tolerance (--tol, default by model): 1e-3 for FLA's models (run with TRITON_F32_DEFAULT=ieee so that Triton's
fp32 dot products are not TF32), 5e-2 for Mamba-3, whose mamba_ssm kernel (mamba3_siso_combined) casts Q, K, V,
the rotary angles and the gate to bfloat16 whatever the model's dtype.

Compatibility shims, each reported in the JSON ("notes"), none changing the function the reference computes:
  - FLA's source is imported without running the package __init__ files of fla, fla.layers and fla.models
    (those import every model FLA has; the MomentumDeltaNet copy's fla/__init__.py imports a misspelt name,
    `KimiDeltaAhattention`, and fails), then only fla.models.<model_type>;
  - the MomentumDeltaNet copy's fla/utils.py reads an undefined global FLA_CACHE_RESULTS when triton.autotune
    takes cache_results (recent Triton); it is provided as False (do not cache autotune timings to disk);
  - FLA's softmax Attention calls flash_attn.flash_attn_func, which has no float32 kernels (and flash-attn may
    not be installed): a stand-in module computes it with torch's scaled_dot_product_attention (causal, full
    window) in float32; RoPE, projections and everything else stay FLA's;
  - with tied embeddings under transformers 5, FLA's list-form _tied_weights_keys ["lm_head.weight"] is given as
    the mapping transformers 5 expects;
  - RoPE's inverse frequencies (a non-persistent buffer, not in the file) are recomputed if loading left them
    other than FLA's formula gives.
"""
import argparse
import builtins
import importlib
import importlib.machinery
import json
import os
import re
import sys
import traceback
import types

# FLA's Triton kernels use tl.dot, which on fp32 operands defaults to TF32 (10-bit mantissa); ieee makes the
# reference an fp32 computation. Must be set before Triton compiles anything.
os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

DEFAULT_TOL = {"mamba3": 5e-2}


class LoadError(Exception):
    """The reference model cannot be loaded or run; the message says why."""


def install_flash_attn_stand_in(notes):
    """A flash_attn module whose flash_attn_func is torch's SDPA (flash-attn itself has no float32 kernels)."""
    import torch.nn.functional as F

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **kwargs):
        if tuple(window_size) != (-1, -1) or dropout_p:
            raise NotImplementedError("flash_attn stand-in: only full-window attention without dropout")
        if q.shape[2] != k.shape[2]:  # grouped kv heads
            k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
            v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):  # plain matmuls (TF32 is off): a float32 reference
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=causal, scale=softmax_scale)
        return o.transpose(1, 2).to(q.dtype)

    def flash_attn_varlen_func(*args, **kwargs):
        raise NotImplementedError("flash_attn stand-in: no varlen attention (padding masks / cu_seqlens)")

    mod = types.ModuleType("flash_attn")
    # transformers' availability probe calls importlib.util.find_spec, which needs a spec on the module
    mod.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    mod.flash_attn_func = flash_attn_func
    mod.flash_attn_varlen_func = flash_attn_varlen_func
    mod.__version__ = "0.0.0+stand-in"
    sys.modules["flash_attn"] = mod
    notes.append("FLA's Attention ran on a float32 torch SDPA stand-in for flash_attn.flash_attn_func")


def import_fla_models(fla_src, model_type, notes):
    """fla.models.<model_type> from the source tree fla_src, without the package __init__s of fla,
    fla.layers, fla.models and fla.ops (they import every model / kernel of the tree, and the MDN authors'
    trimmed copy lacks some of what its fla.ops __init__ imports)."""
    root = os.path.join(os.path.abspath(fla_src), "fla")
    if not os.path.isfile(os.path.join(root, "models", model_type, "__init__.py")):
        raise LoadError(f"{fla_src}: no fla/models/{model_type} (FLA has no class for model_type {model_type}"
                        + ("; for momentum_deltanet point --fla at MomentumDeltaNet's flash-linear-attention folder"
                           if model_type == "momentum_deltanet" else "") + ")")
    for name in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
        del sys.modules[name]
    for name, sub in (("fla", ""), ("fla.layers", "layers"), ("fla.models", "models"), ("fla.ops", "ops")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub) if sub else root]
        pkg.__package__ = name
        if name == "fla":
            with open(os.path.join(root, "__init__.py"), encoding="utf-8") as f:
                m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
            pkg.__version__ = m.group(1) if m else "unknown"
        sys.modules[name] = pkg
        if "." in name:
            setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], pkg)
    utils_py = os.path.join(root, "utils.py")
    if os.path.isfile(utils_py) and not hasattr(builtins, "FLA_CACHE_RESULTS"):
        with open(utils_py, encoding="utf-8") as f:
            src = f.read()
        if "FLA_CACHE_RESULTS" in src and not re.search(r"^(FLA_CACHE_RESULTS\s*=|from .* import .*FLA_CACHE_RESULTS)",
                                                         src, re.M):
            builtins.FLA_CACHE_RESULTS = False
            notes.append("fla/utils.py reads an undefined FLA_CACHE_RESULTS: provided as False")
    return importlib.import_module(f"fla.models.{model_type}"), sys.modules["fla"].__version__


def check_weights(model, state, tied, what):
    """Every parameter/buffer of `model` that the file has equals it; none missing (lm_head when tied)."""
    import torch

    own = model.state_dict()
    missing = [k for k in own if k not in state and not (tied and k == "lm_head.weight")]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise LoadError(f"{what}: the model has parameters the file lacks {missing[:8]} or the file has tensors the "
                        f"model lacks {unexpected[:8]}")
    for k, t in state.items():
        mine = own[k]
        if tuple(mine.shape) != tuple(t.shape):
            raise LoadError(f"{what}: {k} has shape {tuple(mine.shape)} in the model, {tuple(t.shape)} in the file")
        if not torch.equal(mine.detach().float().cpu(), t.float()):
            raise LoadError(f"{what}: {k} differs from the file after loading (largest difference "
                            f"{(mine.detach().float().cpu() - t.float()).abs().max().item():.3g})")


def load_reference(hf_dir, fla_src, device, notes):
    """(model in float32 on `device` in eval mode, class name, forward(ids) -> logits, model_type,
    extra variants {name: forward})."""
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    if "model_type" in cfg:
        mt = cfg["model_type"]
        if not fla_src:
            raise LoadError("config.json has a model_type (an FLA class): --fla is needed")
        if mt == "transformer" or cfg.get("attn"):
            install_flash_attn_stand_in(notes)
        mod, version = import_fla_models(fla_src, mt, notes)
        # the class config.json names (a module may export several, e.g. a multi-token-prediction variant)
        arch = (cfg.get("architectures") or [None])[0]
        cls = getattr(mod, arch, None) if arch else None
        if cls is None:
            found = [n for n in dir(mod) if n.endswith("ForCausalLM")]
            raise LoadError(f"fla.models.{mt} has no class {arch!r} (config.json's architectures); it has {found}")
        notes.append(f"FLA {version} from {fla_src}")
        tied = cfg.get("tie_word_embeddings", False)
        import transformers

        if (tied and isinstance(getattr(cls, "_tied_weights_keys", None), list)
                and int(transformers.__version__.split(".")[0]) >= 5):
            # transformers 5 wants {tied: source}; FLA still declares the 4.x list ["lm_head.weight"]
            emb = f"{getattr(cls, 'base_model_prefix', 'model')}.embeddings.weight"
            cls._tied_weights_keys = {k: emb for k in cls._tied_weights_keys}
            notes.append(f"{cls.__name__}._tied_weights_keys given as a dict for transformers 5: {cls._tied_weights_keys}")
        try:
            model = cls.from_pretrained(hf_dir, dtype=torch.float32).float().to(device).eval()
            check_weights(model, state, tied, f"{cls.__name__}.from_pretrained")
        except Exception as e:  # a transformers-version problem: say so, then load by hand
            notes.append(f"{cls.__name__}.from_pretrained failed ({type(e).__name__}: {e}); loaded by "
                         "config_class.from_json_file + load_state_dict instead")
            config = cls.config_class.from_json_file(os.path.join(hf_dir, "config.json"))
            model = cls(config).float()
            model.load_state_dict(state, strict=not tied)
            if tied:
                model.tie_weights()
            model = model.to(device).eval()
            check_weights(model, state, tied, f"{cls.__name__}(config) + load_state_dict")
        # non-persistent buffers are not in the file: RoPE's inverse frequencies must be FLA's own
        for sub in model.modules():
            if hasattr(sub, "_compute_inv_freq") and hasattr(sub, "inv_freq"):
                want = sub._compute_inv_freq(device="cpu")
                if not torch.allclose(sub.inv_freq.cpu(), want, rtol=1e-6, atol=0):
                    with torch.no_grad():
                        sub.inv_freq.copy_(want.to(sub.inv_freq.device))
                    sub._seq_len_cached = 0
                    notes.append("RotaryEmbedding.inv_freq was not FLA's after loading: recomputed")

        def forward(ids):
            return model(input_ids=ids, use_cache=False, return_dict=True, output_attentions=False,
                         output_hidden_states=False).logits

        variants = {}
        if mt == "mamba2":
            m2 = sys.modules["fla.layers.mamba2"]
            if m2.is_fast_path_available:
                notes.append("Mamba2 variant full/prefix: mamba_ssm's Triton kernels; variant torch: FLA's torch path")

                def forward_torch(ids):
                    m2.is_fast_path_available = False
                    try:
                        return forward(ids)
                    finally:
                        m2.is_fast_path_available = True

                variants["torch"] = forward_torch
            else:
                notes.append("Mamba2: mamba_ssm not importable, FLA's torch path only")
        return model, cls.__name__, forward, mt, variants

    try:
        from mamba_ssm.models.config_mamba import MambaConfig
        from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    except ImportError as e:
        raise LoadError(f"mamba_ssm cannot be imported ({type(e).__name__}: {e})") from e
    import mamba_ssm

    notes.append(f"mamba_ssm {getattr(mamba_ssm, '__version__', '?')} from {os.path.dirname(mamba_ssm.__file__)}")
    model = MambaLMHeadModel(MambaConfig(**cfg), device=device, dtype=torch.float32)
    tied = cfg.get("tie_embeddings", False)
    model.load_state_dict(state, strict=not tied)
    model.eval()
    check_weights(model, state, tied, "MambaLMHeadModel")
    layer = cfg.get("ssm_cfg", {}).get("layer", "Mamba1")

    def forward(ids):
        return model(ids).logits

    return model, type(model).__name__, forward, layer.lower(), {}


def compare(theirs, ours):
    diff = (theirs - ours).abs().max().item()
    scale = ours.abs().max().item()
    agree = (theirs.argmax(-1) == ours.argmax(-1)).float().mean().item()
    return {"max_abs_diff": diff, "max_abs_logit": scale, "ratio": diff / scale if scale else float("inf"),
            "argmax_agree": agree, "tokens": int(ours.shape[0])}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf", required=True, help="directory written by llmtrain export --format hf")
    parser.add_argument("--logits", required=True, nargs="+", help="safetensors written by llmtrain eval --dump-logits")
    parser.add_argument("--fla", help="flash-linear-attention source tree (the folder holding fla/)")
    parser.add_argument("--device", default="cuda", help="torch device (FLA's and mamba_ssm's kernels need a GPU)")
    parser.add_argument("--tol", type=float, help="largest allowed max|diff| / max|logit| (default: by model)")
    parser.add_argument("--prefix", type=int, default=64, help="tokens of the `prefix` variant (0: none)")
    args = parser.parse_args(argv)
    notes = []
    try:
        import torch
        from safetensors.torch import load_file

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dumps = []
        for path in args.logits:
            d = load_file(path)
            dumps.append((path, d["input_ids"].long(), d["logits"].float()))
        ids = dumps[0][1]
        for path, other, _ in dumps[1:]:
            if not torch.equal(other, ids):
                raise LoadError(f"{path} has other input_ids than {dumps[0][0]}")
        model, name, forward, kind, extra = load_reference(args.hf, args.fla, args.device, notes)
        # the extra variants first: a kernel fault in one variant (e.g. an illegal memory access in a
        # reference's Triton kernel) leaves the CUDA context unusable for every later one
        runs = {v: (f, ids) for v, f in extra.items()}
        runs["full"] = (forward, ids)
        if 0 < args.prefix < ids.numel():
            runs["prefix"] = (forward, ids[:args.prefix])
        theirs, failed = {}, {}
        with torch.no_grad():
            for v, (f, x) in runs.items():
                try:
                    theirs[v] = f(x[None].to(args.device))[0].float().cpu()
                except Exception as e:  # noqa: BLE001  (recorded per variant; none ran = the error below)
                    if not extra:
                        raise
                    failed[v] = f"{type(e).__name__}: {str(e)[:300]}"
                    print(f"interop_check: variant {v} failed: {failed[v]}", file=sys.stderr)
        if not theirs:
            raise LoadError("every variant failed: " + "; ".join(f"{v}: {m}" for v, m in failed.items()))
    except Exception as e:  # noqa: BLE001  (whatever fails, exit 2 with its message, not 1 = "too different")
        if not isinstance(e, LoadError):
            traceback.print_exc()
        print(f"interop_check: {type(e).__name__}: {e}", file=sys.stderr)
        for n in notes:
            print(f"interop_check: note: {n}", file=sys.stderr)
        return 2
    tol = args.tol if args.tol is not None else DEFAULT_TOL.get(kind, 1e-3)
    worst = 0
    for path, _, ref in dumps:
        out = {"hf": args.hf, "logits": path, "class": name, "tol": tol, "variants": {}}
        for v, t in theirs.items():
            if t.shape != ref[:t.shape[0]].shape:
                print(f"interop_check: {v}: logits of shape {tuple(t.shape)} from {name}, ours "
                      f"{tuple(ref[:t.shape[0]].shape)}", file=sys.stderr)
                return 2
            out["variants"][v] = compare(t, ref[:t.shape[0]])
        main_variant = "full" if "full" in theirs else next(iter(theirs))
        out["max_abs_diff"] = max(r["max_abs_diff"] for r in out["variants"].values())
        out["max_abs_logit"] = out["variants"][main_variant]["max_abs_logit"]
        out["ratio"] = max(r["ratio"] for r in out["variants"].values())
        out["argmax_agree"] = out["variants"][main_variant]["argmax_agree"]
        out["ok"] = out["ratio"] <= tol  # of the variants that ran; the failed ones are listed apart
        out["failed_variants"] = failed
        out["notes"] = notes
        print(json.dumps(out))
        worst = max(worst, 0 if out["ok"] else 1)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
