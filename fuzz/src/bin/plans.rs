//! AFL++ target: a `mosaic` input file of this format (see `mosaic_fuzz::plans`).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let _ = mosaic_fuzz::plans(data);
    });
}
