#!/usr/bin/env python3
"""Compare our logits with the reference library's on the same tokens (docs/INTEROP.md, "Checking").

Usage: scripts/interop_check.py --hf HF_DIR --logits OURS.safetensors [--fla FLA_SRC] [--device cuda] [--tol 1e-3]

HF_DIR is what `llmtrain export --format hf` wrote; OURS.safetensors what `llmtrain eval --dump-logits` wrote for
the same checkpoint (input_ids i32 [n], logits f32 [n, vocab]). The model is loaded in float32 with
flash-linear-attention's classes (config.json has a model_type; FLA_SRC is a checkout of
fla-org/flash-linear-attention, or of the MDN authors' vendored copy for momentum_deltanet, put first on
sys.path) or with mamba_ssm's MambaLMHeadModel (Mamba-3: config.json is a MambaConfig), run on input_ids, and
its logits compared with ours. Prints one JSON line: the largest absolute difference, the largest |logit|,
their ratio, and the fraction of positions whose argmax agrees. Exits 1 when the ratio exceeds --tol, 2 when
something cannot be loaded (the message says what).
"""
import argparse
import json
import os
import sys


def load_reference(hf_dir, device):
    """The reference model of HF_DIR in float32 on `device`, in eval mode, and its class name."""
    import torch

    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if "model_type" in cfg:
        import fla  # noqa: F401  (registers FLA's configurations and models with transformers' Auto classes)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    else:
        from mamba_ssm.models.config_mamba import MambaConfig
        from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
        from safetensors.torch import load_file

        model = MambaLMHeadModel(MambaConfig(**cfg), device=device, dtype=torch.float32)
        state = load_file(os.path.join(hf_dir, "model.safetensors"))
        tied = cfg.get("tie_embeddings", False)
        missing, unexpected = model.load_state_dict(state, strict=not tied)
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise ValueError(f"{hf_dir}: parameters missing {missing} or unexpected {unexpected}")
    return model.to(device).eval(), type(model).__name__


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf", required=True, help="directory written by llmtrain export --format hf")
    parser.add_argument("--logits", required=True, help="safetensors written by llmtrain eval --dump-logits")
    parser.add_argument("--fla", help="flash-linear-attention source checkout to import fla from")
    parser.add_argument("--device", default="cuda", help="torch device (FLA's kernels need a GPU)")
    parser.add_argument("--tol", type=float, default=1e-3, help="largest allowed max|diff| / max|logit|")
    args = parser.parse_args(argv)
    if args.fla:
        sys.path.insert(0, os.path.abspath(args.fla))
    try:
        import torch
        from safetensors.torch import load_file

        ours = load_file(args.logits)
        ids, ref = ours["input_ids"].long(), ours["logits"].float()
        model, name = load_reference(args.hf, args.device)
        with torch.no_grad():
            theirs = model(ids[None].to(args.device)).logits[0].float().cpu()
    except (ImportError, OSError, KeyError, ValueError) as e:
        print(f"interop_check: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if theirs.shape != ref.shape:
        print(f"interop_check: logits of shape {tuple(theirs.shape)} from {name}, ours {tuple(ref.shape)}", file=sys.stderr)
        return 2
    diff = (theirs - ref).abs().max().item()
    scale = ref.abs().max().item()
    agree = (theirs.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(json.dumps({"hf": args.hf, "class": name, "tokens": ids.numel(), "max_abs_diff": diff,
                      "max_abs_logit": scale, "ratio": diff / scale, "argmax_agree": agree}))
    return 0 if diff <= args.tol * scale else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
