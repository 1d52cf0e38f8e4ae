//! A producer process's loop (`mosaic train produce --socket PATH --worker I`).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use super::config::FeedConfig;
use super::prep::Preprocessor;
use super::wire::{
    encode_batch, read_frame, write_frame, Fields, BATCH, CONFIG, FAILED, HELLO, READY, REQUEST,
};

/// Runs producer `worker`: connects to the trainer's socket at `socket`, says who it is,
/// receives the [`FeedConfig`], makes the raw data, then prepares every step it is asked for,
/// in order, and sends it back. Returns `Ok` when the trainer closes the connection (or is
/// gone mid-send); an error when the socket cannot be reached, the trainer speaks nonsense or
/// preparing fails (the trainer is told why first).
pub fn produce(socket: &Path, worker: u32) -> io::Result<()> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot connect to {}: {e}", socket.display()),
        )
    })?;
    let mut hello = worker.to_le_bytes().to_vec();
    hello.extend_from_slice(&std::process::id().to_le_bytes());
    write_frame(&mut stream, HELLO, &hello)?;
    let config: FeedConfig = match read_frame(&mut stream)? {
        None => return Ok(()),
        Some((CONFIG, json)) => serde_json::from_slice(&json)
            .map_err(|e| io::Error::other(format!("a bad config from the trainer: {e}")))?,
        Some((kind, _)) => return Err(io::Error::other(format!("frame {kind}, not a config"))),
    };
    let t0 = Instant::now();
    let pre = match Preprocessor::new(config) {
        Ok(p) => p,
        Err(e) => return fail(&mut stream, e.to_string()),
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if gone(write_frame(&mut stream, READY, &ms.to_bits().to_le_bytes()))? {
        return Ok(());
    }
    let c = pre.config();
    let (h, w, l) = (
        c.image.height as usize,
        c.image.width as usize,
        c.text.len as usize,
    );
    loop {
        let (step, batch) = match read_frame(&mut stream) {
            Ok(None) => return Ok(()),
            Err(e) if closed(&e) => return Ok(()),
            Err(e) => return Err(e),
            Ok(Some((REQUEST, payload))) => {
                let mut f = Fields::new(&payload);
                let step = f.u64().map_err(io::Error::other)?;
                let batch = f.u32().map_err(io::Error::other)?;
                (step, batch as usize)
            }
            Ok(Some((kind, _))) => {
                return fail(&mut stream, format!("frame {kind}, not a request"));
            }
        };
        let prepared = match pre.prepare(step, batch) {
            Ok(p) => p,
            Err(e) => return fail(&mut stream, format!("step {step}: {e}")),
        };
        if gone(write_frame(
            &mut stream,
            BATCH,
            &encode_batch(&prepared, h, w, l),
        ))? {
            return Ok(());
        }
    }
}

/// Tells the trainer why this producer stops, and returns that as the error.
fn fail(stream: &mut UnixStream, message: String) -> io::Result<()> {
    let _ = write_frame(stream, FAILED, message.as_bytes());
    Err(io::Error::other(message))
}

/// An error meaning the trainer has closed the connection.
fn closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
    )
}

/// `Ok(true)` when a write failed because the trainer is gone, the error otherwise.
fn gone(r: io::Result<()>) -> io::Result<bool> {
    match r {
        Ok(()) => Ok(false),
        Err(e) if closed(&e) => Ok(true),
        Err(e) => Err(e),
    }
}
