#!/usr/bin/env python3
"""Writes dicts/TARGET.dict: the tokens AFL++ splices into inputs (the build has no LLVM plugins,
so no CmpLog or auto-dictionary finds them itself). For the JSON targets: every key and string
of the target's seeds, JSON syntax, and the numbers at the loaders' limits; for the safetensors
targets: the header's keys, dtypes, the tensor names and the checkpoint metadata's keys.
Run from fuzz/ after changing the seeds: python3 dicts/make_dicts.py"""
import json, os, struct

NUMBERS = ["0", "-0", "1", "-1", "0.0", "1.0", "0.001", "0.0009", "1e-3", "1.0000001", "0.5",
           "1e9", "1e6", "1e308", "1e309", "-1e308", "5e-324", "65535", "65536", "65537",
           "10000", "10001", "4294967295", "4294967296", "18446744073709551615",
           "18446744073709551616", "9007199254740993", "2147483648", "NaN", "Infinity"]
SYNTAX = ["{", "}", "[", "]", ":", ",", "\"\"", "null", "true", "false", "[]", "{}",
          "\"\\u0000\"", "\"\\ud800\""]
ZOO = ["clip", "qwen3-vl", "unified-io-2", "imagebind", "ofasys", "ctvlm", "ofasys-4",
       "h100x4", "h100x8", "h100x16", "h100x32", "h200x8", "a100x8", "h100x0",
       "h100x65536", "h100x65537", "a100x1", "h200x24"]
SAFETENSORS = ["__metadata__", "dtype", "shape", "data_offsets", "F32", "F16", "BF16", "F64",
               "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "BOOL", "F8_E4M3",
               "F8_E5M2", "mosaic", "format", "mosaic-checkpoint/1", "model", "seed", "batch",
               "step", "schedule", "modules", "crc32", "name", "adam_t", "adamw", "lr",
               "beta1", "beta2", "eps", "weight_decay", "clip-tiny", "omni-tiny", "image",
               "text", "vision", "align", "param", "adam_m", "adam_v"]

def esc(s):
    return s.replace("\\", "\\\\").replace('"', '\\"')

def strings(v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            out.add('"%s"' % k)
            strings(x, out)
    elif isinstance(v, list):
        for x in v:
            strings(x, out)
    elif isinstance(v, str):
        out.add('"%s"' % v)

def safetensors_header(path, out):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    for k, v in h.items():
        out.add('"%s"' % k)
        if k == "__metadata__":
            for mk, mv in v.items():
                out.add('"%s"' % mk)
                strings(json.loads(mv), out)

def write(target, tokens):
    with open("dicts/%s.dict" % target, "w") as f:
        f.write("# AFL++ dictionary for the %s target (written by dicts/make_dicts.py)\n" % target)
        for i, t in enumerate(sorted(tokens)):
            f.write('t%d="%s"\n' % (i, esc(t)))

for target in sorted(os.listdir("seeds")):
    tokens = set()
    for name in sorted(os.listdir("seeds/" + target)):
        path = "seeds/%s/%s" % (target, name)
        if name.endswith(".safetensors"):
            try:
                safetensors_header(path, tokens)
            except Exception:
                pass
        elif name.endswith(".jsonl"):
            for line in open(path):
                try:
                    strings(json.loads(line), tokens)
                except ValueError:
                    pass
        else:
            try:
                strings(json.load(open(path)), tokens)
            except ValueError:
                pass
    if target in ("checkpoint", "data"):
        tokens |= set('"%s"' % s for s in SAFETENSORS) | {"{", "}", "[", "]", ":", ","}
        tokens |= set(NUMBERS)
    else:
        tokens |= set(SYNTAX) | set(NUMBERS)
        if target in ("plans", "profiles", "colocations"):
            tokens |= set('"%s"' % s for s in ZOO)
    tokens = {t for t in tokens if 0 < len(t.encode()) <= 128}
    write(target, tokens)
    print(target, len(tokens), "tokens")
