//! Packing changes the speed, not the mathematics: texts packed FlowTrain-style into shared
//! rows with block-diagonal masks give the loss and every gradient that one-sample-per-row
//! padding gives, and no sample reads another packed beside it.

use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use mosaic_engine::models::data::{Batch, DataSource, Field};
use mosaic_engine::models::nn::{to_f32s, BlockDims, ParamBuilder, Params};
use mosaic_engine::models::packed::Packing;
use mosaic_engine::models::towers::{Pool, TextTower};
use mosaic_engine::models::{self, TextLayout};
use mosaic_engine::{sequential_plan, Schedule, TrainConfig, Trainer};
use mosaic_kit::rng::SplitMix64;
use proptest::prelude::*;

const CPU: Device = Device::Cpu;
const DIMS: BlockDims = BlockDims {
    dim: 8,
    heads: 2,
    mlp: 16,
    layers: 2,
};
const VOCAB: usize = 20;

/// `a` and `b` agree element by element within 1e-4 of the larger value or of the tensor's
/// largest, whichever is more, or 1e-5: packing sums an element's f32 terms in another order,
/// and the rounding of a sum scales with its terms, which can be as large as the tensor's
/// largest value while the sum itself cancels to a small one (a case found a gradient of
/// −0.07341 vs −0.07343 in a tensor whose terms are larger).
fn close(a: &[f32], b: &[f32]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} values vs {}", a.len(), b.len()));
    }
    let scale = a.iter().chain(b).fold(0.0f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let tol = 1e-5f32.max(1e-4 * x.abs().max(y.abs()).max(scale));
        let within = (x - y).abs() <= tol; // false for NaN
        if !within {
            return Err(format!("value {i}: {x} vs {y}"));
        }
    }
    Ok(())
}

/// A text tower of `width` tokens (small dims) and its parameters.
fn tower(width: usize, causal: bool, pool: Pool, seed: u64) -> (TextTower, Params) {
    let mut pb = ParamBuilder::new(SplitMix64::new(seed), &CPU);
    let t = TextTower::new(&mut pb, VOCAB, width, DIMS, causal, pool).unwrap();
    (t, pb.finish())
}

fn ids(n: usize, width: usize, seed: u64) -> Tensor {
    let mut rng = SplitMix64::new(seed);
    let v: Vec<u32> = (0..n * width)
        .map(|_| rng.below(VOCAB as u64) as u32)
        .collect();
    Tensor::from_vec(v, (n, width), &CPU).unwrap()
}

/// The tower's output on `ids` of `lengths` laid out as `layout`, and the gradient of every
/// parameter of `Σ out ⊙ w` for a fixed random `w`.
fn run(
    tower: &TextTower,
    params: &Params,
    ids: &Tensor,
    lengths: &[u32],
    layout: TextLayout,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let out = tower.run(ids, Some(lengths), layout).unwrap();
    let w = SplitMix64::new(99).normals(out.elem_count(), 1.0);
    let w = Tensor::from_vec(w, out.shape(), &CPU).unwrap();
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let g = params
        .iter()
        .map(|(_, v): (&str, &Var)| match grads.get(v.as_tensor()) {
            Some(g) => to_f32s(g).unwrap(),
            None => vec![0.0; v.elem_count()],
        })
        .collect();
    (to_f32s(&out.flatten_all().unwrap()).unwrap(), g)
}

fn pool() -> impl Strategy<Value = Pool> {
    prop_oneof![Just(Pool::First), Just(Pool::Last), Just(Pool::Sequence)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The tower, packed and padded: the same outputs and the same gradient of every parameter.
    #[test]
    fn packed_and_padded_towers_agree(
        lengths in prop::collection::vec(1u32..=12, 1..14),
        causal in any::<bool>(),
        pool in pool(),
        seed in any::<u64>(),
    ) {
        let (t, params) = tower(12, causal, pool, seed);
        let x = ids(lengths.len(), 12, seed ^ 1);
        let packed = run(&t, &params, &x, &lengths, TextLayout::Packed);
        let padded = run(&t, &params, &x, &lengths, TextLayout::Padded);
        prop_assert!(Packing::new(&lengths, 12).unwrap().rows().len() <= lengths.len());
        close(&packed.0, &padded.0).map_err(|e| TestCaseError::fail(format!("output: {e}")))?;
        for ((name, _), (a, b)) in params.iter().zip(packed.1.iter().zip(&padded.1)) {
            close(a, b).map_err(|e| TestCaseError::fail(format!("∂/∂{name}: {e}")))?;
        }
    }

    /// A sample's output does not move when the samples packed beside it change (their tokens,
    /// and their lengths, which may reshuffle the rows).
    #[test]
    fn packed_samples_do_not_read_each_other(
        lengths in prop::collection::vec(1u32..=12, 2..10),
        other in prop::collection::vec(1u32..=12, 2..10),
        causal in any::<bool>(),
        pool in prop_oneof![Just(Pool::First), Just(Pool::Last)],
        seed in any::<u64>(),
    ) {
        let (t, _) = tower(12, causal, pool, seed);
        let x = ids(lengths.len(), 12, seed ^ 1);
        let before = t.run(&x, Some(&lengths), TextLayout::Packed).unwrap();
        // Sample 0 kept, every other sample's tokens redrawn.
        let y = Tensor::cat(
            &[&x.narrow(0, 0, 1).unwrap(), &ids(lengths.len() - 1, 12, seed ^ 2)],
            0,
        )
        .unwrap();
        let same_rows = t.run(&y, Some(&lengths), TextLayout::Packed).unwrap();
        let a = to_f32s(&before.get(0).unwrap()).unwrap();
        // Same layout: bit for bit.
        prop_assert_eq!(&a, &to_f32s(&same_rows.get(0).unwrap()).unwrap());
        // Other lengths (and so other neighbours and offsets): within float tolerance.
        let mut relengthed = other.clone();
        relengthed[0] = lengths[0];
        let z = ids(relengthed.len(), 12, seed ^ 3);
        let z = Tensor::cat(&[&x.narrow(0, 0, 1).unwrap(), &z.narrow(0, 1, z.dim(0).unwrap() - 1).unwrap()], 0).unwrap();
        let moved = t.run(&z, Some(&relengthed), TextLayout::Packed).unwrap();
        close(&a, &to_f32s(&moved.get(0).unwrap()).unwrap()).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn samples_share_rows_and_padding_is_never_read() {
    let (t, _) = tower(16, true, Pool::Last, 5);
    let lengths = [5, 4, 3, 2];
    assert_eq!(Packing::new(&lengths, 16).unwrap().rows().len(), 1);
    let x = ids(4, 16, 6);
    let out = t.run(&x, Some(&lengths), TextLayout::Packed).unwrap();
    // Tokens past every length replaced: nothing moves, packed or padded.
    let mask: Vec<u32> = lengths
        .iter()
        .flat_map(|&l| (0..16).map(move |p| u32::from(p < l as usize)))
        .collect();
    let mask = Tensor::from_vec(mask, (4, 16), &CPU).unwrap();
    let y = x.mul(&mask).unwrap();
    for layout in [TextLayout::Packed, TextLayout::Padded] {
        let o = t.run(&y, Some(&lengths), layout).unwrap();
        close(
            &to_f32s(&out.flatten_all().unwrap()).unwrap(),
            &to_f32s(&o.flatten_all().unwrap()).unwrap(),
        )
        .unwrap();
    }
    // Full lengths mean what no lengths mean.
    let full = t.run(&x, Some(&[16; 4]), TextLayout::Packed).unwrap();
    let none = t.run(&x, None, TextLayout::Packed).unwrap();
    close(
        &to_f32s(&full.flatten_all().unwrap()).unwrap(),
        &to_f32s(&none.flatten_all().unwrap()).unwrap(),
    )
    .unwrap();
}

#[test]
fn bad_lengths_are_errors_not_panics() {
    let (t, _) = tower(8, false, Pool::Last, 1);
    let x = ids(3, 8, 2);
    for (lengths, layout) in [
        (vec![1, 0, 3], TextLayout::Packed),
        (vec![1, 9, 3], TextLayout::Padded),
        (vec![1, 2], TextLayout::Packed),
    ] {
        assert!(t.run(&x, Some(&lengths), layout).is_err(), "{lengths:?}");
    }
}

/// A data source that gives one fixed batch at every step.
struct Fixed(Batch, Vec<Field>);

impl DataSource for Fixed {
    fn batch(&self, _: u64, _: usize, _: &Device) -> candle_core::Result<Batch> {
        Ok(self.0.clone())
    }

    fn fields(&self) -> Vec<Field> {
        self.1.clone()
    }
}

/// `name`'s trainer, texts laid out as `layout`, on its step-0 batch of `lengths.len()`
/// samples with `lengths` and random tokens; every module ×2 when `staged`.
fn trainer(name: &str, layout: TextLayout, lengths: &[u32], seed: u64, staged: bool) -> Trainer {
    let mut m = models::build_with(name, 11, &CPU, layout).unwrap();
    let n = lengths.len();
    let mut b = m.data.batch(0, n, &CPU).unwrap();
    let width = b.tensors["text"].dim(1).unwrap();
    let vocab = match name {
        "clip-tiny" => 64,
        _ => 32,
    };
    let mut rng = SplitMix64::new(seed);
    let text: Vec<u32> = (0..n * width).map(|_| rng.below(vocab) as u32).collect();
    b.tensors
        .insert("text", Tensor::from_vec(text, (n, width), &CPU).unwrap());
    b.tensors.insert(
        "text_len",
        Tensor::from_vec(
            lengths
                .iter()
                .map(|&l| l.min(width as u32))
                .collect::<Vec<_>>(),
            n,
            &CPU,
        )
        .unwrap(),
    );
    m.data = Box::new(Fixed(b, m.data.fields()));
    let schedule = if staged {
        // Every module data parallel over 2: each text replica packs its own shard.
        let plan = sequential_plan(&m, 2);
        Schedule::from_plan(&plan, Path::new("plan.json"), &m, n, 2).unwrap()
    } else {
        Schedule::sequential(&m, 2)
    };
    let config = TrainConfig {
        batch: n,
        ..TrainConfig::default()
    };
    Trainer::new(m, schedule, config).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whole models, packed and padded: the same loss and every parameter's gradient.
    #[test]
    fn packed_and_padded_models_agree(
        lengths in prop::collection::vec(1u32..=16, 2..12),
        omni in any::<bool>(),
        staged in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let name = if omni { "omni-tiny" } else { "clip-tiny" };
        let (lp, gp) = trainer(name, TextLayout::Packed, &lengths, seed, staged).gradients().unwrap();
        let (lq, gq) = trainer(name, TextLayout::Padded, &lengths, seed, staged).gradients().unwrap();
        close(&[lp], &[lq]).map_err(|e| TestCaseError::fail(format!("loss: {e}")))?;
        prop_assert_eq!(gp.len(), gq.len());
        for (a, b) in gp.iter().zip(&gq) {
            close(&to_f32s(&a.grad).unwrap(), &to_f32s(&b.grad).unwrap())
                .map_err(|e| TestCaseError::fail(format!("{name}: ∂/∂{}.{}: {e}", a.module, a.name)))?;
        }
    }
}

#[test]
fn the_built_in_models_pack_their_texts() {
    for name in ["clip-tiny", "omni-tiny"] {
        let m = models::build(name, 0, &CPU).unwrap();
        let b = m.data.batch(0, 64, &CPU).unwrap();
        let width = b.tensors["text"].dim(1).unwrap();
        let lengths: Vec<u32> = b.tensors["text_len"].to_vec1().unwrap();
        assert!(lengths.iter().all(|&l| l >= 1 && l as usize <= width));
        assert!(
            lengths.iter().any(|&l| (l as usize) < width / 2),
            "{name}: {lengths:?}"
        );
        let rows = Packing::new(&lengths, width).unwrap().rows().len();
        assert!(
            2 * rows < 3 * lengths.len() / 2,
            "{name}: {rows} rows for 64 texts"
        );
        assert!(m.data.fields().iter().any(|f| f.lengths_of == Some("text")));
    }
}

/// Median and minimum milliseconds of `a` and of `b`, run alternately (so that a busy
/// machine slows both alike), after 3 warm-ups each.
fn ab_ms(mut a: impl FnMut(), mut b: impl FnMut(), reps: usize) -> [(f64, f64); 2] {
    for _ in 0..3 {
        a();
        b();
    }
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..reps {
        for (k, f) in [&mut a as &mut dyn FnMut(), &mut b].into_iter().enumerate() {
            let s = Instant::now();
            f();
            times[k].push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        (t[reps / 2], t[0])
    })
}

/// Speed, packed vs padded: `cargo test -p mosaic-engine --profile ci --test packing --
/// --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn packing_is_faster() {
    // clip-tiny's text tower (width 32, 4 heads, 1 block, 16 tokens) on its skewed lengths.
    let mut pb = ParamBuilder::new(SplitMix64::new(1), &CPU);
    let dims = BlockDims {
        dim: 32,
        heads: 4,
        mlp: 64,
        layers: 1,
    };
    let t = TextTower::new(&mut pb, 64, 16, dims, true, Pool::Last).unwrap();
    let m = models::build("clip-tiny", 0, &CPU).unwrap();
    for batch in [64, 256] {
        let b = m.data.batch(0, batch, &CPU).unwrap();
        let lengths: Vec<u32> = b.tensors["text_len"].to_vec1().unwrap();
        let x = &b.tensors["text"];
        let rows = Packing::new(&lengths, 16).unwrap().rows().len();
        let run = |layout| {
            let out = t.run(x, Some(&lengths), layout).unwrap();
            out.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        };
        let [packed, padded] = ab_ms(|| run(TextLayout::Packed), || run(TextLayout::Padded), 61);
        let mean = lengths.iter().sum::<u32>() as f64 / batch as f64;
        println!(
            "text tower, batch {batch} (mean length {mean:.1} of 16): {rows} packed rows; \
             forward+backward median {:.3} ms packed vs {:.3} ms padded ({:.2}×), \
             min {:.3} vs {:.3} ({:.2}×)",
            packed.0,
            padded.0,
            padded.0 / packed.0,
            packed.1,
            padded.1,
            padded.1 / packed.1
        );
    }
    for batch in [16, 64] {
        let trainer = |layout| {
            let m = models::build_with("clip-tiny", 0, &CPU, layout).unwrap();
            let s = Schedule::sequential(&m, 1);
            let config = TrainConfig {
                batch,
                ..TrainConfig::default()
            };
            Trainer::new(m, s, config).unwrap()
        };
        let (mut p, mut q) = (trainer(TextLayout::Packed), trainer(TextLayout::Padded));
        let [packed, padded] = ab_ms(|| drop(p.step().unwrap()), || drop(q.step().unwrap()), 61);
        println!(
            "clip-tiny step, batch {batch}: median {:.3} ms packed vs {:.3} ms padded ({:.2}×), \
             min {:.3} vs {:.3} ({:.2}×)",
            packed.0,
            padded.0,
            padded.0 / packed.0,
            packed.1,
            padded.1,
            padded.1 / packed.1
        );
    }
}
