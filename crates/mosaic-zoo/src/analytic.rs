//! The analytical device model: a module's iteration time, memory and utilisation on `dp` GPUs
//! with SM quota `sm` each (`docs/design.md`, "The analytical device model"), and the profile
//! file it produces on the paper's grid.
//!
//! Per GPU and iteration, with micro-batch `b = ⌈B / dp⌉` samples:
//! - **matmuls and attention** run at `sm^γ × peak × efficiency`, or at the HBM bandwidth their
//!   operands need if that is slower (roofline); γ < 1 is the measured sublinear scaling in
//!   SMs, and the efficiency falls for narrow layers and for few rows per GPU (small batches);
//! - **memory-bound kernels** (norms, residuals, activation functions, gathers, logits, the
//!   gradient buffer and the AdamW step) run at `BW(sm) = BW_peak × hbm_efficiency ×
//!   min(1, sm / bw_saturation)`: a fraction of the SMs already saturates HBM, so modules made
//!   of such kernels stop scaling early — the fact Mosaic exploits;
//! - kernels run one after another, so the two times add up to the GPU time `G`;
//! - the host launches them: eager PyTorch launches every kernel from the host, so the launch
//!   time `L` is the step's kernel count (counted from the module's structure in `kernels.rs`)
//!   × a host cost per launch, plus a per-step cost — it shrinks with neither the SMs nor the
//!   batch, and small modules (and large ones at small per-GPU batches) sit on it;
//! - host and GPU overlap, but not perfectly: the step takes `(G^p + L^p)^(1/p)`, a smooth
//!   maximum ([`Calibration::overlap_exponent`]) — where `G ≈ L` the launch queue drains and
//!   fills within the step, which then takes longer than either;
//! - trainable modules then reduce gradients by a ring (`2(d−1)/d × bytes / bus bandwidth`,
//!   NVLink inside a node, the nodes' InfiniBand NICs across), half of it hidden behind the
//!   backward pass.
//!
//! Training is 3 × the forward FLOPs (forward, activation and weight gradients); frozen modules
//! fed by data run forward only. Trainable modules keep bf16 weights and gradients and an
//! fp32 AdamW state (master weights, m, v: 12 bytes per parameter) sharded over the `dp`
//! replicas (ZeRO-1 / Megatron's distributed optimizer — without it Qwen3-VL's 8B LLM could
//! not train on 80 GB GPUs at all). A module whose activations do not fit recomputes its
//! layers (one more forward pass, only layer inputs kept).
//!
//! The constants are [`Calibration`]'s: the seven that `mosaic calibrate` fits (γ, efficiency,
//! small-batch rows, HBM saturation, host cost per launch and per step, the overlap exponent)
//! default to the fit to the H100 measurements of CLIP in `examples/h100-clip-profile.json`.

use mosaic_profile::{Interference, ModuleProfile, Nodes, ProfileFile, Sample, FORMAT};
use serde::{Deserialize, Serialize};

use crate::device::{ClusterSpec, DeviceSpec};
use crate::kernels::{kernels, Backward};
use crate::spec::{ModelSpec, ModuleSpec};
use crate::workload::{Workload, BF16};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The device model's constants. Datasheet numbers live in [`crate::DeviceSpec`] and
/// [`ClusterSpec`]; the seven constants marked *fitted* are the least-squares fit (on log time) of
/// this model to `examples/h100-clip-profile.json` (CLIP ViT-L/14 measured on one H100, see
/// `docs/reference.md`, "Measured on a real H100"), by `mosaic calibrate --profiles
/// examples/h100-clip-profile.json --model clip --device h100` ([`crate::FreeConstant`] lists them; a
/// test re-fits the file and checks that the defaults are its fit). The others are assumptions,
/// stated with their reasoning: the CLIP profile (one GPU, no all-reduce, profiled alone) says
/// nothing about them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fraction of peak FLOP/s that matmuls and attention of a very wide layer with many rows
    /// reach on the whole GPU. *Fitted* (the prior assumption was 0.72, so that a 4096-wide LLM
    /// lands near Megatron-LM's ~50 % model FLOP utilisation, Narayanan et al., SC'21).
    pub gemm_efficiency: f64,
    /// Hidden size at which matmul efficiency halves (efficiency × h / (h + this)): narrower
    /// layers run shorter, less efficient kernels. Assumption (CLIP's 768 and 1024 cannot
    /// separate it from `gemm_efficiency`).
    pub hidden_half: f64,
    /// Matmul rows (tokens per GPU) at which efficiency halves (efficiency × rows / (rows +
    /// this)): small per-GPU batches cannot fill the GPU. *Fitted* (the per-GPU batches 16 to 2
    /// of the CLIP profile).
    pub rows_half: f64,
    /// Exponent γ of matmul throughput in the SM quota: rate = a^γ × peak × efficiency. *Fitted*.
    /// γ < 1 is the measured sublinear scaling (CLIP vision: 5.7× slower on 16 of 132 SMs, not
    /// 8.25×): a partition's SMs each get a larger share of L2, HBM and the clock budget, and a
    /// whole GPU loses more to the last partial wave of thread blocks.
    pub sm_exponent: f64,
    /// SM fraction that saturates HBM bandwidth (`a_sat`): `BW(a) = BW × min(1, a / a_sat)`.
    /// *Fitted*.
    pub bw_saturation: f64,
    /// Fraction of peak HBM bandwidth that streaming kernels reach. Assumption.
    pub hbm_efficiency: f64,
    /// Fraction of the link bandwidth NCCL's ring all-reduce reaches (bus bandwidth).
    /// Assumption.
    pub link_efficiency: f64,
    /// Latency of one ring step over NVLink, in µs. Assumption.
    pub nvlink_hop_us: f64,
    /// Latency of one ring step over InfiniBand, in µs. Assumption.
    pub ib_hop_us: f64,
    /// Fraction of the gradient reduction hidden behind the backward pass: the reduce-scatter
    /// half overlaps in buckets, the all-gather of updated weights does not. Assumption.
    pub comm_overlap: f64,
    /// Host time per training step outside the layers' kernels (loss, the fused optimizer's
    /// launches, stream switches), ms; half of it for a frozen module. *Fitted* (CLIP's `align`
    /// head: ~3 ms at every quota and batch).
    pub launch_step_ms: f64,
    /// Host time to launch one kernel in eager PyTorch with autocast, µs: the launch floor is
    /// this × the step's kernel count (`kernels.rs`), whatever the SMs and the batch. *Fitted*
    /// (CLIP vision and text at per-GPU batch 2 are flat above half the GPU).
    pub launch_us: f64,
    /// Exponent `p` ≥ 1 of how the host's launch time `L` and the GPU time `G` overlap: the step
    /// takes `(G^p + L^p)^(1/p)`, their maximum as p → ∞ (perfect overlap), their sum at p = 1
    /// (none). *Fitted* (with the plain maximum, the fit to CLIP left 0.066 rms log error and
    /// predicted a held-out module within 14.9 % at dp 1; this smooth maximum does better on
    /// both, and on ImageBind measured on an H200: README, "Calibrating the device model").
    pub overlap_exponent: f64,
    /// Memory per module outside weights, state and activations (cuBLAS workspace, allocator
    /// slack), GiB. Assumption.
    pub workspace_gib: f64,
    /// Interference coefficients of Eq. 8 (relative slowdown), assumed until `mosaic fit`
    /// measures them: a small constant cost of sharing a GPU (e1), a small linear term in the
    /// summed bandwidth utilisation (e2), and a large product term (e3) so that two
    /// bandwidth-heavy modules slow each other down noticeably (two at B = 0.8: +48%) while two
    /// compute-bound ones barely do (two at B = 0.2: +6%).
    pub interference: Interference,
}

impl Default for Calibration {
    /// The fit to `examples/h100-clip-profile.json` (`mosaic calibrate --profiles
    /// examples/h100-clip-profile.json --model clip --device h100`) for the fitted constants,
    /// the stated assumptions for the others.
    fn default() -> Self {
        Calibration {
            gemm_efficiency: FITTED[0],
            hidden_half: 450.0,
            rows_half: FITTED[1],
            sm_exponent: FITTED[2],
            bw_saturation: FITTED[3],
            hbm_efficiency: 0.85,
            link_efficiency: 0.8,
            nvlink_hop_us: 6.0,
            ib_hop_us: 15.0,
            comm_overlap: 0.5,
            launch_step_ms: FITTED[4],
            launch_us: FITTED[5],
            overlap_exponent: FITTED[6],
            workspace_gib: 0.5,
            interference: Interference {
                e1: 0.02,
                e2: 0.05,
                e3: 0.6,
            },
        }
    }
}

impl Calibration {
    /// The constants as they were assumed before calibration: matmuls at 72 % of peak,
    /// linear in the SM quota (γ = 1), HBM saturated by half the SMs, 2 ms per step and 12 µs
    /// per kernel launch (the earlier floor of 0.6 ms per layer over its ~50 kernels). What
    /// `mosaic calibrate` compares its fit against.
    pub fn assumed() -> Calibration {
        Calibration {
            gemm_efficiency: 0.72,
            rows_half: 128.0,
            sm_exponent: 1.0,
            bw_saturation: 0.5,
            launch_step_ms: 2.0,
            launch_us: 12.0,
            overlap_exponent: 64.0,
            ..Calibration::default()
        }
    }
}

/// The fitted constants of [`Calibration::default`], in [`crate::FreeConstant::ALL`]'s order: the
/// least-squares fit on log time to `examples/h100-clip-profile.json` by `mosaic calibrate
/// --profiles examples/h100-clip-profile.json --model clip --device h100`.
const FITTED: [f64; 7] = [0.5542, 844.4, 0.8152, 0.4848, 1.344, 38.17, 4.360];

/// One module's predicted iteration on `dp` GPUs at SM quota `sm`, with its breakdown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Module name.
    pub module: String,
    /// Data-parallel degree.
    pub dp: u32,
    /// SM quota per GPU.
    pub sm: f64,
    /// Samples per GPU: ⌈global batch / dp⌉.
    pub micro_batch: u32,
    /// Whether the layers are recomputed to fit the activations.
    pub recompute: bool,
    /// FLOPs per GPU per iteration.
    pub flops: f64,
    /// HBM bytes per GPU per iteration.
    pub hbm_bytes: f64,
    /// Time of matmuls and attention, ms.
    pub gemm_ms: f64,
    /// Time of memory-bound kernels and the optimizer, ms.
    pub memory_ms: f64,
    /// Host launch time, ms.
    pub launch_ms: f64,
    /// Exposed gradient-reduction time, ms.
    pub comm_ms: f64,
    /// Iteration time: `(G^p + L^p)^(1/p)` of the GPU time `G` = gemm + memory and the launch
    /// time `L` ([`Calibration::overlap_exponent`]), plus comm, ms.
    pub time_ms: f64,
    /// Memory per GPU, GiB.
    pub mem_gib: f64,
    /// Achieved FLOP/s over the quota's peak, in [0, 1].
    pub sm_util: f64,
    /// Achieved HBM bandwidth over the GPU's peak, in [0, 1].
    pub bw_util: f64,
}

impl Estimate {
    /// The profile sample of this estimate.
    pub fn sample(&self) -> Sample {
        Sample {
            dp: self.dp,
            sm: self.sm,
            time_ms: self.time_ms,
            mem_gib: self.mem_gib,
            sm_util: self.sm_util,
            bw_util: self.bw_util,
        }
    }
}

/// One module's iteration on one of its GPUs: what its time terms share.
struct Iteration<'a> {
    w: Workload,
    trainable: bool,
    /// Hidden size.
    h: f64,
    /// Samples per GPU.
    bf: f64,
    dp: u32,
    sm: f64,
    /// Passes over the forward FLOPs (see [`passes`]).
    passes: f64,
    keeps_activations: bool,
    /// Kernel launches of the step (see `kernels.rs`).
    kernels: f64,
    dev: &'a DeviceSpec,
    /// HBM bandwidth at the quota, bytes/s.
    bw: f64,
}

/// Whether a frozen `spec` is fed by a trainable module of `model`.
fn fed_by_trainable(model: &ModelSpec, spec: &ModuleSpec) -> bool {
    spec.after
        .iter()
        .any(|p| model.module(p).is_some_and(|parent| parent.trainable))
}

/// Passes over the forward FLOPs: forward, then activation and weight gradients as needed,
/// plus one forward more when recomputing.
fn passes(trainable: bool, input_grad: bool, recompute: bool) -> f64 {
    // Forward = 1, activation gradients = 1, weight gradients = 1 (× forward FLOPs).
    (if trainable {
        3.0
    } else if input_grad {
        2.0
    } else {
        1.0
    }) + if recompute { 1.0 } else { 0.0 }
}

impl Calibration {
    /// Predicts module `module` (an index into `model.modules`) of `model` on `dp` GPUs of
    /// `cluster` with SM quota `sm`, at the paper's batch for the cluster.
    ///
    /// # Panics
    /// If `module` is out of range, `dp` is 0 or `sm` is not in (0, 1].
    pub fn estimate(
        &self,
        model: &ModelSpec,
        module: usize,
        cluster: &ClusterSpec,
        dp: u32,
        sm: f64,
    ) -> Estimate {
        assert!(dp >= 1, "dp must be at least 1");
        assert!(sm > 0.0 && sm <= 1.0, "sm must be in (0, 1]");
        let spec = &model.modules[module];
        let w = Workload::of(spec);
        let b = model.batch_on(cluster).div_ceil(dp);
        // A frozen module still propagates gradients when a trainable module feeds it.
        let input_grad = !spec.trainable && fed_by_trainable(model, spec);
        let keeps_activations = spec.trainable || input_grad;
        let backward = match (spec.trainable, input_grad) {
            (true, _) => Backward::Full,
            (false, true) => Backward::InputOnly,
            (false, false) => Backward::None,
        };
        let capacity = cluster.device.memory_gib;
        let (recompute, mem_gib) = self.fit_memory(&w, spec, keeps_activations, b, dp, capacity);

        let it = Iteration {
            w,
            trainable: spec.trainable,
            h: spec.hidden as f64,
            bf: b as f64,
            dp,
            sm,
            passes: passes(spec.trainable, input_grad, recompute),
            keeps_activations,
            kernels: kernels(spec, backward, recompute),
            dev: &cluster.device,
            bw: self.bandwidth(&cluster.device, sm),
        };
        let (flops, gemm_bytes, gemm_s) = self.gemm_time(&it);
        let (memory_bytes, memory_s) = self.memory_time(&it);
        let launch_s = self.launch_time(&it);
        let compute_s = self.overlap(gemm_s + memory_s, launch_s);
        let comm_s = if it.trainable && dp > 1 {
            self.exposed_reduction(&it, cluster, compute_s)
        } else {
            0.0
        };

        let time_s = compute_s + comm_s;
        let hbm_bytes = gemm_bytes + memory_bytes;
        let dev = it.dev;
        Estimate {
            module: spec.name.clone(),
            dp,
            sm,
            micro_batch: b,
            recompute,
            flops,
            hbm_bytes,
            gemm_ms: gemm_s * 1e3,
            memory_ms: memory_s * 1e3,
            launch_ms: launch_s * 1e3,
            comm_ms: comm_s * 1e3,
            time_ms: time_s * 1e3,
            mem_gib,
            sm_util: (flops / time_s / (sm * dev.peak_tflops * 1e12)).clamp(0.0, 1.0),
            bw_util: (hbm_bytes / time_s / (dev.hbm_tbps * 1e12)).clamp(0.0, 1.0),
        }
    }

    /// Whether the module must recompute its layers to fit `capacity`, and its memory then.
    fn fit_memory(
        &self,
        w: &Workload,
        spec: &ModuleSpec,
        keeps_activations: bool,
        b: u32,
        dp: u32,
        capacity: f64,
    ) -> (bool, f64) {
        let plain = self.memory(w, spec.trainable, keeps_activations, false, b, dp);
        let recompute = keeps_activations && plain > capacity;
        let mem_gib = if recompute {
            self.memory(w, spec.trainable, true, true, b, dp)
        } else {
            plain
        };
        (recompute, mem_gib)
    }

    /// HBM bandwidth of memory-bound kernels at SM quota `sm`, bytes/s.
    fn bandwidth(&self, dev: &DeviceSpec, sm: f64) -> f64 {
        dev.hbm_tbps * 1e12 * self.hbm_efficiency * (sm / self.bw_saturation).min(1.0)
    }

    /// Matmuls and attention by the roofline: (FLOPs, HBM bytes, seconds).
    fn gemm_time(&self, it: &Iteration) -> (f64, f64, f64) {
        let (w, bf, h, passes) = (&it.w, it.bf, it.h, it.passes);
        let flops = bf * w.fwd_flops * passes;
        let rows = bf * w.rows;
        let efficiency =
            self.gemm_efficiency * h / (h + self.hidden_half) * rows / (rows + self.rows_half);
        let rate = it.sm.powf(self.sm_exponent) * it.dev.peak_tflops * 1e12 * efficiency;
        let weight_reads = if passes > 1.0 { 2.0 } else { 1.0 };
        let gemm_bytes = BF16 * w.matmul_weights * weight_reads + bf * w.fwd_gemm_bytes * passes;
        let gemm_s = if flops > 0.0 {
            (flops / rate).max(gemm_bytes / it.bw)
        } else {
            gemm_bytes / it.bw
        };
        (flops, gemm_bytes, gemm_s)
    }

    /// Memory-bound kernels, logits, gradient buffer and optimizer: (HBM bytes, seconds).
    fn memory_time(&self, it: &Iteration) -> (f64, f64) {
        let (w, bf) = (&it.w, it.bf);
        // Logits: written in bf16, read and upcast to fp32 for the loss, gradient written back.
        let logit_bytes = if it.keeps_activations { 12.0 } else { 2.0 };
        let (grad_bytes, optimizer_bytes) = if it.trainable {
            // Gradient buffer written and read (reduction, clipping); AdamW on this replica's
            // shard: read fp32 master, m, v and the bf16 gradient, write them and the bf16
            // weight (28 bytes per parameter).
            (2.0 * BF16 * w.params, 28.0 * w.params / it.dp as f64)
        } else {
            (0.0, 0.0)
        };
        let memory_bytes = bf * w.fwd_elem_bytes * it.passes
            + bf * w.logits * logit_bytes
            + grad_bytes
            + optimizer_bytes;
        (memory_bytes, memory_bytes / it.bw)
    }

    /// A step's time from its GPU time `gpu` and host launch time `launch`: their smooth maximum
    /// `(gpu^p + launch^p)^(1/p)`, computed as `m (1 + (n/m)^p)^(1/p)` (m the larger, n the
    /// smaller) so that no power underflows.
    pub fn overlap(&self, gpu: f64, launch: f64) -> f64 {
        let (m, n) = (gpu.max(launch), gpu.min(launch));
        if m <= 0.0 {
            return 0.0;
        }
        let p = self.overlap_exponent;
        m * (1.0 + (n / m).powf(p)).powf(1.0 / p)
    }

    /// Host launch time of the step: its kernels one by one, and the per-step work (loss,
    /// optimizer), seconds. Neither shrinks with the SMs or the batch.
    fn launch_time(&self, it: &Iteration) -> f64 {
        self.launch_step_ms * 1e-3 * if it.trainable { 1.0 } else { 0.5 }
            + self.launch_us * 1e-6 * it.kernels
    }

    /// The ring all-reduce of the gradients not hidden behind the backward pass of a step
    /// computing for `compute_s`, seconds.
    ///
    /// The ring is the *packed* placement a profile's samples assume (its `nodes`, see
    /// [`Calibration::profile`]): `dp` ≤ GPUs per node inside one node, over NVLink; a larger
    /// `dp` on whole nodes (the profiled dps are powers of two, so multiples of the 8 GPUs of
    /// a node), each node's GPUs driving its NICs, one ring per NIC. A placement that splits a
    /// module across more nodes than that is charged by the planner (`mosaic_plan::nodes`).
    fn exposed_reduction(&self, it: &Iteration, cluster: &ClusterSpec, compute_s: f64) -> f64 {
        let d = it.dp as f64;
        // NVLink's datasheet figure counts both directions; a ring uses one.
        let nvlink = cluster.nvlink_gbps / 2.0;
        let (bus, hop) = if it.dp <= cluster.gpus_per_node {
            (nvlink, self.nvlink_hop_us)
        } else {
            // Across nodes NCCL runs one ring per NIC, each crossing the node boundary
            // through its own NIC, so a node's GPUs share its aggregate InfiniBand
            // bandwidth (8 × 50 GB/s on the paper's nodes); NVLink still carries the
            // intra-node hops.
            let ib = cluster.ib_gbps * cluster.gpus_per_node as f64;
            (ib.min(nvlink), self.ib_hop_us)
        };
        let ring = 2.0 * (d - 1.0) / d * BF16 * it.w.params / (bus * 1e9 * self.link_efficiency)
            + 2.0 * (d - 1.0) * hop * 1e-6;
        // The backward share of the step (launch-bound or not) hides part of the reduction;
        // a faster step hides less, but never more than it saves.
        let backward_s = compute_s * (it.passes - 1.0) / it.passes;
        ring - self.comm_overlap * ring.min(backward_s)
    }

    /// Memory per GPU in GiB for `b` samples per GPU.
    fn memory(
        &self,
        w: &Workload,
        trainable: bool,
        keeps_activations: bool,
        recompute: bool,
        b: u32,
        dp: u32,
    ) -> f64 {
        let bf = b as f64;
        let weights = BF16 * w.resident_weights;
        let state = if trainable {
            // bf16 gradients + fp32 master, m, v sharded over the replicas.
            BF16 * w.params + 12.0 * w.params / dp as f64
        } else {
            0.0
        };
        let activations = match (keeps_activations, recompute) {
            (true, false) => bf * w.stored_bytes,
            (true, true) => bf * (w.checkpoint_bytes + w.layer_bytes),
            // Forward only: about two layers' activations alive at a time.
            (false, _) => bf * 2.0 * w.layer_bytes,
        };
        // Logits in bf16 plus their fp32 copy for the loss.
        let logits = bf * w.logits * 6.0;
        (weights + state + activations + logits) / GIB + self.workspace_gib
    }

    /// The profile of every module of `model` on `cluster`: `dp` at powers of two up to the
    /// cluster's GPUs and the global batch (§3.3), `sm` at every quota the device's SM
    /// partitions grant ([`crate::DeviceSpec::quota_grid`]: on an H100 8, 16, …, 128 and all 132
    /// SMs), so that a plan asks only for what the hardware gives.
    ///
    /// The file's `nodes` are the cluster's ([`Self::nodes`]) and each module's `grad_gib` the
    /// bf16 gradient of its parameters that [`Self::estimate`] all-reduces (0 for a frozen
    /// module): the samples assume the packed placement of `exposed_reduction`, and the
    /// planner charges a placement that spans more nodes from these.
    pub fn profile(&self, model: &ModelSpec, cluster: &ClusterSpec) -> ProfileFile {
        let batch = model.batch_on(cluster);
        let dps = profiled_dps(model, cluster);
        let quotas = cluster.device.quota_grid();
        let modules = model
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| ModuleProfile {
                name: m.name.clone(),
                after: m.after.clone(),
                samples: dps
                    .iter()
                    .flat_map(|&dp| {
                        (quotas.iter()).map(move |&sm| self.estimate(model, i, cluster, dp, sm))
                    })
                    .map(|e| e.sample())
                    .collect(),
                grad_gib: Some(grad_gib(m)),
            })
            .collect();
        ProfileFile {
            format: FORMAT.to_string(),
            device: cluster.device.profile_device(),
            nodes: Some(self.nodes(cluster)),
            modules,
            interference: self.interference,
            source: Some(format!(
                "mosaic-zoo analytical device model: {} on {} ({} × {}, {} node(s)), global batch \
                 {batch}; interference coefficients assumed",
                model.name,
                cluster.name,
                cluster.gpus(),
                cluster.device.name,
                cluster.nodes
            )),
        }
    }
}

impl Calibration {
    /// The profile file's `nodes` of `cluster`: its GPUs per node, and the bus bandwidths the
    /// ring all-reduce of [`Self::estimate`] reaches per GPU — NVLink one way (the datasheet's
    /// figure counts both directions, `DeviceSpec::nvlink_gbps`) and one GPU's InfiniBand NIC
    /// one way (`ClusterSpec::ib_gbps`: 400 Gb/s NDR = 50 GB/s on H100 nodes), each at
    /// [`Self::link_efficiency`]. On an H100 node: 900 / 2 × 0.8 = 360 and 50 × 0.8 = 40 GB/s.
    pub fn nodes(&self, cluster: &ClusterSpec) -> Nodes {
        Nodes {
            gpus_per_node: cluster.gpus_per_node,
            intra_gbps: cluster.nvlink_gbps / 2.0 * self.link_efficiency,
            inter_gbps: cluster.ib_gbps * self.link_efficiency,
        }
    }
}

/// The data-parallel degrees [`Calibration::profile`] profiles `model` at on `cluster`: powers
/// of two up to the cluster's GPUs and the model's batch there.
pub(crate) fn profiled_dps(model: &ModelSpec, cluster: &ClusterSpec) -> Vec<u32> {
    let batch = model.batch_on(cluster);
    (0..32)
        .map(|k| 1u32 << k)
        .take_while(|&d| d <= cluster.gpus() && d <= batch)
        .collect()
}

/// The gradient each replica of `spec` all-reduces per step, GiB: its parameters in bf16 when
/// it trains (what `exposed_reduction` sends), none when frozen.
fn grad_gib(spec: &ModuleSpec) -> f64 {
    if spec.trainable {
        BF16 * Workload::of(spec).params / GIB
    } else {
        0.0
    }
}

/// The analytical profile of `model` on `cluster` with the default [`Calibration`].
pub fn profile(model: &ModelSpec, cluster: &ClusterSpec) -> ProfileFile {
    Calibration::default().profile(model, cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster, model};
    use proptest::prelude::*;

    proptest! {
        /// The smooth maximum lies between the maximum and the sum, is symmetric, is the sum
        /// at p = 1, falls as p grows, and does not underflow at tiny times and a large p.
        #[test]
        fn overlap_lies_between_the_maximum_and_the_sum(
            g in 0.0f64..10.0,
            l in 0.0f64..10.0,
            p in 1.0f64..64.0,
            tiny in 1e-12f64..1e-9,
        ) {
            let at = |p: f64| Calibration { overlap_exponent: p, ..Calibration::default() };
            let t = at(p).overlap(g, l);
            prop_assert!(t >= g.max(l) * (1.0 - 1e-12) && t <= (g + l) * (1.0 + 1e-12));
            prop_assert_eq!(t, at(p).overlap(l, g));
            prop_assert!((at(1.0).overlap(g, l) - (g + l)).abs() <= 1e-12 * (g + l));
            prop_assert!(at((p + 1.0).min(64.0)).overlap(g, l) <= t * (1.0 + 1e-12));
            let small = at(64.0).overlap(tiny, tiny);
            prop_assert!(small > tiny && small < 1.02 * tiny);
        }
    }

    /// Module `name` of `model` on one H100 node at (dp, sm) under the default constants.
    fn at(model_name: &str, name: &str, dp: u32, sm: f64) -> Estimate {
        let m = model(model_name).unwrap();
        let i = m.modules.iter().position(|x| x.name == name).unwrap();
        Calibration::default().estimate(&m, i, &cluster("h100x8").unwrap(), dp, sm)
    }

    #[test]
    fn clip_vision_scales_sublinearly_in_the_sms() {
        // Measured: 796 ms on 16 SMs, 139 ms on 132 (5.7×, not 8.25×).
        let ratio =
            at("clip", "vision", 1, 16.0 / 132.0).time_ms / at("clip", "vision", 1, 1.0).time_ms;
        assert!(ratio > 4.5 && ratio < 7.0, "{ratio}");
    }

    #[test]
    fn small_batches_hit_the_launch_floor_above_half_the_gpu() {
        // Measured at per-GPU batch 2: vision 45–58 ms, text 24–31 ms from half the GPU up.
        for (name, lo, hi) in [("vision", 40.0, 60.0), ("text", 20.0, 32.0)] {
            for sm in [0.5, 0.7, 1.0] {
                let e = at("clip", name, 8, sm);
                assert!(e.time_ms > lo && e.time_ms < hi, "{name} at {sm}: {e:?}");
            }
            let flat = at("clip", name, 8, 0.5).time_ms / at("clip", name, 8, 1.0).time_ms;
            assert!(flat < 1.1, "{name}: {flat}");
        }
    }

    #[test]
    fn small_encoders_are_launch_bound_at_every_quota() {
        // Measured: ImageBind-sized depth, thermal and IMU encoders took 13–28 ms per step at
        // every quota, batch 16 or 2; the floor does not move with the SMs or the batch.
        for name in ["depth", "thermal", "imu"] {
            for dp in [1, 8] {
                for sm in [0.2, 0.5, 1.0] {
                    let e = at("imagebind", name, dp, sm);
                    assert!(
                        e.time_ms > 13.0 && e.time_ms < 40.0,
                        "{name} dp {dp} sm {sm}: {e:?}"
                    );
                }
                let floor = at("imagebind", name, dp, 1.0).launch_ms;
                assert_eq!(floor, at("imagebind", name, dp, 0.2).launch_ms);
            }
        }
    }

    #[test]
    fn the_profile_says_its_nodes_and_each_modules_gradient() {
        let cal = Calibration::default();
        for (name, c) in [
            ("qwen3-vl", "h100x16"),
            ("imagebind", "a100x8"),
            ("clip", "h100x4"),
        ] {
            let m = model(name).unwrap();
            let c = cluster(c).unwrap();
            let p = cal.profile(&m, &c);
            let nodes = p.nodes.unwrap();
            assert_eq!(nodes, cal.nodes(&c));
            assert_eq!(nodes.gpus_per_node, c.gpus_per_node);
            // One way of NVLink and of a NIC, at the ring's link efficiency.
            assert_eq!(nodes.intra_gbps, c.nvlink_gbps / 2.0 * cal.link_efficiency);
            assert_eq!(nodes.inter_gbps, c.ib_gbps * cal.link_efficiency);
            for (spec, module) in m.modules.iter().zip(&p.modules) {
                let grad = module.grad_gib.unwrap();
                let want = if spec.trainable {
                    2.0 * spec.params as f64 / GIB
                } else {
                    0.0
                };
                assert!((grad - want).abs() <= 1e-12 * want, "{}: {grad}", spec.name);
            }
            // The file reads back, nodes and all.
            let text = serde_json::to_string(&p).unwrap();
            assert_eq!(mosaic_profile::parse(&text, "zoo.json").unwrap(), p);
        }
        // H100 nodes: 900 GB/s NVLink both ways, 400 Gb/s NDR per GPU, at 80 %.
        let h100 = cal.nodes(&cluster("h100x16").unwrap());
        assert_eq!((h100.intra_gbps, h100.inter_gbps), (360.0, 40.0));
        // Across packed nodes the device model's ring runs at min(NVLink, 8 NICs), which is
        // what the nodes' bandwidths give the planner for 8 replicas a node.
        assert_eq!(h100.intra_gbps.min(8.0 * h100.inter_gbps), 320.0);
    }

    #[test]
    fn the_assumed_constants_differ_only_in_the_fitted_ones() {
        let (a, d) = (Calibration::assumed(), Calibration::default());
        let mut fitted_reset = d;
        for c in crate::FreeConstant::ALL {
            c.set(&mut fitted_reset, c.get(&a));
        }
        assert_eq!(fitted_reset, a);
    }
}
