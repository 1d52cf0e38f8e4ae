//! Writes the engine targets' seed inputs with the engine's own writers, the functions
//! `mosaic data write` and `mosaic train --checkpoint-dir` call: `make_seeds DIR` writes
//! `DIR/data.safetensors` (clip-tiny, one step of 2 samples) and `DIR/checkpoint.safetensors`
//! (clip-tiny, seed 0, batch 2, after one step). Not a fuzz target.

use mosaic_engine::runtime::checkpoint;

fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: make_seeds DIR"));
    std::fs::create_dir_all(&dir).expect("DIR");
    let mut t = mosaic_fuzz::trainer();
    mosaic_engine::models::data::write_batches(
        &*t.model().data,
        1,
        mosaic_fuzz::ENGINE_BATCH,
        &dir.join("data.safetensors"),
    )
    .expect("data written");
    t.step().expect("one step");
    let path = checkpoint::save(&t, &dir).expect("checkpoint written");
    println!(
        "wrote {} and {}",
        dir.join("data.safetensors").display(),
        path.display()
    );
}
