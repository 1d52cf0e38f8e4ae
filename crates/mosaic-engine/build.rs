//! Compiles the engine's own CUDA kernels (`kernels/*.cu`) for the GPU build, which
//! `scripts/cuda-cargo` makes: it sets `--cfg mosaic_gpu`, puts CUDA 13.0's nvcc on PATH and
//! names the compute capability in CUDA_COMPUTE_CAP. Every other build compiles nothing.
//!
//! Each file becomes a fatbin holding the machine code for that capability (so ptxas checks
//! every kernel here, at build time, and a GPU loads it without compiling) and its PTX (which
//! the driver compiles for a newer GPU).

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The kernels, each compiled to `$OUT_DIR/<name>.fatbin`.
const KERNELS: &[&str] = &["adamw", "attention", "elementwise"];

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if env::var_os("CARGO_CFG_MOSAIC_GPU").is_none() {
        return;
    }
    let cap = env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in KERNELS {
        let source = format!("kernels/{name}.cu");
        let fatbin = out.join(format!("{name}.fatbin"));
        let status = Command::new(&nvcc)
            .args(["--fatbin", "-O3", "-gencode"])
            .arg(format!("arch=compute_{cap},code=[sm_{cap},compute_{cap}]"))
            .arg("-o")
            .arg(&fatbin)
            .arg(&source)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("{nvcc} could not compile {source} ({s})"),
            Err(e) => panic!(
                "could not run {nvcc} to compile {source} (the GPU build runs through \
                 scripts/cuda-cargo, which puts nvcc on PATH): {e}"
            ),
        }
    }
}
