#!/usr/bin/env python3
"""Makes candle's backward pass store the first gradient reaching a tensor as it is.

Usage: candle-first-gradient.py CANDLE_CORE_DIR   (rewrites CANDLE_CORE_DIR/src/backprop.rs)

candle 0.11.1's `Tensor::backward` accumulates every gradient through `GradStore::or_insert`,
which fills a fresh tensor with zeros for the first gradient, and the call site then adds the
gradient into it:

    let sum_grad = grads.or_insert(arg)?;
    *sum_grad = sum_grad.add(&arg_grad)?;

So every edge of the graph costs a memset and an addition the size of its tensor (four bytes
moved per byte of gradient, two kernel launches), although in a transformer nearly every tensor
has one consumer and its sum one term. On a GPU, where the products are fast and such passes are
bound by memory traffic, that is most of the elementwise work of a backward pass. Upstream PRs
#3578 and #3822 (open) change it as this script does: `GradStore::accumulate` stores the first
gradient as it is and adds the later ones; `accumulate_neg` does the same for the rules that
subtract. A first gradient that is a strided view, or starts inside its storage, is copied out
as candle's sum would have been: CUDA's `index_add`, which a kept `or_insert` feeds, takes a
sum to start where its storage does. Where the first gradient's shape, dtype or device differs from
the tensor's, it takes candle's own path (zeros, then add), so candle's errors are unchanged.
The values are those of candle's path except the sign of a zero (0 + g is g; 0 - g is -g).

The call sites are rewritten where the `let … = grads.or_insert(…)?;` and its `*… = ….add(…)`
or `….sub(…)` are the only uses of the sum; the others (a sum scattered, index-added,
overwritten or moved to the sum's device) keep `or_insert`. The script checks what it did
against this version's counts and fails, changing nothing, if candle's file differs.
"""

import re
import sys
from pathlib import Path

# What candle 0.11.1's backprop.rs gives: call sites rewritten to add and to subtract, and those
# left to `or_insert`.
EXPECTED = {"accumulate": 59, "accumulate_neg": 6, "or_insert": 5}

HELPERS = '''
    /// Adds `grad` to `tensor`'s gradient. The first one is stored as it is (contiguous) rather
    /// than added into zeros: patched in by Mosaic's scripts/candle-first-gradient.py, as
    /// upstream PRs #3578 and #3822 do.
    fn accumulate(&mut self, tensor: &Tensor, grad: &Tensor) -> Result<()> {
        self.sum_in(tensor, grad, false)
    }

    /// Subtracts `grad` from `tensor`'s gradient: the first one is stored negated.
    fn accumulate_neg(&mut self, tensor: &Tensor, grad: &Tensor) -> Result<()> {
        self.sum_in(tensor, grad, true)
    }

    /// `tensor`'s gradient plus `grad`, or minus it if `negate`. Where there is none yet and
    /// `grad` has `tensor`'s shape, dtype and device, `grad` itself (negated), or a contiguous
    /// copy of it where it is a strided view or starts inside its storage, since the rules
    /// that keep `or_insert` (CUDA's `index_add`) take a sum to start where its storage does,
    /// as candle's zeros did; otherwise candle's own sum into zeros, with its errors.
    fn sum_in(&mut self, tensor: &Tensor, grad: &Tensor, negate: bool) -> Result<()> {
        let fits = tensor.shape() == grad.shape()
            && tensor.dtype() == grad.dtype()
            && tensor.device().same_device(grad.device());
        let own = grad.is_contiguous() && grad.layout().start_offset() == 0;
        let sum = match self.0.remove(&tensor.id()) {
            None if fits && negate => grad.neg()?,
            None if fits && own => grad.clone(),
            None if fits => grad.force_contiguous()?,
            sum => {
                let sum = match sum {
                    Some(sum) => sum,
                    None => tensor.zeros_like()?,
                };
                if negate {
                    sum.sub(grad)?
                } else {
                    sum.add(grad)?
                }
            }
        };
        self.0.insert(tensor.id(), sum);
        Ok(())
    }
'''

LET = re.compile(r"\n([ \t]*)let (\w+) = grads\.or_insert\(([\w.]+)\)\?;")


def closing(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at `open_at`."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced parentheses from offset {open_at}")


def rewrite(source: str) -> tuple[str, dict]:
    """The source with its call sites rewritten, and how many of each kind."""
    counts = {"accumulate": 0, "accumulate_neg": 0, "or_insert": 0}
    out, at = [], 0
    lets = list(LET.finditer(source))
    for let, after in zip(lets, lets[1:] + [None]):
        name, target = let.group(2), let.group(3)
        # The update, if any, comes before the next call site.
        end = after.start() if after else len(source)
        update = re.compile(r"\*%s = %s\.(add|sub)\(&" % (name, name)).search(source, let.end(), end)
        if update is None:
            counts["or_insert"] += 1
            continue
        arg_open = update.end() - 2
        arg_close = closing(source, arg_open)
        argument = source[arg_open + 2 : arg_close]
        between = source[let.end() : update.start()]
        # The sum's dims are the tensor's; any other use of the sum keeps or_insert.
        argument = argument.replace(f"{name}.dims()", f"{target}.dims()")
        if re.search(r"\b%s\b" % name, between + argument):
            counts["or_insert"] += 1
            continue
        kind = "accumulate" if update.group(1) == "add" else "accumulate_neg"
        counts[kind] += 1
        out.append(source[at : let.start()])
        out.append(between)
        out.append(f"grads.{kind}({target}, &{argument})")
        at = arg_close + 1
    out.append(source[at:])
    text = "".join(out)
    anchor = "    /// Extend this gradient store with the contents of another."
    if text.count(anchor) != 1:
        raise ValueError("GradStore::extend's doc comment, where the helpers go, is not found once")
    return text.replace(anchor, HELPERS.lstrip("\n") + "\n" + anchor), counts


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    path = Path(sys.argv[1]) / "src" / "backprop.rs"
    try:
        text, counts = rewrite(path.read_text())
    except (OSError, ValueError) as e:
        print(f"candle-first-gradient: {path}: {e}", file=sys.stderr)
        return 1
    if counts != EXPECTED:
        print(
            f"candle-first-gradient: {path}: rewrote {counts}, expected {EXPECTED} "
            "(a candle version this script was not written for?); left unchanged",
            file=sys.stderr,
        )
        return 1
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
