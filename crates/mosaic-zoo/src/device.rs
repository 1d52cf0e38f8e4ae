//! GPU devices (datasheet numbers) and the clusters built from them.

use mosaic_profile::{Device, SmGranularity};
use serde::Serialize;

use crate::error::ZooError;

/// GPUs per node of every built-in cluster: the 8-GPU HGX/DGX baseboard of the paper's testbed
/// (Mosaic §5.1: "4 HGX nodes, each equipped with 8 NVIDIA H100 (80GB) GPUs").
pub const GPUS_PER_NODE: u32 = 8;

/// One GPU model, with the dense (no sparsity) numbers of its datasheet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSpec {
    /// Marketing name, e.g. `H100-SXM5-80GB` (the profile file's `device.name`).
    pub name: String,
    /// Lower-case short name used in cluster names, e.g. `h100`.
    pub short_name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Memory capacity in GiB (the datasheet's GB figure, used as the per-GPU capacity).
    pub memory_gib: f64,
    /// Peak dense BF16 tensor-core throughput in TFLOP/s.
    pub peak_tflops: f64,
    /// Peak HBM bandwidth in TB/s.
    pub hbm_tbps: f64,
    /// NVLink bandwidth per GPU in GB/s (bytes), both directions together as the datasheet counts.
    pub nvlink_gbps: f64,
    /// The SM partitions a CUDA green context can hold on it (`docs/reference.md`, "Green
    /// contexts": CUDA driver API, green contexts — compute capability 9.x at least 8 SMs in
    /// multiples of 8, 8.x at least 4 in multiples of 2): the profile's `device.partition`.
    pub partition: SmGranularity,
}

impl DeviceSpec {
    /// The SM quotas a module may hold on this GPU, ascending, as fractions of its SMs: the
    /// partitions a green-context split hands out and the whole GPU for a module alone
    /// ([`SmGranularity::quota_sms`] over `sm_count`). H100/H200: 8/132, 16/132, …, 128/132
    /// and 1.0 (17 quotas); A100: 4/108, 6/108, …, 108/108 (53). The grid the planner plans on
    /// for a profile carrying [`Self::profile_device`], so the grid to profile at.
    pub fn quota_grid(&self) -> Vec<f64> {
        self.partition
            .quota_sms(self.sm_count)
            .into_iter()
            .map(|n| n as f64 / self.sm_count as f64)
            .collect()
    }

    /// The profile file's `device` for this GPU, partition rule included. Its samples' quotas
    /// must then be whole SM counts (the points of [`Self::quota_grid`] are).
    pub fn profile_device(&self) -> Device {
        Device {
            name: self.name.clone(),
            sm_count: self.sm_count,
            memory_gib: self.memory_gib,
            partition: Some(self.partition),
        }
    }
}

/// A pool of identical GPUs: `nodes` nodes of `gpus_per_node` GPUs each.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSpec {
    /// Name, e.g. `h100x8`.
    pub name: String,
    /// The GPU every node carries.
    pub device: DeviceSpec,
    /// GPUs per node (NVLink domain).
    pub gpus_per_node: u32,
    /// Nodes.
    pub nodes: u32,
    /// NVLink bandwidth per GPU inside a node, GB/s (bytes), both directions together.
    pub nvlink_gbps: f64,
    /// InfiniBand bandwidth per GPU across nodes, GB/s (bytes) per direction (one NIC per GPU).
    pub ib_gbps: f64,
}

impl ClusterSpec {
    /// GPUs in the cluster.
    pub fn gpus(&self) -> u32 {
        self.gpus_per_node * self.nodes
    }

    /// Whether all GPUs share one NVLink domain (the paper's "single-node experiments").
    pub fn is_single_node(&self) -> bool {
        self.nodes == 1
    }
}

/// NVIDIA H100 SXM5 80GB.
fn h100() -> DeviceSpec {
    DeviceSpec {
        name: "H100-SXM5-80GB".into(),
        short_name: "h100".into(),
        sm_count: 132, // NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs (SXM5)
        memory_gib: 80.0, // NVIDIA H100 datasheet: 80 GB HBM3
        peak_tflops: 989.0, // NVIDIA H100 datasheet: BF16 1,979 TFLOPS with sparsity, 989 dense
        hbm_tbps: 3.35, // NVIDIA H100 datasheet: 3.35 TB/s
        nvlink_gbps: 900.0, // NVIDIA H100 datasheet: NVLink 900 GB/s
        partition: SmGranularity::for_compute_capability(9), // Hopper, 9.0: 8 SMs, steps of 8
    }
}

/// NVIDIA H200 SXM 141GB.
fn h200() -> DeviceSpec {
    DeviceSpec {
        name: "H200-SXM-141GB".into(),
        short_name: "h200".into(),
        sm_count: 132, // same GH100 die and SM count as H100 SXM5 (NVIDIA H200 datasheet)
        memory_gib: 141.0, // NVIDIA H200 datasheet: 141 GB HBM3e
        peak_tflops: 989.0, // NVIDIA H200 datasheet: BF16 1,979 TFLOPS with sparsity, 989 dense
        hbm_tbps: 4.8, // NVIDIA H200 datasheet: 4.8 TB/s
        nvlink_gbps: 900.0, // NVIDIA H200 datasheet: NVLink 900 GB/s
        partition: SmGranularity::for_compute_capability(9), // Hopper, 9.0: 8 SMs, steps of 8
    }
}

/// NVIDIA A100 SXM4 80GB.
fn a100() -> DeviceSpec {
    DeviceSpec {
        name: "A100-SXM4-80GB".into(),
        short_name: "a100".into(),
        sm_count: 108, // NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs
        memory_gib: 80.0, // NVIDIA A100 datasheet: 80 GB HBM2e
        peak_tflops: 312.0, // NVIDIA A100 datasheet: BF16 312 TFLOPS dense
        hbm_tbps: 2.039, // NVIDIA A100 datasheet: 2,039 GB/s (SXM 80GB)
        nvlink_gbps: 600.0, // NVIDIA A100 datasheet: NVLink 600 GB/s
        partition: SmGranularity::for_compute_capability(8), // Ampere, 8.0: 4 SMs, steps of 2
    }
}

/// InfiniBand bandwidth per GPU (GB/s, one direction) of the standard 8-GPU node of a device.
fn ib_per_gpu(device: &DeviceSpec) -> f64 {
    match device.short_name.as_str() {
        // NVIDIA DGX A100 datasheet: 8× single-port ConnectX-6 200 Gb/s HDR, one per GPU.
        "a100" => 25.0,
        // Mosaic §5.1: 8 InfiniBand NICs per node, 400 Gbps each (NDR); DGX H100/H200
        // datasheets: 8× ConnectX-7 400 Gb/s. 400 Gb/s = 50 GB/s per GPU.
        _ => 50.0,
    }
}

/// The built-in devices: H100 SXM5, H200 SXM, A100 SXM 80GB.
pub fn devices() -> Vec<DeviceSpec> {
    vec![h100(), h200(), a100()]
}

/// Builds a cluster of `gpus` GPUs of `device`, 8 per node (fewer than 8: one partial node).
pub(crate) fn make(device: DeviceSpec, gpus: u32) -> Result<ClusterSpec, String> {
    let (gpus_per_node, nodes) = match gpus {
        0 => return Err("expected at least 1 GPU".into()),
        // The planner's limit (mosaic_plan::MAX_GPUS, which this crate does not depend on).
        g if g > 1 << 16 => {
            return Err(format!("{g} GPUs is more than the 65536 the planner takes"))
        }
        g if g <= GPUS_PER_NODE => (g, 1),
        g if g % GPUS_PER_NODE == 0 => (GPUS_PER_NODE, g / GPUS_PER_NODE),
        g => {
            return Err(format!(
                "{g} GPUs do not fill whole {GPUS_PER_NODE}-GPU nodes; above one node use a \
                 multiple of {GPUS_PER_NODE} (e.g. {}x{})",
                device.short_name,
                g.div_ceil(GPUS_PER_NODE) * GPUS_PER_NODE
            ))
        }
    };
    Ok(ClusterSpec {
        name: format!("{}x{gpus}", device.short_name),
        ib_gbps: ib_per_gpu(&device),
        nvlink_gbps: device.nvlink_gbps,
        device,
        gpus_per_node,
        nodes,
    })
}

/// The built-in clusters: the paper's 4-GPU server (§2.2) and 8/16/32-GPU pools (§5.1, §5.4.1),
/// and one node of H200 and of A100.
pub fn clusters() -> Vec<ClusterSpec> {
    [
        (h100(), 4),
        (h100(), 8),
        (h100(), 16),
        (h100(), 32),
        (h200(), 8),
        (a100(), 8),
    ]
    .into_iter()
    .map(|(d, g)| make(d, g).expect("built-in clusters are well formed"))
    .collect()
}

/// Resolves a cluster name, case-insensitively: a built-in name or `<device>x<N>` (e.g.
/// `h100x24`, `a100x16`); above 8 GPUs, N must be a multiple of 8.
pub fn cluster(name: &str) -> Result<ClusterSpec, ZooError> {
    let key = name.trim().to_ascii_lowercase();
    if let Some(c) = clusters().into_iter().find(|c| c.name == key) {
        return Ok(c);
    }
    let unknown = || ZooError::UnknownCluster {
        name: name.to_string(),
        known: clusters()
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        devices: devices()
            .iter()
            .map(|d| d.short_name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let (dev, count) = key.rsplit_once('x').ok_or_else(unknown)?;
    let device = devices()
        .into_iter()
        .find(|d| d.short_name == dev)
        .ok_or_else(unknown)?;
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unknown());
    }
    let gpus: u32 = count.parse().map_err(|_| ZooError::BadCluster {
        name: name.to_string(),
        reason: format!("GPU count {count} is too large"),
    })?;
    make(device, gpus).map_err(|reason| ZooError::BadCluster {
        name: name.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_and_pattern_names() {
        let c = cluster("h100x8").unwrap();
        assert_eq!((c.gpus(), c.nodes, c.gpus_per_node), (8, 1, 8));
        let c = cluster("H100x24").unwrap();
        assert_eq!((c.name.as_str(), c.gpus(), c.nodes), ("h100x24", 24, 3));
        let c = cluster("a100x16").unwrap();
        assert_eq!((c.device.sm_count, c.nodes, c.ib_gbps), (108, 2, 25.0));
        let c = cluster("h200x2").unwrap();
        assert!(c.is_single_node() && c.gpus() == 2);
        for c in clusters() {
            assert_eq!(cluster(&c.name).unwrap(), c);
        }
    }

    #[test]
    fn devices_know_their_sm_partitions_and_quota_grid() {
        let h100 = cluster("h100x8").unwrap().device;
        assert_eq!((h100.partition.min_sms, h100.partition.step_sms), (8, 8));
        let grid = h100.quota_grid();
        assert_eq!(grid.len(), 17);
        assert_eq!(grid[1], 16.0 / 132.0);
        assert_eq!(grid[15], 128.0 / 132.0, "the most a split hands out");
        assert_eq!(grid[16], 1.0, "the whole GPU, for a module alone");
        let a100 = cluster("a100x8").unwrap().device;
        assert_eq!((a100.partition.min_sms, a100.partition.step_sms), (4, 2));
        let grid = a100.quota_grid();
        assert_eq!(
            (grid[0], grid[1], grid.len()),
            (4.0 / 108.0, 6.0 / 108.0, 53)
        );
        assert_eq!(*grid.last().unwrap(), 1.0);
        let d = h100.profile_device();
        assert_eq!((d.sm_count, d.partition), (132, Some(h100.partition)));
    }

    #[test]
    fn bad_names_list_what_is_known() {
        for bad in ["v100x8", "h100", "h100x", "h100x-8", "x8", ""] {
            let e = cluster(bad).unwrap_err().to_string();
            assert!(e.contains("h100x8") && e.contains("a100"), "{bad}: {e}");
        }
        let e = cluster("h100x12").unwrap_err().to_string();
        assert!(e.contains("multiple of 8") && e.contains("h100x16"), "{e}");
        assert!(cluster("h100x0").is_err());
        assert!(cluster("h100x99999999999").is_err());
    }
}
