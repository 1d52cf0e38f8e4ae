//! The next batch drawn while a step trains: a [`DataSource`] whose answer for step `s` starts
//! step `s + 1`'s batch on a thread of its own, so that drawing it on the host (real-size
//! ImageBind's inputs at batch 16 are some 30 M values, each a sum of three patterns) leaves a
//! GPU step's critical path. The batches are the inner source's, bit for bit: a batch depends
//! only on its step. The trainer wraps the sources that say drawing ahead is worth it
//! ([`DataSource::worth_drawing_ahead`]: the zoo's synthetic data), on a GPU.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use candle_core::{Device, Result};

use crate::models::{Batch, DataSource, Field};

/// `inner`, each answer starting the next step's batch ahead (see the module documentation).
pub struct Prefetched {
    inner: Arc<dyn DataSource>,
    ahead: Mutex<Option<Ahead>>,
}

/// A batch being drawn ahead: its step and size, and the thread drawing it.
struct Ahead {
    step: u64,
    batch: usize,
    thread: JoinHandle<Result<Batch>>,
}

impl Ahead {
    /// The drawn batch (a panic in the thread becomes an error).
    fn join(self) -> Result<Batch> {
        self.thread.join().unwrap_or_else(|_| {
            Err(candle_core::Error::Msg(format!(
                "drawing the batch of step {} ahead panicked",
                self.step
            )))
        })
    }
}

impl Prefetched {
    /// `inner`, drawing ahead.
    pub fn wrap(inner: Box<dyn DataSource>) -> Box<dyn DataSource> {
        Box::new(Prefetched {
            inner: Arc::from(inner),
            ahead: Mutex::new(None),
        })
    }
}

impl DataSource for Prefetched {
    /// The batch drawn ahead where it is the one asked for (on the host), else drawn now; then
    /// the next step's, ahead, unless it is being drawn already.
    fn batch(&self, step: u64, batch: usize, device: &Device) -> Result<Batch> {
        if !device.is_cpu() {
            return self.inner.batch(step, batch, device);
        }
        let mut ahead = self.ahead.lock().expect("prefetch lock");
        let got = match ahead.take() {
            Some(a) if (a.step, a.batch) == (step, batch) => a.join(),
            // Another step's (a trial step asks for step 0 again): kept for when it is asked.
            other => {
                *ahead = other;
                self.inner.batch(step, batch, device)
            }
        };
        let next = step.wrapping_add(1);
        if !matches!(&*ahead, Some(a) if (a.step, a.batch) == (next, batch)) {
            let inner = Arc::clone(&self.inner);
            let thread = std::thread::Builder::new()
                .name("mosaic-prefetch".into())
                .spawn(move || inner.batch(next, batch, &Device::Cpu))
                .map_err(|e| candle_core::Error::Msg(format!("a thread to draw ahead: {e}")))?;
            // One replaced here finishes on its own; its batch is not needed.
            *ahead = Some(Ahead {
                step: next,
                batch,
                thread,
            });
        }
        got
    }

    fn fields(&self) -> Vec<Field> {
        self.inner.fields()
    }
}

impl Drop for Prefetched {
    /// Waits for the batch being drawn, so that no thread outlives the source.
    fn drop(&mut self) {
        if let Some(a) = self.ahead.get_mut().ok().and_then(Option::take) {
            let _ = a.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use candle_core::Tensor;

    use super::*;
    use crate::models;

    /// A source that counts the batches it is asked for, by step.
    struct Counting {
        inner: Box<dyn DataSource>,
        asked: Arc<Mutex<BTreeMap<u64, usize>>>,
    }

    impl DataSource for Counting {
        fn batch(&self, step: u64, batch: usize, device: &Device) -> Result<Batch> {
            *self.asked.lock().unwrap().entry(step).or_default() += 1;
            self.inner.batch(step, batch, device)
        }

        fn fields(&self) -> Vec<Field> {
            self.inner.fields()
        }
    }

    fn values(b: &Batch) -> Vec<(String, Vec<f32>)> {
        let flat = |t: &Tensor| {
            let t = t.to_dtype(candle_core::DType::F32).unwrap();
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        b.tensors
            .iter()
            .map(|(k, t)| (k.to_string(), flat(t)))
            .collect()
    }

    #[test]
    fn batches_are_the_inner_sources_and_each_is_drawn_once() {
        let clip = || {
            let recipe = models::Recipe {
                size: 0.05,
                ..models::Recipe::new("clip", 0)
            };
            models::build_placed(&recipe, &|_| Device::Cpu).unwrap()
        };
        let asked = Arc::new(Mutex::new(BTreeMap::new()));
        let prefetched = Prefetched::wrap(Box::new(Counting {
            inner: clip().data,
            asked: Arc::clone(&asked),
        }));
        let reference = clip();
        assert!(
            reference.data.worth_drawing_ahead(),
            "the zoo's data is drawn ahead"
        );
        let tiny = models::build("clip-tiny", 0, &Device::Cpu).unwrap();
        assert!(
            !tiny.data.worth_drawing_ahead(),
            "by default a source is not"
        );
        let cpu = &Device::Cpu;
        // A trial step asks for step 0 twice, then training goes on from it.
        for step in [0, 0, 0, 1, 2] {
            let got = prefetched.batch(step, 4, cpu).unwrap();
            let want = reference.data.batch(step, 4, cpu).unwrap();
            assert_eq!(values(&got), values(&want), "step {step}");
        }
        drop(prefetched);
        let asked = asked.lock().unwrap().clone();
        // Step 0 three times (nothing drew it ahead), every later step once: drawn ahead and
        // used, step 3 ahead and never asked for.
        assert_eq!(asked, BTreeMap::from([(0, 3), (1, 1), (2, 1), (3, 1)]));
    }
}
