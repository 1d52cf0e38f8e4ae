//! The checks that need only the driver: the device, green-context slots and NVML; then
//! those of the GPU build (`compute`).

use super::{Checks, GpuCheck, Outcome};
use crate::runtime::slot::cuda::{Carving, GpuDevice};

/// The checks that need only the driver, then those of the GPU build.
pub(super) fn run(ordinal: usize, out: &mut Checks) {
    let device = match GpuDevice::open(ordinal) {
        Ok(d) => d,
        Err(e) => return out.push(GpuCheck::new("driver", Outcome::Fail, e.to_string())),
    };
    let (major, minor) = device.compute_capability();
    let reported = match device.reported_granularity() {
        Some(g) => format!("the driver reports {g}"),
        None => "the driver reports none".to_string(),
    };
    out.push(GpuCheck::new(
        "driver",
        Outcome::Pass,
        format!(
            "device {ordinal}: {} ({} SMs, compute capability {major}.{minor}); partitions: \
             {} by the guideline, {reported}",
            device.name(),
            device.sms(),
            device.granularity(),
        ),
    ));
    out.push(slots(&device));
    out.push(nvml(&device));
    #[cfg(mosaic_gpu)]
    super::compute::run(&device, out);
    #[cfg(not(mosaic_gpu))]
    out.push(GpuCheck::new(
        "module compute",
        Outcome::Skip,
        "this build has no GPU compute: build mosaic with scripts/cuda-cargo",
    ));
}

/// A stage of quotas [0.25, 0.5, 0.25], then a module alone at quota 1 (the last figure,
/// every SM): SMs granted as asked, and a fill on each stream.
fn slots(device: &GpuDevice) -> GpuCheck {
    let name = "green-context slots";
    let quotas = [0.25, 0.5, 0.25];
    let run = || -> Result<(Vec<u32>, Vec<u32>, bool, Carving), crate::EngineError> {
        let asked = device.stage_sms(&quotas)?;
        let slots = device.create_stage(&[("a", quotas[0]), ("b", quotas[1]), ("c", quotas[2])])?;
        let carving = slots[0].carving();
        let granted: Vec<u32> = slots.iter().map(|s| s.sms()).collect();
        let mut filled = true;
        for (i, slot) in slots.iter().enumerate() {
            let value = 0x5107_0000 + i as u32;
            filled &= slot.fill(4096, value)?.iter().all(|&w| w == value);
        }
        // A module alone at quota 1 holds every SM.
        let alone = device.create_slot("alone", 1.0)?;
        filled &= alone.fill(16, 9)?.iter().all(|&w| w == 9);
        let mut asked = asked;
        asked.push(device.sms());
        let mut granted = granted;
        granted.push(alone.sms());
        Ok((asked, granted, filled, carving))
    };
    match run() {
        Ok((asked, granted, filled, carving)) => GpuCheck::judged(
            name,
            asked == granted && filled,
            format!(
                "quotas {quotas:?}: asked {asked:?} SMs, granted {granted:?} (carved \
                 {carving:?}); fill on every stream {}",
                if filled { "ok" } else { "WRONG" }
            ),
        ),
        Err(e) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
    }
}

/// NVML finds the device by its PCI bus id and reads what a GPU profile takes from it:
/// memory, a peak bandwidth between 0.1 and 20 TB/s (an H100 SXM's datasheet says 3.35)
/// and busy fractions in [0, 1] over the last second.
fn nvml(device: &GpuDevice) -> GpuCheck {
    use crate::measure::nvml::{now_us, Nvml};
    let name = "NVML";
    let run = || -> Result<(bool, String), crate::EngineError> {
        let nvml = Nvml::open(device.pci_bus_id())?;
        let (memory, peak) = (nvml.memory_gib()?, nvml.peak_gbps()?);
        let busy = nvml.busy_since(now_us().saturating_sub(1_000_000))?;
        let figure = format!(
            "PCI bus {}: {memory:.1} GiB, peak {peak:.0} GB/s; busy over the last second: \
             kernels {:.2}, memory {:.2} ({} samples)",
            device.pci_bus_id(),
            busy.kernels,
            busy.memory,
            busy.samples
        );
        let fractions = [busy.kernels, busy.memory];
        let pass = memory > 0.0
            && (100.0..20_000.0).contains(&peak)
            && fractions.iter().all(|f| (0.0..=1.0).contains(f));
        Ok((pass, figure))
    };
    match run() {
        Ok((pass, figure)) => GpuCheck::judged(name, pass, figure),
        Err(e) => GpuCheck::new(name, Outcome::Fail, e.to_string()),
    }
}
