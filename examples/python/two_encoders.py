"""Profile a small two-encoder model with mosaic.torch and plan it with Mosaic.

The model: a ViT-style image encoder and a transformer text encoder, both feeding a fusion head
that projects each into a joint space and trains them with a CLIP-style contrastive loss. The
script

1. profiles the three modules with ``mosaic.torch.profile`` — on this machine's GPU (SM
   partitions from CUDA green contexts) if it has one, else on the CPU (``device="cpu"``: quota
   1.0 only, and the "GPUs" of the plan stand for ranks like this CPU);
2. writes the profile (``--out``, default ``two_encoders_profile.json``);
3. plans it with ``mosaic.plan`` on ``--gpus`` GPUs and prints the plan and its predicted
   speed-up over running the modules one after another on all GPUs (``mosaic.compare``'s
   Megatron-LM row).

    python examples/python/two_encoders.py --gpus 4
    python examples/python/two_encoders.py --gpus 8 --device cuda --graphs

Needs PyTorch; planning needs the ``mosaic`` Python package (its native ``mosaic._core``). Without
it, the profile is still written and the equivalent ``mosaic plan`` command is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class ImageEncoder(nn.Module):
    """ViT-style: patches embedded by a strided convolution, a class token, transformer layers."""

    def __init__(self, image=64, patch=8, width=128, layers=4, heads=4):
        super().__init__()
        self.patch = nn.Conv2d(3, width, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.norm(self.blocks(x))[:, 0]


class TextEncoder(nn.Module):
    """Token and position embeddings, transformer layers, mean pooling."""

    def __init__(self, vocab=1000, length=32, width=128, layers=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(1, length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[:, : ids.shape[1]]
        return self.norm(self.blocks(x)).mean(dim=1)


class FusionHead(nn.Module):
    """Projects both features into a joint space; returns the symmetric contrastive loss."""

    def __init__(self, image_width=128, text_width=128, joint=64):
        super().__init__()
        self.image = nn.Linear(image_width, joint, bias=False)
        self.text = nn.Linear(text_width, joint, bias=False)
        self.scale = nn.Parameter(torch.tensor(2.659))

    def forward(self, image_feat, text_feat):
        zi = F.normalize(self.image(image_feat), dim=-1)
        zt = F.normalize(self.text(text_feat), dim=-1)
        logits = self.scale.exp() * zi @ zt.t()
        labels = torch.arange(zi.shape[0], device=zi.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def import_mosaic():
    """``(mosaic or None, mosaic.torch)``: the installed package, else this checkout's python/."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo_python = os.path.normpath(os.path.join(here, "..", "..", "python"))
    if importlib.util.find_spec("mosaic") is None:
        sys.path.insert(0, repo_python)
    try:
        import mosaic
        import mosaic.torch as mt
        return (mosaic if hasattr(mosaic, "plan") else None), mt
    except ImportError as e:
        # The native planner is not built: load the profiler alone, straight from its file.
        print(f"(mosaic Python package not importable: {e}; profiling only)", file=sys.stderr)
        path = os.path.join(repo_python, "mosaic", "torch.py")
        spec = importlib.util.spec_from_file_location("mosaic_torch_standalone", path)
        mt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mt)
        return None, mt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=4, help="GPUs to plan for (default 4)")
    ap.add_argument("--global-batch", type=int, default=32, help="global batch (default 32)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="where to profile (auto: cuda if available, else cpu)")
    ap.add_argument("--graphs", action="store_true",
                    help="GPU only: capture each module's step as a CUDA graph")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per sample (median)")
    ap.add_argument("--out", default="two_encoders_profile.json", help="where to write the profile")
    args = ap.parse_args(argv)
    if args.gpus < 1:
        ap.error("--gpus must be at least 1")

    mosaic, mt = import_mosaic()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)

    gb = args.global_batch
    modules = {"image": ImageEncoder(), "text": TextEncoder(), "fusion": FusionHead()}
    after = {"fusion": ["image", "text"]}
    inputs = {
        "image": lambda b: (torch.randn(b, 3, 64, 64),),
        "text": lambda b: (torch.randint(0, 1000, (b, 32)),),
        # The head's inputs stand for the encoders' outputs: features of their widths.
        "fusion": lambda b: (torch.randn(b, 128), torch.randn(b, 128)),
    }
    # dp 1, 2, 4, … up to the pool: per-GPU batch = global batch / dp.
    batches = [gb // d for d in (1, 2, 4, 8, 16, 32, 64) if d <= args.gpus and gb % d == 0]
    print(f"profiling on {device}: per-GPU batches {batches} (dp {[gb // b for b in batches]})",
          file=sys.stderr)
    prof = mt.profile(modules, after, inputs, global_batch=gb, batches=batches, device=device,
                      graphs=args.graphs, reps=args.reps, verbose=True)
    with open(args.out, "w") as f:
        json.dump(prof, f, indent=1)
    print(f"profile written to {args.out} ({prof['device']['name']})")
    if device == "cpu":
        print("CPU timings: the plan's GPUs stand for ranks like this CPU, at quota 1.0 only.")

    if mosaic is None:
        print(f"to plan it: mosaic plan --profiles {args.out} --gpus {args.gpus}")
        return 0
    profile = mosaic.Profile.from_dict(prof, name=args.out)
    plan = mosaic.plan(profile, args.gpus)
    print()
    print(plan)
    rows = mosaic.compare(profile, args.gpus, global_batch=gb)
    seq = next((r for r in rows if r["name"] == "Megatron-LM"), None)
    if seq is None or not seq.get("iteration_ms"):
        print(f"(no Megatron-LM row: every module needs a sample at dp {args.gpus}, quota 1.0)")
    else:
        print(f"one after another on all {args.gpus} GPUs (Megatron-LM): {seq['iteration_ms']:.3f} ms;"
              f" Mosaic's plan: {plan.iteration_ms:.3f} ms -> predicted speed-up "
              f"{seq['iteration_ms'] / plan.iteration_ms:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
