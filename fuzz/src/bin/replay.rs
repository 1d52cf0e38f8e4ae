//! Runs inputs through a target without AFL++ and says what each did: `replay TARGET FILE...`
//! prints `ok` or the error per file (a crash shows as the panic itself). For triage of
//! `out/TARGET/default/crashes/*`, and to check that every seed loads: `replay --seeds TARGET
//! FILE...` exits 1 if one does not. Not a fuzz target.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let seeds = args.first().is_some_and(|a| a == "--seeds");
    if seeds {
        args.remove(0);
    }
    let Some((target, files)) = args.split_first() else {
        eprintln!("usage: replay [--seeds] TARGET FILE...");
        return ExitCode::from(2);
    };
    let mut run: Box<dyn FnMut(&[u8]) -> mosaic_fuzz::Outcome> = match target.as_str() {
        "profiles" => Box::new(mosaic_fuzz::profiles),
        "colocations" => Box::new(mosaic_fuzz::colocations),
        "plans" => Box::new(mosaic_fuzz::plans),
        "calibration" => Box::new(mosaic_fuzz::calibration),
        "samples" => Box::new(mosaic_fuzz::samples),
        "checkpoint" => {
            let mut t = mosaic_fuzz::trainer();
            let path = mosaic_fuzz::scratch_file("checkpoint.safetensors");
            Box::new(move |d| mosaic_fuzz::checkpoint(&mut t, &path, d))
        }
        "data" => {
            let fields = mosaic_fuzz::trainer().model().data.fields();
            let path = mosaic_fuzz::scratch_file("data.safetensors");
            Box::new(move |d| mosaic_fuzz::data_file(&fields, &path, d))
        }
        other => {
            eprintln!("replay: unknown target {other}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for f in files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let t0 = std::time::Instant::now();
        let outcome = run(&data);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match outcome {
            Ok(()) => println!("{f}: ok ({ms:.2} ms)"),
            Err(e) => {
                failed = true;
                println!("{f}: error ({ms:.2} ms): {e}");
            }
        }
    }
    for name in ["checkpoint.safetensors", "data.safetensors"] {
        let _ = std::fs::remove_file(mosaic_fuzz::scratch_file(name));
    }
    if seeds && failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
