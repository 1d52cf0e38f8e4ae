//! A GPU opened for green-context slots, how a stage's slots are cut from its SMs
//! ([`GpuDevice::create_stage`]), and scratch memory on it.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUcontext, CUdevResource, CUdevResourceType, CUdevice, CUdevice_attribute, CUdeviceptr,
};

use super::driver::{check, driver, reported_granularity, sm_count, DeviceInner, GreenCtx};
use super::green::GpuSlot;
use super::Carving;
use crate::error::EngineError;
use mosaic_profile::{partition_sms, SmGranularity};

/// A GPU ready for green-context slots: its SMs, compute capability and primary context
/// (retained while the device or any of its slots lives: green contexts are created from it,
/// and keeping it alive spares every creation its initialisation). Cheap to clone.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    inner: Arc<DeviceInner>,
}

/// What names a device: its name, PCI bus id (`0000:19:00.0`, which NVML finds it by) and
/// compute capability (major, minor).
struct Identity {
    name: String,
    pci_bus_id: String,
    major: i32,
    minor: i32,
}

/// The [`Identity`] of device `dev`; `at` names the call in errors.
fn identify(dev: CUdevice, at: &dyn Fn(&str) -> String) -> Result<Identity, EngineError> {
    // SAFETY (all calls below): the driver is loaded and initialised, every out pointer points
    // at a live local.
    let attribute = |a: CUdevice_attribute, what: &str| -> Result<i32, EngineError> {
        let mut v = 0;
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, || {
            at(&format!("cuDeviceGetAttribute({what})"))
        })?;
        Ok(v)
    };
    let major = attribute(
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "compute capability major",
    )?;
    let minor = attribute(
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "compute capability minor",
    )?;
    let mut name = [0 as c_char; 256];
    check(
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) },
        || at("cuDeviceGetName"),
    )?;
    let text = |buf: &[c_char]| {
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    let mut bus = [0 as c_char; 64];
    check(
        unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) },
        || at("cuDeviceGetPCIBusId"),
    )?;
    Ok(Identity {
        name: text(&name),
        pci_bus_id: text(&bus),
        major,
        minor,
    })
}

/// The order in which [`Carving::InTurn`] splits a stage's slots (`sms` each) off the device:
/// smallest first, ties in the stage's order, so the last slot, which gets the leftovers, is
/// the largest. Why: on an H200, a real-size ImageBind stage split in the plan's order (48, 24,
/// 32, 8, 8, 8 SMs) failed in the last 8-SM slot's cuBLAS call
/// (`CUBLAS_STATUS_EXECUTION_FAILED`, also with launches blocking), while the same module alone
/// in an 8-SM slot trained; that co-scheduling is the cause is our reading, not yet checked.
fn split_order(sms: &[u32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sms.len()).collect();
    order.sort_by_key(|&i| sms[i]);
    order
}

/// [`Carving::OneSplit`]'s group sizes to try for a stage's slots (`sms` each), largest first:
/// the greatest common divisor of the slots' SMs, then the smallest of its divisors that the
/// device grants as a partition (`granularity`), which cuts more groups of the same SMs should
/// the driver refuse the larger ones (its split "may lead to fewer groups created than purely
/// dividing the total SM count by the minCount", CUDA 13.0's `cuda.h`). None where no divisor is
/// granted.
fn group_sizes(sms: &[u32], granularity: SmGranularity) -> Vec<u32> {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let unit = sms.iter().copied().fold(0, gcd);
    let granted: Vec<u32> = (1..=unit)
        .rev()
        .filter(|&u| unit.is_multiple_of(u) && granularity.allows(u))
        .collect();
    let mut sizes: Vec<u32> = granted
        .first()
        .into_iter()
        .chain(granted.last())
        .copied()
        .collect();
    sizes.dedup();
    sizes
}

impl GpuDevice {
    /// Opens CUDA device `ordinal`: checks the driver ([`super::driver_unavailable`]), reads the
    /// device's name, SMs and compute capability, and retains its primary context.
    pub fn open(ordinal: usize) -> Result<GpuDevice, EngineError> {
        let at = |what: &str| format!("{what} (device {ordinal})");
        driver().as_ref().map_err(|why| EngineError::Cuda {
            what: at("loading the driver"),
            message: why.clone(),
        })?;
        let mut dev: CUdevice = 0;
        // SAFETY (all calls below): the driver is loaded and initialised, every out pointer
        // points at a live local.
        check(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            || at("cuDeviceGet"),
        )?;
        let Identity {
            name,
            pci_bus_id,
            major,
            minor,
        } = identify(dev, &at)?;
        if major < 6 {
            return Err(EngineError::Cuda {
                what: at("green contexts"),
                message: format!(
                    "{name} has compute capability {major}.{minor}; green contexts need 6.0 \
                     or later"
                ),
            });
        }
        let mut whole: CUdevResource = unsafe { std::mem::zeroed() };
        check(
            unsafe {
                sys::cuDeviceGetDevResource(
                    dev,
                    &mut whole,
                    CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
                )
            },
            || at("cuDeviceGetDevResource(SM)"),
        )?;
        let mut primary: CUcontext = std::ptr::null_mut();
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut primary, dev) },
            || at("cuDevicePrimaryCtxRetain"),
        )?;
        // candle allocates with cuMemAllocAsync from the device's default pool, which by
        // default hands freed memory back to the driver at every synchronisation, so each
        // step would map its activations anew; keep it instead, as PyTorch's caching
        // allocator does.
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        check(
            unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) },
            || at("cuDeviceGetDefaultMemPool"),
        )?;
        let mut keep_all = u64::MAX;
        check(
            unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut keep_all as *mut u64).cast(),
                )
            },
            || at("cuMemPoolSetAttribute(release threshold)"),
        )?;
        Ok(GpuDevice {
            inner: Arc::new(DeviceInner {
                ordinal,
                dev,
                name,
                pci_bus_id,
                sms: sm_count(&whole),
                compute_capability: (major, minor),
                primary,
                whole,
                refused_one_split: Default::default(),
            }),
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's name (e.g. `NVIDIA H100 80GB HBM3`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's PCI bus id (`0000:19:00.0`): how NVML finds the same device.
    pub fn pci_bus_id(&self) -> &str {
        &self.inner.pci_bus_id
    }

    /// The device's SMs (as its SM resource reports them).
    pub fn sms(&self) -> u32 {
        self.inner.sms
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }

    /// The partition rule the driver reports for this device's SMs (CUDA 13 drivers; `None`
    /// from older ones). Reported, not used: slots follow [`GpuDevice::granularity`], the rule
    /// the planner's profiles use, and `mosaic check gpu` shows both.
    pub fn reported_granularity(&self) -> Option<SmGranularity> {
        reported_granularity(&self.inner.whole)
    }

    /// The partition sizes this device allows, by its compute capability.
    pub fn granularity(&self) -> SmGranularity {
        SmGranularity::for_compute_capability(self.inner.compute_capability.0)
    }

    /// SMs each module of a stage would ask for, by [`partition_sms`] on this device.
    pub fn stage_sms(&self, quotas: &[f64]) -> Result<Vec<u32>, EngineError> {
        partition_sms(quotas, self.sms(), self.sms(), self.granularity()).map_err(|message| {
            EngineError::Cuda {
                what: format!(
                    "partitioning device {} ({}) for quotas {quotas:?}",
                    self.ordinal(),
                    self.name()
                ),
                message,
            }
        })
    }

    /// The slots of one stage, `(module, quota)` each, on disjoint SMs: a green context and a
    /// stream per module; a module alone at quota 1 gets the whole device's SMs.
    ///
    /// [`partition_sms`] first takes SMs back from the modules rounded up the most until the
    /// stage fits the device; the SMs are then carved by [`Carving::OneSplit`], or where the
    /// driver refuses it, [`Carving::InTurn`] ([`GpuSlot::carving`] says which; a stage of the
    /// same SMs refused once goes straight to a split in turn, so that creating stages on
    /// demand does not pay for the refusal each time). Slots of different stages may share
    /// SMs: stages do not overlap in time. [`GpuSlot::sms`] reports what the driver granted,
    /// read back from the slot's context.
    pub fn create_stage(&self, modules: &[(&str, f64)]) -> Result<Vec<GpuSlot>, EngineError> {
        let quotas: Vec<f64> = modules.iter().map(|m| m.1).collect();
        // A stage the partition rule refuses fails below, in either carving.
        let key = self.stage_sms(&quotas).ok();
        let refusals = || self.inner.refused_one_split.lock().expect("refusals lock");
        if key.as_ref().is_some_and(|k| refusals().contains(k)) {
            return self.create_stage_by(modules, Carving::InTurn);
        }
        self.create_stage_by(modules, Carving::OneSplit)
            .or_else(|one| {
                let slots = self
                    .create_stage_by(modules, Carving::InTurn)
                    .map_err(|turn| match turn {
                        EngineError::Cuda { what, message } => EngineError::Cuda {
                            what,
                            message: format!("{message} (and in one split: {one})"),
                        },
                        other => other,
                    })?;
                if let Some(key) = key {
                    refusals().insert(key);
                }
                Ok(slots)
            })
    }

    /// [`GpuDevice::create_stage`] carved `how`, without falling back (`check gpu` tries each).
    /// [`Carving::Whole`] takes one module at quota 1; the other two any stage.
    pub fn create_stage_by(
        &self,
        modules: &[(&str, f64)],
        how: Carving,
    ) -> Result<Vec<GpuSlot>, EngineError> {
        // A module alone at the whole GPU gets every SM: a green context of the device's whole
        // SM resource, since a split hands out at most ⌊SMs/step⌋·step (128 of an H100's 132).
        if let [(module, quota)] = *modules {
            if quota >= 1.0 {
                let whole = self.inner.whole;
                return Ok(vec![GpuSlot::create(
                    &self.inner,
                    module,
                    quota,
                    &[whole],
                    Arc::new(Vec::new()),
                    Carving::Whole,
                )?]);
            }
        }
        let quotas: Vec<f64> = modules.iter().map(|m| m.1).collect();
        let sms = self.stage_sms(&quotas)?;
        match how {
            Carving::OneSplit => self.split_once(modules, &sms),
            Carving::InTurn => self.split_in_turn(modules, &sms),
            Carving::Whole => Err(EngineError::Cuda {
                what: format!("carving a stage of {modules:?} (device {})", self.ordinal()),
                message: "only a module alone at quota 1 gets the whole device".into(),
            }),
        }
    }

    /// [`Carving::OneSplit`]: the stage's `sms` (per module) as groups of one split, of the
    /// first of [`group_sizes`] the driver grants.
    fn split_once(
        &self,
        modules: &[(&str, f64)],
        sms: &[u32],
    ) -> Result<Vec<GpuSlot>, EngineError> {
        let granularity = self.granularity();
        let mut refusals = Vec::new();
        for unit in group_sizes(sms, granularity) {
            match self.split_into(modules, sms, unit) {
                Ok(slots) => return Ok(slots),
                Err(e) => refusals.push(e.to_string()),
            }
        }
        Err(EngineError::Cuda {
            what: format!(
                "carving {sms:?} SMs in one split (device {})",
                self.inner.ordinal
            ),
            message: if refusals.is_empty() {
                format!("the slots share no group size the device grants ({granularity})")
            } else {
                refusals.join("; ")
            },
        })
    }

    /// The stage's `sms` (per module) as groups of `unit` SMs from one split of the device.
    fn split_into(
        &self,
        modules: &[(&str, f64)],
        sms: &[u32],
        unit: u32,
    ) -> Result<Vec<GpuSlot>, EngineError> {
        let device = &self.inner;
        let at = |what: &str| {
            format!(
                "{what} carving {sms:?} SMs from one split into groups of {unit} (device {})",
                device.ordinal
            )
        };
        let refused = |what: &str, message: String| EngineError::Cuda {
            what: at(what),
            message,
        };
        let counts: Vec<u32> = sms.iter().map(|n| n / unit).collect();
        let wanted: u32 = counts.iter().sum();
        // SAFETY (zeroed): plain C structs the driver fills.
        let mut groups: Vec<CUdevResource> = vec![unsafe { std::mem::zeroed() }; wanted as usize];
        let mut rest: CUdevResource = unsafe { std::mem::zeroed() };
        let mut made = wanted;
        // SAFETY: the device's SM resource; `groups` has room for `made` results; out pointers
        // point at live locals.
        check(
            unsafe {
                sys::cuDevSmResourceSplitByCount(
                    groups.as_mut_ptr(),
                    &mut made,
                    &device.whole,
                    &mut rest,
                    0,
                    unit,
                )
            },
            || at("cuDevSmResourceSplitByCount"),
        )?;
        let sizes: Vec<u32> = groups[..made as usize].iter().map(sm_count).collect();
        if made != wanted || sizes.iter().any(|&n| n != unit) {
            return Err(refused(
                "cuDevSmResourceSplitByCount",
                format!("asked for {wanted} groups of {unit} SMs, the driver made {sizes:?}"),
            ));
        }
        let mut slots = Vec::with_capacity(modules.len());
        let mut next = 0;
        for ((&(module, quota), k), &want) in modules.iter().zip(counts).zip(sms) {
            let parts = &groups[next..next + k as usize];
            next += k as usize;
            let scaffold = Arc::new(Vec::new());
            let slot = GpuSlot::create(device, module, quota, parts, scaffold, Carving::OneSplit)?;
            if slot.sms() != want {
                return Err(refused(
                    "cuGreenCtxCreate",
                    format!(
                        "module \"{module}\" asked for {want} SMs, its context holds {}",
                        slot.sms()
                    ),
                ));
            }
            slots.push(slot);
        }
        Ok(slots)
    }

    /// [`Carving::InTurn`]: the stage's `sms` (per module) split off one at a time. The driver
    /// neither splits a split's output again nor merges outputs of different splits, so what
    /// is left after each module becomes a green context of its own, whose SM resource is split
    /// for the next; these scaffolding contexts (one fewer than the stage's modules, never
    /// given work) live as long as the stage's slots.
    fn split_in_turn(
        &self,
        modules: &[(&str, f64)],
        sms: &[u32],
    ) -> Result<Vec<GpuSlot>, EngineError> {
        let device = &self.inner;
        let mut input = device.whole;
        let mut scaffold = Vec::new();
        let mut parts: Vec<Option<CUdevResource>> = vec![None; sms.len()];
        let order = split_order(sms);
        for (i, &m) in order.iter().enumerate() {
            let (module, n) = (modules[m].0, sms[m]);
            let left = sm_count(&input);
            let at = |what: &str| {
                format!(
                    "{what} taking {n} of {left} SMs for module \"{module}\" (device {})",
                    device.ordinal
                )
            };
            let mut part: CUdevResource = unsafe { std::mem::zeroed() };
            let mut rest: CUdevResource = unsafe { std::mem::zeroed() };
            let mut count = 1;
            // SAFETY: `input` is the device's SM resource or a green context's; out pointers
            // point at live locals; room for one group.
            check(
                unsafe {
                    sys::cuDevSmResourceSplitByCount(&mut part, &mut count, &input, &mut rest, 0, n)
                },
                || at("cuDevSmResourceSplitByCount"),
            )?;
            // The driver may round a count up to its own partition rule.
            if count != 1 || sm_count(&part) != n {
                return Err(EngineError::Cuda {
                    what: at("cuDevSmResourceSplitByCount"),
                    message: format!(
                        "the driver made {count} group(s), of {} SMs",
                        sm_count(&part)
                    ),
                });
            }
            parts[m] = Some(part);
            if i + 1 < modules.len() {
                // The rest cannot be split again as it is; as a green context's resource it can.
                let rest = GreenCtx::create(device.dev, &[rest], &at)?;
                input = rest.sm_resource(&at)?;
                scaffold.push(rest);
            }
        }
        let scaffold = Arc::new(scaffold);
        modules
            .iter()
            .zip(&parts)
            .map(|(&(module, quota), part)| {
                let part = part.expect("every module's SMs were split off");
                GpuSlot::create(
                    device,
                    module,
                    quota,
                    &[part],
                    scaffold.clone(),
                    Carving::InTurn,
                )
            })
            .collect()
    }

    /// One slot of `quota` for `module` (a stage of one module).
    pub fn create_slot(&self, module: &str, quota: f64) -> Result<GpuSlot, EngineError> {
        Ok(self
            .create_stage(&[(module, quota)])?
            .pop()
            .expect("one module, one slot"))
    }

    /// Runs `f` with the primary context current on this thread.
    fn in_primary<T>(&self, f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, EngineError> {
        // SAFETY: the primary context is retained for the device's life.
        check(
            unsafe { sys::cuCtxPushCurrent_v2(self.inner.primary) },
            || "cuCtxPushCurrent(primary context)".into(),
        )?;
        let out = f();
        let mut prev: CUcontext = std::ptr::null_mut();
        unsafe { sys::cuCtxPopCurrent_v2(&mut prev) };
        out
    }
}

/// A device buffer of 32-bit words in the primary context (green contexts share its memory):
/// something for a slot's stream to work on.
pub(crate) struct Scratch<'a> {
    device: &'a GpuDevice,
    ptr: CUdeviceptr,
    words: usize,
}

impl<'a> Scratch<'a> {
    /// `words` words (at least one) on `device`, freed when dropped.
    pub(crate) fn new(device: &'a GpuDevice, words: usize) -> Result<Scratch<'a>, EngineError> {
        let mut ptr: CUdeviceptr = 0;
        device.in_primary(|| {
            // SAFETY: the primary context is current; `ptr` is a live out pointer.
            check(
                unsafe { sys::cuMemAlloc_v2(&mut ptr, words.max(1) * 4) },
                || format!("cuMemAlloc({words} words, primary context)"),
            )
        })?;
        Ok(Scratch {
            device,
            ptr,
            words: words.max(1),
        })
    }

    /// Enqueues setting word `word` to `value` on `slot`'s stream (`cuMemsetD32Async`),
    /// without waiting for it.
    ///
    /// # Panics
    /// If `word` is not a word of the buffer.
    pub(crate) fn set_async(
        &self,
        slot: &GpuSlot,
        word: usize,
        value: u32,
    ) -> Result<(), EngineError> {
        assert!(
            word < self.words,
            "word {word} of a {}-word buffer",
            self.words
        );
        let current = slot.enter()?;
        // SAFETY: word `word` lies in the buffer (checked above), which outlives the stream's
        // work (the caller synchronises the stream before dropping the buffer).
        check(
            unsafe {
                sys::cuMemsetD32Async(self.ptr + 4 * word as u64, value, 1, current.stream())
            },
            || format!("cuMemsetD32Async(slot of module \"{}\")", slot.module()),
        )
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // SAFETY: allocated in `new`; every stream that used it was synchronised.
        let _ = self.device.in_primary(|| {
            unsafe { sys::cuMemFree_v2(ptr) };
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{group_sizes, split_order};
    use mosaic_profile::SmGranularity;

    #[test]
    fn resources_have_the_drivers_stride() {
        // `split_once` hands the driver an array of them: CUDA 13.0's cuda.h lays one out as
        // a type (4 bytes), 92 bytes of padding and a 48-byte union (RESOURCE_ABI_EXTERNAL_BYTES).
        assert_eq!(
            std::mem::size_of::<cudarc::driver::sys::CUdevResource>(),
            144
        );
    }

    #[test]
    fn one_split_tries_the_slots_greatest_common_size_then_the_smallest_granted() {
        let hopper = SmGranularity::for_compute_capability(9);
        // ImageBind's six-way stage on an H100: 16 groups of 8 SMs.
        assert_eq!(group_sizes(&[48, 24, 32, 8, 8, 8], hopper), [8]);
        assert_eq!(group_sizes(&[64, 64], hopper), [64, 8]);
        assert_eq!(group_sizes(&[96, 32], hopper), [32, 8]);
        // An A100 (at least 4 SMs, in steps of 2): 12 + 24 as groups of 12, else of 4.
        let ampere = SmGranularity::for_compute_capability(8);
        assert_eq!(group_sizes(&[12, 24], ampere), [12, 4]);
        // 6 + 4 SMs share groups of 2, which it does not grant alone.
        assert!(group_sizes(&[6, 4], ampere).is_empty());
        assert!(group_sizes(&[], hopper).is_empty());
    }

    #[test]
    fn the_smallest_slots_are_split_off_first_ties_in_stage_order() {
        assert_eq!(split_order(&[48, 24, 32, 8, 8, 8]), [3, 4, 5, 1, 2, 0]);
        assert_eq!(split_order(&[64]), [0]);
        assert!(split_order(&[]).is_empty());
    }
}
