//! AFL++ target: a `mosaic fit --colocations` file (see `mosaic_fuzz::colocations`). Clip's
//! performance model is built once, before the fork server starts.

fn main() {
    mosaic_fuzz::clip_h100x8();
    afl::fuzz!(|data: &[u8]| {
        let _ = mosaic_fuzz::colocations(data);
    });
}
