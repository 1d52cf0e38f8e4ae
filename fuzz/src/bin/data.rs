//! AFL++ target: a `--data` safetensors file of `mosaic train` (see `mosaic_fuzz::data_file`).

fn main() {
    let fields = mosaic_fuzz::trainer().model().data.fields();
    let path = mosaic_fuzz::scratch_file("data.safetensors");
    afl::fuzz!(|data: &[u8]| {
        let _ = mosaic_fuzz::data_file(&fields, &path, data);
    });
}
