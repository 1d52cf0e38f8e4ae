//! The image feed (`runtime::feed`): batches depend only on the step, producer processes give
//! the very tensors the in-process feed does, the reordering balances the trainer's shards, and
//! a dead producer fails the step with its name instead of hanging.
//!
//! The producers here are this test binary itself, re-executed to run only
//! [`producer_entry`], which calls `feed::produce` when given `--socket`.

use std::time::Duration;

use candle_core::Device;
use mosaic_engine::models::{self, DataSource};
use mosaic_engine::runtime::feed::{
    reorder, shard_loads, FeedConfig, FeedOptions, InProcessFeed, Launcher, ProducerFeed,
};
use mosaic_kit::rng::SplitMix64;

/// The producer when this binary is started by a feed (`… --socket PATH --worker I`); a no-op
/// test otherwise.
#[test]
fn producer_entry() {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--socket") else {
        return;
    };
    let worker = args[i + 3].parse().expect("--worker I");
    let code = match mosaic_engine::runtime::feed::produce(args[i + 1].as_ref(), worker) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("producer {worker}: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// This binary, running only `producer_entry`, the feed's arguments after `--`.
fn launcher() -> Launcher {
    Launcher {
        program: std::env::current_exe().unwrap(),
        args: ["producer_entry", "--exact", "--nocapture", "--"]
            .map(Into::into)
            .to_vec(),
    }
}

fn config(dp: u32) -> (FeedConfig, Vec<models::Field>) {
    let model = models::build("clip-tiny", 0, &Device::Cpu).unwrap();
    let fields = model.data.fields();
    (
        FeedConfig::for_fields(&fields, 7, 3, 48, dp).unwrap(),
        fields,
    )
}

fn options() -> FeedOptions {
    FeedOptions {
        depth: 3,
        timeout: Duration::from_secs(60),
    }
}

/// The tensors of a batch as bits.
fn bits(b: &models::Batch) -> Vec<(String, Vec<u32>)> {
    b.tensors
        .iter()
        .map(|(k, t)| {
            let v = t.flatten_all().unwrap();
            let v = match v.dtype() {
                candle_core::DType::F32 => v
                    .to_vec1::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect(),
                _ => v.to_vec1::<u32>().unwrap(),
            };
            (k.to_string(), v)
        })
        .collect()
}

#[test]
fn feed_batches_depend_only_on_the_step() {
    let (c, fields) = config(2);
    let (a, b) = (
        InProcessFeed::new(c.clone(), &fields).unwrap(),
        InProcessFeed::new(c, &fields).unwrap(),
    );
    let cpu = &Device::Cpu;
    let later = a.batch(5, 6, cpu).unwrap();
    assert_eq!(bits(&b.batch(5, 6, cpu).unwrap()), bits(&later));
    assert_ne!(bits(&a.batch(4, 6, cpu).unwrap()), bits(&later));
    assert_eq!(bits(&a.batch(5, 6, cpu).unwrap()), bits(&later));
    let names: Vec<&str> = later.tensors.keys().copied().collect();
    let want: Vec<&str> = fields.iter().map(|f| f.name).collect();
    assert_eq!(names.len(), want.len());
    assert!(want.iter().all(|n| names.contains(n)), "{names:?} {want:?}");
    assert_eq!(a.stats().timings().len(), 3);
}

#[test]
fn feed_producers_give_bit_identical_batches() {
    let (c, fields) = config(2);
    let local = InProcessFeed::new(c.clone(), &fields).unwrap();
    let remote = ProducerFeed::spawn(&launcher(), c, &fields, 2, options()).unwrap();
    let pids = remote.pids();
    assert_eq!(pids.len(), 2);
    let cpu = &Device::Cpu;
    // In order, then a jump back (a resumed run) and a repeat (a gradient check).
    for step in [0, 1, 2, 3, 4, 1, 1] {
        let (x, y) = (
            local.prepared(step, 6).unwrap(),
            remote.prepared(step, 6).unwrap(),
        );
        assert!(x.same_tensors(&y), "step {step}");
        assert_eq!(
            bits(&local.batch(step, 6, cpu).unwrap()),
            bits(&remote.batch(step, 6, cpu).unwrap())
        );
    }
    drop(remote);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "producer {pid} outlived its feed"
        );
    }
}

#[test]
fn feed_a_dead_producer_fails_the_step_naming_it() {
    let (c, fields) = config(1);
    let feed = ProducerFeed::spawn(&launcher(), c, &fields, 2, options()).unwrap();
    feed.prepared(0, 4).unwrap();
    let victim = feed.pids()[1];
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t0 = std::time::Instant::now();
    // Step 1 may already be in the buffer; step 3 is worker 1's and cannot come.
    let e = (1..=3)
        .map(|s| feed.prepared(s, 4))
        .find_map(Result::err)
        .expect("worker 1 is dead");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert!(e.contains("producer 1"), "{e}");
    assert!(e.contains("signal 9"), "{e}");
}

#[test]
fn feed_a_producer_that_cannot_start_is_reported() {
    let (c, fields) = config(1);
    let bad = Launcher {
        program: "/bin/false".into(),
        args: vec![],
    };
    let e = ProducerFeed::spawn(&bad, c, &fields, 1, options()).unwrap_err();
    assert!(e.to_string().contains("producer 0"), "{e}");
}

#[test]
fn feed_reorder_is_a_permutation_that_balances_skewed_costs() {
    let mut rng = SplitMix64::new(11);
    for case in 0..200 {
        let n = 1 + rng.below(40) as usize;
        let dp = 1 + rng.below(8) as usize;
        // Skewed: most samples one image, a few many.
        let costs: Vec<f64> = (0..n)
            .map(|_| {
                let images = if rng.chance(0.2) {
                    1 + rng.below(16)
                } else {
                    1
                };
                images as f64 * 4096.0 + rng.below(16) as f64
            })
            .collect();
        let order = reorder(&costs, dp);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "case {case}");
        let max = |o: &[usize]| shard_loads(&costs, o, dp).into_iter().fold(0.0, f64::max);
        let identity: Vec<usize> = (0..n).collect();
        assert!(max(&order) <= max(&identity), "case {case}");
    }
    // A clearly skewed batch: big samples first, as drawn.
    let costs = [9.0, 8.0, 7.0, 6.0, 1.0, 1.0, 1.0, 1.0];
    let order = reorder(&costs, 2);
    let identity: Vec<usize> = (0..8).collect();
    assert_eq!(shard_loads(&costs, &identity, 2), vec![30.0, 4.0]);
    assert_eq!(shard_loads(&costs, &order, 2), vec![17.0, 17.0]);
}

#[test]
fn feed_config_refuses_models_and_counts_it_cannot_feed() {
    let omni = models::build("omni-tiny", 0, &Device::Cpu).unwrap();
    let e = FeedConfig::for_fields(&omni.data.fields(), 0, 1, 64, 1).unwrap_err();
    assert!(e.is_bad_input());
    assert!(e.to_string().contains("`audio`"), "{e}");
    let (c, fields) = config(1);
    for (images, px, says) in [
        (0, 64, "--images-per-sample"),
        (65, 64, "--images-per-sample"),
        (1, 4, "--image-resolution"),
        (1, 5000, "--image-resolution"),
    ] {
        let e = FeedConfig::for_fields(&fields, 0, images, px, 1).unwrap_err();
        assert!(e.to_string().starts_with(says), "{e}");
    }
    let e = ProducerFeed::spawn(&launcher(), c, &fields, 0, options()).unwrap_err();
    assert!(e.to_string().starts_with("--producers"), "{e}");
}
