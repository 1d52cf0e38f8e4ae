//! What a GPU profile reads off the device besides times, through NVML (the NVIDIA Management
//! Library, `libnvidia-ml.so.1`, which comes with the driver; loaded at run time by
//! `nvml-wrapper`): the device's memory, its peak memory bandwidth, and how busy it was over a
//! window of back-to-back iterations — the kernel-busy fraction (`sm_util`) and the
//! memory-controller busy fraction (`bw_util`), as the team's H100 profile was measured
//! (`measurements/h100/measure.py`: NVML's utilisation over at least 0.35 s of steps).
//!
//! NVML samples utilisation every 1/6 s to 1 s, depending on the device, each sample the busy
//! percentage over the period that ends at its timestamp: [`Nvml::busy_since`] averages the
//! samples taken after a window began but the first, whose period began before the window
//! (the GPU may have idled then: a capture, a host read), so a window must span at least two
//! periods for a sample of its own ([`super::BUSY_WINDOW`]).

use std::ffi::OsStr;
use std::time::{SystemTime, UNIX_EPOCH};

use nvml_wrapper::enum_wrappers::device::{Clock, Sampling};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::Device;

use crate::error::EngineError;

/// NVML, open on one device (found by its PCI bus id, as the CUDA driver gives it, so that a
/// CUDA ordinal and NVML's index cannot disagree).
pub struct Nvml {
    lib: nvml_wrapper::Nvml,
    pci_bus_id: String,
}

/// The busy fractions NVML sampled over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    /// Share of the time one or more kernels ran, in [0, 1].
    pub kernels: f64,
    /// Share of the time device memory was read or written, in [0, 1].
    pub memory: f64,
    /// Samples behind the figures (0: the last period's figures, the window having been
    /// shorter than one).
    pub samples: usize,
}

/// The current time in NVML's sample clock: microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Nvml {
    /// Loads NVML and finds the device at `pci_bus_id`; the error says which step failed.
    pub fn open(pci_bus_id: &str) -> Result<Nvml, EngineError> {
        let at = |what: &str, e: &dyn std::fmt::Display| EngineError::Cuda {
            what: format!("NVML: {what}"),
            message: e.to_string(),
        };
        let lib = nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new("libnvidia-ml.so.1"))
            .init()
            .map_err(|e| {
                at(
                    "loading libnvidia-ml.so.1 (it comes with the NVIDIA driver)",
                    &e,
                )
            })?;
        let nvml = Nvml {
            lib,
            pci_bus_id: pci_bus_id.to_string(),
        };
        nvml.device()
            .map_err(|e| at(&format!("finding the device at PCI bus {pci_bus_id}"), &e))?;
        Ok(nvml)
    }

    fn device(&self) -> Result<Device<'_>, nvml_wrapper::error::NvmlError> {
        self.lib.device_by_pci_bus_id(self.pci_bus_id.as_str())
    }

    fn call<T>(
        &self,
        what: &str,
        f: impl FnOnce(&Device<'_>) -> Result<T, nvml_wrapper::error::NvmlError>,
    ) -> Result<T, EngineError> {
        self.device()
            .and_then(|d| f(&d))
            .map_err(|e| EngineError::Cuda {
                what: format!("NVML: {what} (device at PCI bus {})", self.pci_bus_id),
                message: e.to_string(),
            })
    }

    /// The device's memory, in GiB.
    pub fn memory_gib(&self) -> Result<f64, EngineError> {
        let info = self.call("memory info", |d| d.memory_info())?;
        Ok(info.total as f64 / (1u64 << 30) as f64)
    }

    /// The device's peak memory bandwidth in GB/s: two transfers per memory clock (double data
    /// rate) × the bus width. On an H100 SXM, NVML's 2,619 MHz × 5,120 bits gives 3,352 GB/s,
    /// the datasheet's 3.35 TB/s.
    pub fn peak_gbps(&self) -> Result<f64, EngineError> {
        let mhz = self.call("max memory clock", |d| d.max_clock_info(Clock::Memory))?;
        let bits = self.call("memory bus width", |d| d.memory_bus_width())?;
        Ok(2.0 * mhz as f64 * 1e6 * bits as f64 / 8.0 / 1e9)
    }

    /// The mean busy fractions of NVML's samples taken after `since` ([`now_us`] when the
    /// window began), the first left out ([`in_window`]); the last period's figures when no
    /// sample fell in the window.
    pub fn busy_since(&self, since: u64) -> Result<Busy, EngineError> {
        let mean = |kind: Sampling, what: &str| -> Result<(f64, usize), EngineError> {
            // NVML says "not found" where no sample is newer than `since`.
            let samples = self.call(what, |d| match d.samples(kind, since) {
                Err(nvml_wrapper::error::NvmlError::NotFound) => Ok(Vec::new()),
                other => other,
            })?;
            let values = in_window(samples.iter().map(|s| (s.timestamp, percent(&s.value))));
            Ok((
                values.iter().sum::<f64>() / values.len().max(1) as f64,
                values.len(),
            ))
        };
        let (kernels, n_k) = mean(Sampling::GpuUtilization, "GPU utilisation samples")?;
        let (memory, n_m) = mean(Sampling::MemoryUtilization, "memory utilisation samples")?;
        if n_k == 0 || n_m == 0 {
            let rates = self.call("utilisation rates", |d| d.utilization_rates())?;
            return Ok(Busy {
                kernels: fraction(rates.gpu as f64),
                memory: fraction(rates.memory as f64),
                samples: 0,
            });
        }
        Ok(Busy {
            kernels: fraction(kernels),
            memory: fraction(memory),
            samples: n_k.min(n_m),
        })
    }
}

/// The percentages of samples (timestamp, value) taken after a window began whose periods lie
/// inside it: in time order, the first left out where there are more (its period began before
/// the window), and values NVML could not give.
fn in_window(samples: impl Iterator<Item = (u64, Option<f64>)>) -> Vec<f64> {
    let mut samples: Vec<(u64, Option<f64>)> = samples.collect();
    samples.sort_by_key(|&(at, _)| at);
    let skip = usize::from(samples.len() > 1);
    samples
        .into_iter()
        .skip(skip)
        .filter_map(|(_, v)| v)
        .collect()
}

/// A sample's percentage, whatever integer or float type NVML stored it in.
fn percent(v: &SampleValue) -> Option<f64> {
    let x = match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => x as f64,
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    };
    x.is_finite().then_some(x)
}

/// A percentage as a fraction in [0, 1].
fn fraction(percent: f64) -> f64 {
    (percent / 100.0).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_fractions() {
        assert_eq!(percent(&SampleValue::U32(42)), Some(42.0));
        assert_eq!(percent(&SampleValue::F64(f64::NAN)), None);
        assert_eq!(fraction(42.0), 0.42);
        assert_eq!(fraction(250.0), 1.0);
        assert!(now_us() > 1_700_000_000_000_000, "microseconds since 1970");
    }

    #[test]
    fn a_window_leaves_out_the_sample_whose_period_began_before_it() {
        let samples = [
            (300, Some(90.0)),
            (100, Some(10.0)),
            (200, None),
            (400, Some(80.0)),
        ];
        assert_eq!(in_window(samples.into_iter()), [90.0, 80.0]);
        // A lone sample is all the window has.
        assert_eq!(in_window([(100, Some(10.0))].into_iter()), [10.0]);
        assert!(in_window(std::iter::empty()).is_empty());
    }

    #[test]
    fn a_machine_without_nvml_says_so() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a GPU machine: `mosaic check gpu` exercises NVML there.
        }
        let e = Nvml::open("0000:00:00.0").err().expect("no NVML here");
        assert!(e.to_string().contains("NVML"), "{e}");
    }
}
