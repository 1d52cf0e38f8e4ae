//! What a step holds in host memory, estimated before step 1 ([`HostNeed`]), and the check of a
//! run's batch against this machine's memory and its other ranks' needs.

use candle_core::{Device, Tensor};

use crate::error::EngineError;
use crate::measure::{tape_bytes, tensor_bytes};
use crate::models::model::{Coupling, Input, Module, Output, Shard};
use crate::models::Model;
use crate::runtime::collective::Collective;
use crate::runtime::schedule::Schedule;

/// Samples of the forward passes [`HostNeed`] extrapolates from: three, so that a module whose
/// activations grow with the square of the batch is fitted exactly.
const PROBES: [usize; 3] = [1, 2, 4];

/// What one module's replicas on this rank hold of activations, as a function of the batch.
#[derive(Debug, Clone)]
struct ModuleNeed {
    name: &'static str,
    /// Its replicas on this rank.
    here: usize,
    /// Its data-parallel degree.
    dp: usize,
    /// Every replica sees the whole batch ([`Coupling::Gathered`]).
    gathered: bool,
    /// Bytes a replica holds at `n` samples: `c[0] + c[1]·n + c[2]·n²`.
    c: [f64; 3],
}

impl ModuleNeed {
    /// Bytes this module's replicas on this rank hold at `batch`.
    fn bytes(&self, batch: usize) -> f64 {
        let n = if self.gathered {
            batch
        } else {
            batch.div_ceil(self.dp.max(1))
        } as f64;
        let [c0, c1, c2] = self.c;
        self.here as f64 * (c0 + c1 * n + c2 * n * n).max(0.0)
    }
}

/// What a CPU run of a model by a schedule holds in host memory during a step, on one rank:
/// every module's parameters, gradients and AdamW moments, the step's batch (built whole on
/// every rank), and the activations this rank's replicas keep on their autograd tapes for the
/// backward pass (a frozen module's output only, when nothing back-propagates through it).
/// The activations are measured on forward passes at 4 samples — at 1, 2 and 4 for a module
/// whose replicas each see the whole batch (a contrastive loss's logits grow with its square),
/// fitted exactly by a quadratic — and extrapolated. A lower estimate of the peak: the
/// backward pass's own temporaries come on top.
#[derive(Debug, Clone)]
pub struct HostNeed {
    model: &'static str,
    /// Parameters, gradients and AdamW moments, bytes.
    weights: u64,
    /// Bytes of one sample of the batch.
    sample: f64,
    modules: Vec<ModuleNeed>,
}

/// [`HostNeed`] at one batch size, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostBytes {
    /// Parameters, gradients and AdamW moments.
    pub weights: f64,
    /// The step's batch.
    pub batch: f64,
    /// Activations kept for the backward pass.
    pub activations: f64,
    /// Of the activations, those of modules whose every replica sees the whole batch.
    pub gathered: f64,
}

impl HostBytes {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.weights + self.batch + self.activations
    }
}

impl HostNeed {
    /// Measures `model` by `schedule` as rank `rank` of `world` runs it (forward passes at
    /// most `PROBES`' largest samples, on the model's own data).
    pub fn measure(
        model: &Model,
        schedule: &Schedule,
        rank: usize,
        world: usize,
    ) -> Result<HostNeed, EngineError> {
        let ranks = schedule.ranks(model.modules.len(), world)?;
        let dps: Vec<usize> = (0..model.modules.len())
            .map(|m| schedule.placement(m).dp())
            .collect();
        let n = PROBES[PROBES.len() - 1];
        let data = (model.data)
            .batch(0, n, &Device::Cpu)
            .map_err(EngineError::tensor("data"))?;
        let sample = tensor_bytes(data.tensors.values()) as f64 / n as f64;
        let mut outputs: Vec<Option<Tensor>> = vec![None; model.modules.len()];
        let mut modules = Vec::with_capacity(model.modules.len());
        let mut weights = 0u64;
        for (i, m) in model.modules.iter().enumerate() {
            let here = ranks[i].iter().filter(|&&r| r == rank).count();
            let params = tensor_bytes(m.params.iter().map(|(_, v)| v.as_tensor()));
            // A value, and for a trained module its gradient (one per replica here) and AdamW's
            // two moments.
            weights += if m.trainable {
                params * (3 + here.max(1) as u64)
            } else {
                params
            };
            let wholes: Vec<Tensor> = (m.inputs.iter())
                .map(|input| match input {
                    Input::Data(key) => data.tensors[key].clone(),
                    Input::Module(p) => outputs[*p].clone().expect("producers come earlier"),
                })
                .collect();
            let gathered = m.coupling == Coupling::Gathered;
            let mut t = [0.0; 3];
            for (j, &k) in PROBES.iter().enumerate() {
                if !gathered && k != n {
                    continue;
                }
                let inputs = (wholes.iter())
                    .map(|w| w.narrow(0, 0, k))
                    .collect::<candle_core::Result<Vec<_>>>()
                    .map_err(EngineError::tensor(m.name))?;
                let (out, bytes) = probe(m, inputs, k).map_err(EngineError::tensor(m.name))?;
                t[j] = bytes as f64;
                if k == n && m.output == Output::Activation {
                    outputs[i] = Some(out.detach());
                }
            }
            let c = if gathered {
                // The quadratic through (1, t0), (2, t1), (4, t2).
                let (d1, d2) = (t[1] - t[0], (t[2] - t[1]) / 2.0);
                let c2 = (d2 - d1) / 3.0;
                let c1 = d1 - 3.0 * c2;
                [t[0] - c1 - c2, c1, c2]
            } else {
                [0.0, t[2] / n as f64, 0.0]
            };
            modules.push(ModuleNeed {
                name: m.name,
                here,
                dp: dps[i],
                gathered,
                c,
            });
        }
        Ok(HostNeed {
            model: model.name,
            weights,
            sample,
            modules,
        })
    }

    /// The estimate at `batch` samples a step.
    pub fn bytes(&self, batch: usize) -> HostBytes {
        let each = |gathered: bool| -> f64 {
            (self.modules.iter())
                .filter(|m| !gathered || m.gathered)
                .map(|m| m.bytes(batch))
                .sum()
        };
        HostBytes {
            weights: self.weights as f64,
            batch: self.sample * batch as f64,
            activations: each(false),
            gathered: each(true),
        }
    }

    /// The largest batch up to `batch` whose estimate is within `available` bytes (0: not
    /// even one sample).
    pub fn largest_fitting(&self, batch: usize, available: f64) -> usize {
        let (mut lo, mut hi) = (0, batch);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.bytes(mid).total() <= available {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Fails, naming `--batch`, the estimate and the largest batch that fits, when a step of
    /// `batch` samples needs more than `available` bytes (this machine's `MemAvailable`) with
    /// what the other ranks on this machine need at the same time (`neighbours`).
    pub fn check(
        &self,
        batch: usize,
        available: u64,
        neighbours: Neighbours,
    ) -> Result<(), EngineError> {
        let b = self.bytes(batch);
        let available = available as f64;
        if b.total() + neighbours.bytes <= available {
            return Ok(());
        }
        let gib = |x: f64| x / GIB;
        let gathered: Vec<&str> = (self.modules.iter())
            .filter(|m| m.gathered && m.here > 0)
            .map(|m| m.name)
            .collect();
        let square = if b.gathered >= 0.01 * b.total() && !gathered.is_empty() {
            format!(
                ", {:.1} GiB of them in {}, whose replicas each see the whole batch: they grow \
                 with its square",
                gib(b.gathered),
                gathered.join(", ")
            )
        } else {
            String::new()
        };
        let fit = match self.largest_fitting(batch, available) {
            _ if neighbours.ranks > 0 => "lower --batch, or start fewer ranks on this machine \
                                          (mpirun --map-by node spreads them)"
                .to_string(),
            0 => "not even one sample fits: train a smaller model".to_string(),
            n => format!("lower --batch: above about {n} samples a step cannot fit"),
        };
        let shared = if neighbours.ranks > 0 {
            let (ranks, need) = match neighbours.ranks {
                1 => ("the other rank on this machine".to_string(), "needs"),
                n => (format!("the {n} other ranks on this machine"), "need"),
            };
            format!(
                "; {ranks} {need} {:.1} GiB more at the same time",
                gib(neighbours.bytes)
            )
        } else {
            String::new()
        };
        Err(EngineError::BadSetting {
            setting: "--batch".into(),
            message: format!(
                "a step of {batch} samples of {} needs about {:.1} GiB of host memory \
                 (parameters, gradients and AdamW moments {:.1} GiB, the batch {:.1} GiB, \
                 activations kept for the backward pass {:.1} GiB{square}){shared}, and this \
                 machine has {:.1} GiB available (MemAvailable in /proc/meminfo); {fit}",
                self.model,
                gib(b.total()),
                gib(b.weights),
                gib(b.batch),
                gib(b.activations),
                gib(available)
            ),
        })
    }
}

/// One forward pass of module `m`'s replica over the first `k` samples of `inputs` (the
/// whole-batch ones): its output and the bytes it keeps for the backward pass.
fn probe(m: &Module, inputs: Vec<Tensor>, k: usize) -> candle_core::Result<(Tensor, u64)> {
    let shard = Shard {
        index: 0,
        count: 1,
        rows: 0..k,
        batch: k,
    };
    let (xs, _vars) = m.replica_inputs(inputs, &shard)?;
    let out = m.net.forward(&xs, &shard)?;
    let bytes = if m.back_propagates() {
        tape_bytes(&out, &m.params)
    } else {
        tensor_bytes([&out])
    };
    Ok((out, bytes))
}

/// This machine's available memory (`MemAvailable` of `/proc/meminfo`), in bytes; `None`
/// where there is no such file or line.
pub fn available_host_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// What the other ranks on this rank's machine need of its host memory during a step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Neighbours {
    /// How many other ranks run on this machine.
    pub ranks: usize,
    /// What they need together, bytes.
    pub bytes: f64,
}

impl Neighbours {
    /// The neighbours of rank `rank`, from every rank's `[host key high, host key low, need in
    /// GiB]` (NaN: a rank that could not estimate its need, and fails by itself).
    fn of(rows: &[Vec<f32>], rank: usize) -> Neighbours {
        let mine = rows.get(rank).and_then(|r| r.get(..2));
        let mut n = Neighbours::default();
        for (r, row) in rows.iter().enumerate() {
            if r == rank || row.get(..2) != mine {
                continue;
            }
            n.ranks += 1;
            if let Some(&gib) = row.get(2).filter(|g| g.is_finite()) {
                n.bytes += f64::from(gib) * GIB;
            }
        }
        n
    }
}

/// Bytes in a GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// This machine's name as two 16-bit halves of its FNV-1a hash, each exact in an f32, so that
/// ranks can tell which of them share a machine through an f32 gather.
fn host_key() -> [f32; 2] {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hash = (name.trim().bytes()).fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    [(hash >> 16) as f32, (hash & 0xffff) as f32]
}

/// Refuses (naming `--batch`) a CPU step of `batch` samples of `model` by `schedule`, as this
/// rank of `collective` runs it, that needs more host memory than this machine has available
/// once the other ranks on it have theirs (every rank measures its own need, and the ranks
/// gather them: a collective call every rank makes); measures nothing for a batch of at most 4
/// samples, and checks nothing where the available memory is unknown.
pub fn check_host_memory(
    model: &Model,
    schedule: &Schedule,
    batch: usize,
    collective: &dyn Collective,
) -> Result<(), EngineError> {
    if batch <= PROBES[PROBES.len() - 1] {
        return Ok(());
    }
    let (rank, world) = (collective.rank(), collective.world());
    let available = available_host_bytes();
    if world == 1 && available.is_none() {
        return Ok(());
    }
    let need = HostNeed::measure(model, schedule, rank, world);
    let neighbours = if world > 1 {
        // Every rank gathers, even one whose estimate failed, so that none waits for it.
        let own = need.as_ref().map_or(f64::NAN, |n| n.bytes(batch).total());
        let [high, low] = host_key();
        let rows = collective.all_gather(&[high, low, (own / GIB) as f32])?;
        Neighbours::of(&rows, rank)
    } else {
        Neighbours::default()
    };
    let need = need?;
    match available {
        Some(available) => need.check(batch, available, neighbours),
        None => Ok(()),
    }
}

/// [`check_host_memory`] of every module of `model` at dp 1 in one process on `cores` cores:
/// the most a profile sweep or a colocation holds (a replica at dp 1 steps on the whole batch,
/// and a colocation may run every module at once), checked before the batch is drawn.
pub(crate) fn check_sweep_memory(
    model: &Model,
    batch: usize,
    cores: usize,
) -> Result<(), EngineError> {
    let plan = crate::sequential_plan(model, 1);
    let every = std::path::Path::new("(every module at dp 1)");
    let schedule = Schedule::from_plan(&plan, every, model, batch, cores)?;
    check_host_memory(model, &schedule, batch, &crate::InProcess)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_estimate_extrapolates_a_contrastive_loss_exactly_and_names_the_batch() {
        let model = crate::models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        let schedule = Schedule::sequential(&model, 1);
        let need = HostNeed::measure(&model, &schedule, 0, 1).unwrap();
        // align's tape at 8 and 32 samples, measured, is the quadratic fitted at 1, 2 and 4.
        let align = model.index_of("align").unwrap();
        let data = model.data.batch(0, 32, &Device::Cpu).unwrap();
        let features: Vec<Tensor> = model.modules[..align]
            .iter()
            .map(|m| {
                let xs: Vec<Tensor> = (m.inputs.iter())
                    .map(|i| match i {
                        Input::Data(k) => data.tensors[k].clone(),
                        Input::Module(_) => unreachable!("the towers read data"),
                    })
                    .collect();
                probe(m, xs, 32).unwrap().0.detach()
            })
            .collect();
        for k in [8, 32] {
            let xs = features
                .iter()
                .map(|f| f.narrow(0, 0, k).unwrap())
                .collect();
            let measured = probe(&model.modules[align], xs, k).unwrap().1 as f64;
            let fitted = need.modules[align].bytes(k);
            assert!(
                (fitted - measured).abs() < 1.0,
                "{k}: {fitted} vs {measured}"
            );
        }
        // At the largest batch the logits take tens of GiB: far more than the towers.
        let b = need.bytes(65_536);
        let gib = (1u64 << 30) as f64;
        assert!(
            b.total() > 32.0 * gib && b.gathered > 0.9 * b.activations,
            "{b:?}"
        );
        assert!(need.bytes(16).total() < 0.01 * gib, "{:?}", need.bytes(16));
        // Refused naming --batch, the estimate, align and the largest batch that fits.
        let available = 4u64 << 30;
        let alone = Neighbours::default();
        need.check(16, available, alone).unwrap();
        let e = need.check(65_536, available, alone).unwrap_err();
        assert!(e.is_bad_input());
        let text = e.to_string();
        assert!(
            text.starts_with("--batch: a step of 65536 samples of clip-tiny needs"),
            "{text}"
        );
        assert!(
            text.contains("in align, whose replicas each see the whole batch"),
            "{text}"
        );
        let n = need.largest_fitting(65_536, available as f64);
        assert!(text.contains(&format!("above about {n} samples")), "{text}");
        assert!(need.bytes(n).total() <= available as f64);
        assert!(need.bytes(n + 1).total() > available as f64);
        assert!((1_000..65_536).contains(&n), "{n}");
        let e = need.check(65_536, 1, alone).unwrap_err().to_string();
        assert!(e.contains("not even one sample fits"), "{e}");
        // What fits alone does not beside three ranks that need nearly all of it.
        let own = need.bytes(n).total();
        let crowd = Neighbours {
            ranks: 3,
            bytes: available as f64 - own / 2.0,
        };
        let e = need.check(n, available, crowd).unwrap_err().to_string();
        assert!(e.contains("the 3 other ranks on this machine need"), "{e}");
        assert!(e.contains("start fewer ranks on this machine"), "{e}");
    }

    /// A rank's neighbours are the other ranks whose host key is its own; a rank whose
    /// estimate failed (NaN) counts, with nothing of its need.
    #[test]
    fn neighbours_are_the_ranks_on_the_same_machine() {
        let rows = vec![
            vec![1.0, 2.0, 1.5],
            vec![1.0, 2.0, 2.5],
            vec![3.0, 2.0, 8.0],
            vec![1.0, 2.0, f32::NAN],
        ];
        let n = Neighbours::of(&rows, 0);
        assert_eq!(n.ranks, 2);
        assert_eq!(n.bytes, 2.5 * GIB);
        assert_eq!(Neighbours::of(&rows, 2), Neighbours::default());
        let key = host_key();
        assert!(key
            .iter()
            .all(|k| k.fract() == 0.0 && (0.0..65_536.0).contains(k)));
        assert_eq!(key, host_key());
    }

    #[test]
    fn the_host_estimate_counts_only_this_rank_s_replicas() {
        let model = crate::models::build("omni-tiny", 0, &Device::Cpu).unwrap();
        let plan = crate::sequential_plan(&model, 2);
        let schedule = Schedule::from_plan(&plan, std::path::Path::new("p"), &model, 8, 1).unwrap();
        let one = HostNeed::measure(&model, &schedule, 0, 1)
            .unwrap()
            .bytes(1024);
        let half = HostNeed::measure(&model, &schedule, 1, 2)
            .unwrap()
            .bytes(1024);
        // Two replicas in one process hold what one of two ranks holds, twice over.
        assert!(one.activations > 0.0);
        assert!((one.activations - 2.0 * half.activations).abs() < 1e-6 * one.activations);
        assert!(one.weights > half.weights && one.batch == half.batch);
    }
}
