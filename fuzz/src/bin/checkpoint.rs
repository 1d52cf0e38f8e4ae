//! AFL++ target: a checkpoint that `mosaic train --checkpoint-dir` resumes from (see
//! `mosaic_fuzz::checkpoint`). The trainer is built once, before the fork server starts.

use std::panic::AssertUnwindSafe;

fn main() {
    let mut trainer = AssertUnwindSafe(mosaic_fuzz::trainer());
    let path = mosaic_fuzz::scratch_file("checkpoint.safetensors");
    afl::fuzz!(|data: &[u8]| {
        let t: &mut mosaic_engine::Trainer = &mut trainer;
        let _ = mosaic_fuzz::checkpoint(t, &path, data);
    });
}
