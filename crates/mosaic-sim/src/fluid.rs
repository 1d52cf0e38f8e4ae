//! The event-driven fluid execution of stages: the HBM, launch, all-reduce and stage rules of
//! the crate documentation's "ground-truth model", and the max-min fair sharing they use.

mod sharing;
mod stage;

use mosaic_zoo::{Calibration, ClusterSpec, ModelSpec};

use mosaic_plan::Assignment;

use crate::report::{GpuReport, Slice, TimelinePoint};
use crate::work::{hbm_bandwidth, Work};
use crate::SimOptions;
use stage::StageRun;

/// A stage: the plan's resolved modules, started together.
pub(crate) type StageSpec = [Assignment];

/// What happened to one module of a stage.
#[derive(Debug, Clone)]
pub(crate) struct ModuleOutcome {
    /// Its work (and the device model's estimate).
    pub work: Work,
    /// When its last replica finished computing, s.
    pub compute_end: f64,
    /// When its all-reduce finished (= `compute_end` without one), s.
    pub done: f64,
    /// The ring all-reduce alone on idle links, s.
    pub ring_alone: f64,
}

/// What happened in one stage.
#[derive(Debug, Clone)]
pub(crate) struct StageOutcome {
    /// Start, s.
    pub start: f64,
    /// End (the barrier), s.
    pub end: f64,
    /// Per placement, in plan order.
    pub modules: Vec<ModuleOutcome>,
}

/// A constant piece of the pool's activity: mean SM occupancy and compute utilisation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    /// Start, s.
    pub t0: f64,
    /// End, s.
    pub t1: f64,
    /// Mean SM occupancy of the pool's GPUs.
    pub occupancy: f64,
    /// Mean compute utilisation of the pool's GPUs.
    pub utilisation: f64,
}

/// The whole run.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub stages: Vec<StageOutcome>,
    /// Every slice, in stage order.
    pub slices: Vec<Slice>,
    /// Per GPU, SM-seconds with a kernel resident (quota × running time).
    pub busy: Vec<f64>,
    /// Per GPU, SM-seconds at the quota's full compute rate (quota × FLOPs / R(a)).
    pub compute: Vec<f64>,
    /// The pool's activity over time.
    pub steps: Vec<Step>,
    /// End of the last stage, s.
    pub end: f64,
}

/// What the stages run on: the device model, the model, the cluster, and the pool's shared
/// resources (HBM per GPU; NVLink per GPU at index `gpu`, InfiniBand per node at `gpus + node`).
struct Pool<'a> {
    cal: &'a Calibration,
    model: &'a ModelSpec,
    cluster: &'a ClusterSpec,
    /// GPUs in the pool.
    gpus: usize,
    /// GPUs per node.
    gpn: u32,
    /// HBM bandwidth of a GPU, bytes/s.
    hbm: f64,
    /// NVLink bus bandwidth of a GPU, bytes/s.
    nvlink_bus: f64,
    /// InfiniBand bandwidth of a NIC, bytes/s.
    ib_nic: f64,
    /// Capacity of every network resource, bytes/s.
    net_capacity: Vec<f64>,
    /// κ of the compute contention between replicas computing on one GPU
    /// ([`crate::SimOptions::compute_contention`]).
    compute_contention: f64,
}

impl Outcome {
    /// Averages the pool's activity steps over `bins` equal bins of `[0, end]`.
    pub(crate) fn timeline(&self, bins: usize) -> Vec<TimelinePoint> {
        let (steps, end) = (&self.steps, self.end);
        if end <= 0.0 || bins == 0 {
            return Vec::new();
        }
        let width = end / bins as f64;
        let mut out = Vec::with_capacity(bins);
        let mut k = 0;
        for b in 0..bins {
            let (lo, hi) = (b as f64 * width, (b + 1) as f64 * width);
            let (mut occ, mut util) = (0.0, 0.0);
            while k < steps.len() && steps[k].t1 <= lo {
                k += 1;
            }
            let mut j = k;
            while j < steps.len() && steps[j].t0 < hi {
                let overlap = steps[j].t1.min(hi) - steps[j].t0.max(lo);
                if overlap > 0.0 {
                    occ += steps[j].occupancy * overlap;
                    util += steps[j].utilisation * overlap;
                }
                j += 1;
            }
            out.push(TimelinePoint {
                start_ms: lo * 1e3,
                end_ms: hi * 1e3,
                utilisation: util / width,
                occupancy: occ / width,
            });
        }
        out
    }

    /// Per-GPU utilisation of the outcome.
    pub(crate) fn gpu_reports(&self, gpus_per_node: u32) -> Vec<GpuReport> {
        let out = self;
        let span = out.end.max(f64::MIN_POSITIVE);
        (0..out.busy.len())
            .map(|x| GpuReport {
                gpu: x as u32,
                node: x as u32 / gpus_per_node.max(1),
                utilisation: out.compute[x] / span,
                occupancy: out.busy[x] / span,
            })
            .collect()
    }
}

impl<'a> Pool<'a> {
    /// The first `pool` GPUs of `cluster`, with the device model and contention of `opts`.
    fn new(
        opts: &'a SimOptions,
        model: &'a ModelSpec,
        cluster: &'a ClusterSpec,
        pool: u32,
    ) -> Self {
        let cal = &opts.calibration;
        let g = pool as usize;
        let gpn = cluster.gpus_per_node.max(1);
        let nodes = pool.div_ceil(gpn) as usize;
        let nvlink_bus = cluster.nvlink_gbps / 2.0 * 1e9 * cal.link_efficiency;
        let ib_nic = cluster.ib_gbps * 1e9 * cal.link_efficiency;
        let mut net_capacity = vec![nvlink_bus; g];
        net_capacity.extend(vec![ib_nic * gpn as f64; nodes]);
        Pool {
            cal,
            model,
            cluster,
            gpus: g,
            gpn,
            hbm: hbm_bandwidth(cal, cluster),
            nvlink_bus,
            ib_nic,
            net_capacity,
            compute_contention: opts.compute_contention,
        }
    }

    /// The ring of `pl`'s all-reduce: its bandwidth cap (bytes/s), the network resources it
    /// crosses and its latency (s).
    fn ring(&self, pl: &Assignment) -> (f64, Vec<usize>, f64) {
        let mut per_node: Vec<(u32, u32)> = Vec::new();
        for &gpu in &pl.gpus {
            let node = gpu / self.gpn;
            match per_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, k)) => *k += 1,
                None => per_node.push((node, 1)),
            }
        }
        let mut uses: Vec<usize> = pl.gpus.iter().map(|&x| x as usize).collect();
        let hops = 2.0 * (pl.dp as f64 - 1.0);
        if per_node.len() > 1 {
            uses.extend(per_node.iter().map(|&(n, _)| self.gpus + n as usize));
            let sparsest = per_node.iter().map(|&(_, k)| k).min().unwrap_or(1) as f64;
            (
                self.nvlink_bus.min(self.ib_nic * sparsest),
                uses,
                hops * self.cal.ib_hop_us * 1e-6,
            )
        } else {
            (self.nvlink_bus, uses, hops * self.cal.nvlink_hop_us * 1e-6)
        }
    }
}

/// Runs `stages` one after another on the first `pool` GPUs of `cluster`, with the device
/// model and compute contention of `opts`.
pub(crate) fn run(
    opts: &SimOptions,
    model: &ModelSpec,
    cluster: &ClusterSpec,
    stages: &[Vec<Assignment>],
    pool: u32,
) -> Outcome {
    let pool = Pool::new(opts, model, cluster, pool);
    let mut out = Outcome {
        stages: Vec::new(),
        slices: Vec::new(),
        busy: vec![0.0; pool.gpus],
        compute: vec![0.0; pool.gpus],
        steps: Vec::new(),
        end: 0.0,
    };
    let mut t = 0.0;
    for (si, stage) in stages.iter().enumerate() {
        let mut run = StageRun::start(&pool, (si, stage), t, &mut out.slices);
        while run.pending() {
            t = run.advance(t, &mut out);
        }
        let outcome = run.finish();
        t = outcome.end;
        out.stages.push(outcome);
    }
    out.end = t;
    out
}

#[cfg(test)]
mod tests {
    use mosaic_zoo::{ClusterSpec, ModelSpec};

    use mosaic_plan::Assignment;

    use super::run;
    use crate::SimOptions;

    fn zoo(model: &str, cluster: &str) -> (ModelSpec, ClusterSpec) {
        (
            mosaic_zoo::model(model).unwrap(),
            mosaic_zoo::cluster(cluster).unwrap(),
        )
    }

    fn index(model: &ModelSpec, name: &str) -> usize {
        model.modules.iter().position(|m| m.name == name).unwrap()
    }

    const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

    /// The all-reduce time of `module` on `gpus` of `cluster`, alone or twice (two placements
    /// of it sharing the GPUs at half a quota each).
    fn allreduce_ms(cluster: &str, module: &str, gpus: &[u32], twice: bool) -> Vec<f64> {
        let (m, c) = zoo("ofasys", cluster);
        let i = index(&m, module);
        let p = Assignment {
            module: i,
            dp: gpus.len() as u32,
            sm: 0.5,
            gpus: gpus.to_vec(),
        };
        let placements = if twice { vec![p.clone(), p] } else { vec![p] };
        let out = run(&SimOptions::default(), &m, &c, &[placements], c.gpus());
        out.stages[0]
            .modules
            .iter()
            .map(|o| (o.done - o.compute_end) * 1e3)
            .collect()
    }

    #[test]
    fn allreduce_across_nodes_is_slower_than_inside_one() {
        let inside = allreduce_ms("h100x16", "llm", &[0, 1, 2, 3, 4, 5, 6, 7], false)[0];
        let across = allreduce_ms("h100x16", "llm", &[4, 5, 6, 7, 8, 9, 10, 11], false)[0];
        assert!(
            across > 1.5 * inside,
            "inside {inside} ms, across {across} ms"
        );
        // Two nodes of four GPUs: 4 NICs of 50 GB/s × 0.8 = 160 GB/s of bus bandwidth.
        let (m, _) = zoo("ofasys", "h100x16");
        let bytes = 2.0 * 7.0 / 8.0 * 2.0 * m.modules[index(&m, "llm")].params as f64;
        let want = (bytes / 160e9 + 14.0 * 15e-6) * 1e3;
        assert!((across - want).abs() < 1e-3 * want, "{across} vs {want}");
    }

    #[test]
    fn concurrent_allreduces_share_the_links() {
        let all16: Vec<u32> = (0..16).collect();
        let one = allreduce_ms("h100x16", "llm", &all16, false)[0];
        let two = allreduce_ms("h100x16", "llm", &all16, true);
        // Identical modules finish together and split the InfiniBand: about twice as long.
        for t in two {
            assert!(
                (t / one - 2.0).abs() < 0.05,
                "alone {one} ms, shared {t} ms"
            );
        }
        let one = allreduce_ms("h100x8", "llm", ALL8, false)[0];
        let two = allreduce_ms("h100x8", "llm", ALL8, true);
        for t in two {
            assert!(
                (t / one - 2.0).abs() < 0.05,
                "NVLink: alone {one} ms, shared {t} ms"
            );
        }
    }
}
