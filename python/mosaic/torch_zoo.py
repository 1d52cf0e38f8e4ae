"""A built-in model's modules as plain PyTorch, trained the way the paper's engine trains them.

``mosaic.torch_zoo.modules(spec)`` turns one model of ``mosaic.zoo()["models"]`` (or of ``mosaic
zoo --json``) into the ``modules``, ``after`` and ``inputs`` that :func:`mosaic.torch.profile`
takes, so that a GPU's measurements of the zoo's own architectures can be held against the
device model (``mosaic calibrate --profiles measured.json --model NAME --device h100``)::

    import mosaic, mosaic.torch, mosaic.torch_zoo as tz
    spec = tz.model_spec("imagebind")
    modules, after, inputs = tz.modules(spec)
    prof = mosaic.torch.profile(modules, after, inputs,
                                global_batch=spec["single_node_batch"], batches=[16],
                                autocast=torch.bfloat16, optimizer=tz.fused_adamw,
                                device_name=tz.device_name())

What a module is, as in ``shared/measurements/h100/measure.py`` (the PyTorch engine measured on
an H100): a transformer tower of pre-norm blocks (LayerNorm, one q/k/v projection,
``scaled_dot_product_attention``, the output projection, LayerNorm, the MLP with GELU, or
SwiGLU for a gated one) and a final LayerNorm, over the embedded sequence ``[batch, tokens,
hidden]`` — the embedding itself (patch convolution, token lookup, a small share of the step)
is left out; a contrastive head projects each input's features into its width and takes the
InfoNCE loss of the first input against each other one (``kernels.rs``'s contrastive head).
Frozen modules have no trainable parameters, so ``mosaic.torch`` runs them forward only, as the
zoo's device model does. Modules of other kinds (language-model heads, decoders, grouped-query
attention) are refused naming the module: this builder does not know them.

Imported only when used: importing it imports PyTorch.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A pre-norm transformer block: attention, then the MLP, each with a residual."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool, gated: bool):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o = nn.Linear(hidden, hidden)
        self.up = nn.Linear(hidden, (2 if gated else 1) * ffn)
        self.down = nn.Linear(ffn, hidden)
        self.heads, self.causal, self.gated = heads, causal, gated

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = (self.qkv(self.n1(x)).view(b, t, 3, self.heads, h // self.heads)
                   .permute(2, 0, 3, 1, 4))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
        u = self.up(self.n2(x))
        if self.gated:
            gate, u = u.chunk(2, dim=-1)
            u = F.silu(gate) * u
        else:
            u = F.gelu(u)
        return x + self.down(u)


class Tower(nn.Module):
    """``layers`` blocks and a final LayerNorm over an embedded sequence."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int, causal: bool,
                 gated: bool):
        super().__init__()
        self.blocks = nn.ModuleList(
            [Block(hidden, heads, ffn, causal, gated) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Contrastive(nn.Module):
    """Projects each input's features into ``joint`` and returns the InfoNCE loss (both
    directions) of the first input against each other one, with a learned temperature."""

    def __init__(self, widths, joint: int):
        super().__init__()
        self.proj = nn.ModuleList([nn.Linear(w, joint, bias=False) for w in widths])
        self.scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, *features):
        z = [F.normalize(p(f), dim=-1) for p, f in zip(self.proj, features)]
        labels = torch.arange(z[0].shape[0], device=z[0].device)
        loss = 0.0  # as measure.py: no kernel for the zero
        for other in z[1:]:
            logits = self.scale.exp() * z[0] @ other.t()
            loss = loss + F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)
        return loss


def model_spec(name: str) -> dict:
    """Model ``name`` of the zoo: from the native module (``mosaic.zoo()``) where it is built,
    else from ``mosaic zoo --json`` (the binary ``$MOSAIC_BIN``, or ``mosaic`` on the PATH).

    Raises:
        ValueError: no such model; RuntimeError: neither the native module nor the binary.
    """
    try:
        from mosaic import _core  # noqa: F401  (the native module, where built)
        import mosaic

        zoo = mosaic.zoo()
    except ImportError:
        binary = os.environ.get("MOSAIC_BIN") or shutil.which("mosaic")
        if not binary:
            raise RuntimeError("the zoo needs the native mosaic._core (pip install .) or the "
                               "mosaic binary (set MOSAIC_BIN)") from None
        try:
            out = subprocess.run([binary, "zoo", "--json"], capture_output=True, text=True,
                                 check=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            why = (getattr(e, "stderr", None) or str(e)).strip()
            raise RuntimeError(f"`{binary} zoo --json` failed: {why}") from None
        zoo = json.loads(out)
    for m in zoo["models"]:
        if m["name"] == name:
            return m
    known = ", ".join(m["name"] for m in zoo["models"])
    raise ValueError(f"no model {name!r} in the zoo (known: {known})")


def _scaled(n: int, size: float, multiple: int = 1) -> int:
    """``n × size`` rounded to a positive multiple of ``multiple``."""
    return max(multiple, round(n * size / multiple) * multiple)


def modules(spec: Mapping[str, Any], size: float = 1.0) -> tuple:
    """``(modules, after, inputs)`` of zoo model ``spec`` for :func:`mosaic.torch.profile`.

    ``size`` scales hidden widths (kept a multiple of the heads), MLP widths and tokens (at
    least 1 each) for a small copy that runs anywhere; 1.0 is the zoo's real size. ``inputs``
    makes random embedded sequences (towers) or features (heads) at a given batch.

    Raises:
        ValueError: ``size`` not in (0, 1], or a module this builder does not know (named).
    """
    if not (isinstance(size, (int, float)) and 0 < size <= 1):
        raise ValueError(f"size must lie in (0, 1], got {size!r}")
    specs = {m["name"]: m for m in spec["modules"]}
    kinds = {name: _kind(m) for name, m in specs.items()}  # refuse before building anything
    built, after, inputs = {}, {}, {}
    for m in spec["modules"]:
        name = m["name"]
        kind = kinds[name]
        if kind == "tower":
            heads = m["heads"]
            h = _scaled(m["hidden"], size, heads)
            ffn, tokens = _scaled(m["ffn"], size), _scaled(m["tokens"], size)
            net = Tower(m["layers"], h, heads, ffn, m["causal"], m["gated_ffn"])
            inputs[name] = (lambda t, w: lambda b: (torch.randn(b, t, w),))(tokens, h)
        else:
            widths = []
            for p in m["after"]:
                if p not in specs or _kind(specs[p]) != "tower":
                    raise ValueError(f"module {name!r}: input {p!r} is not a tower this builder "
                                     f"makes")
                widths.append(_scaled(specs[p]["hidden"], size, specs[p]["heads"]))
            net = Contrastive(widths, _scaled(m["hidden"], size))
            inputs[name] = (lambda ws: lambda b: tuple(torch.randn(b, w) for w in ws))(widths)
        if not m["trainable"]:
            net.requires_grad_(False)
        built[name] = net
        after[name] = list(m["after"])
    return built, after, inputs


def _kind(m: Mapping[str, Any]) -> str:
    """``"tower"`` or ``"contrastive"``; ValueError naming what this builder does not know."""
    name = m["name"]
    vocab = any(e.get("vocab", 0) > 0 for e in m.get("extras", []))
    if m.get("decoder_layers", 0) > 0 or vocab:
        raise ValueError(f"module {name!r}: decoder layers or a vocabulary head are not built "
                         f"here (towers and contrastive heads only)")
    if m["layers"] > 0:
        if m.get("kv_heads", m["heads"]) != m["heads"]:
            raise ValueError(f"module {name!r}: grouped-query attention is not built here")
        return "tower"
    if m["role"] == "head" and len(m["after"]) >= 2:
        return "contrastive"
    raise ValueError(f"module {name!r} (role {m['role']}, no layers) is neither a tower nor a "
                     f"contrastive head of two or more inputs: not built here")


def fused_adamw(params):
    """AdamW as the paper's engine steps it (lr 1e-4): fused on a GPU, the default elsewhere."""
    params = list(params)
    on_gpu = all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=1e-4, fused=on_gpu)


#: The zoo's devices: (name, short name), as ``mosaic zoo`` lists them.
DEVICES = (("H100-SXM5-80GB", "h100"), ("H200-SXM-141GB", "h200"), ("A100-SXM4-80GB", "a100"))


def device_name(index: int = 0) -> Optional[str]:
    """The zoo's name of CUDA device ``index`` (``"H100-SXM5-80GB"`` for PyTorch's ``"NVIDIA
    H100 80GB HBM3"``), matched by the zoo device's short name within PyTorch's name, so that
    ``mosaic calibrate`` accepts the file; None without CUDA or a match."""
    if not torch.cuda.is_available():
        return None
    return zoo_device(torch.cuda.get_device_properties(index).name)


def zoo_device(gpu_name: str) -> Optional[str]:
    """The zoo's device name whose short name (h100, h200, a100) is a word of ``gpu_name``, or
    None (also for a PCIe card: the zoo's are SXM parts, with more SMs)."""
    if re.search(r"PCIE", gpu_name, re.I):
        return None
    return next((name for name, short in DEVICES
                 if re.search(rf"\b{short}\b", gpu_name, re.I)), None)


def short_name(zoo_name: str) -> Optional[str]:
    """The short name (``mosaic calibrate --device``) of zoo device ``zoo_name``, or None."""
    return next((short for name, short in DEVICES if name == zoo_name), None)
