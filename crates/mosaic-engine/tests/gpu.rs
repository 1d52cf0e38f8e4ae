//! The GPU paths as far as this machine can see them: where there is no GPU build or no GPU,
//! training on CUDA is refused saying why and the GPU check skips saying why; where there are
//! both, the whole GPU check (`mosaic check gpu`) must pass.

use candle_core::Device;
use mosaic_engine::measure::{check_gpu, Outcome};
use mosaic_engine::models::{self, nn::to_f32s, Recipe};
use mosaic_engine::runtime::slot::cuda::driver_unavailable;
use mosaic_engine::{Compute, EngineError, Schedule, TrainConfig, Trainer};

#[test]
fn training_on_cuda_needs_the_gpu_build_and_a_gpu() {
    let model = models::build("clip-tiny", 0, &Device::Cpu).unwrap();
    let schedule = Schedule::sequential(&model, 1);
    let config = TrainConfig {
        compute: Compute::Cuda(0),
        ..TrainConfig::default()
    };
    match Trainer::new(model, schedule, config) {
        Err(EngineError::BadSetting { setting, message }) if !cfg!(mosaic_gpu) => {
            assert_eq!(setting, "--device");
            assert!(message.contains("scripts/cuda-cargo"), "{message}");
        }
        Err(e @ EngineError::Cuda { .. }) if driver_unavailable().is_some() => {
            eprintln!("skipped: no CUDA driver/GPU ({e})");
        }
        Ok(_) if cfg!(mosaic_gpu) && driver_unavailable().is_none() => {}
        Ok(_) => panic!("trained on CUDA in a build or on a machine that cannot"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn the_gpu_check_passes_or_skips_saying_why() {
    let checks = check_gpu(0, &mut |c| {
        eprintln!("{:?} {}: {}", c.outcome, c.name, c.figure)
    });
    if let Some(why) = driver_unavailable() {
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].outcome, Outcome::Skip);
        assert_eq!(checks[0].figure, why);
        eprintln!("skipped: {why}");
        return;
    }
    assert!(checks.iter().all(|c| c.outcome != Outcome::Fail));
}

/// What training on a GPU relies on to move a model onto its slots: a model placed module by
/// module has the same parameters, in the same order, as one built on one device.
#[test]
fn a_placed_model_has_the_built_models_parameters() {
    for name in ["clip-tiny", "omni-tiny"] {
        let built = models::build(name, 3, &Device::Cpu).unwrap();
        let placed = models::build_placed(&Recipe::new(name, 3), &|_| Device::Cpu).unwrap();
        assert_eq!(built.layout, placed.layout);
        for (a, b) in built.modules.iter().zip(&placed.modules) {
            for ((na, va), (nb, vb)) in a.params.iter().zip(b.params.iter()) {
                assert_eq!(na, nb);
                assert_eq!(
                    to_f32s(va.as_tensor()).unwrap(),
                    to_f32s(vb.as_tensor()).unwrap()
                );
            }
        }
    }
}
