//! Reading users' files without trusting them: only regular files, and text files only up to
//! a size, so that `/dev/zero`, a FIFO or a runaway file is refused at once instead of filling
//! memory.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The largest text file (profiles, colocations, plans) the tools read: 256 MiB, three orders
/// of magnitude above a 64-module profile sampled at every dp up to 65,536 GPUs.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// Checks that `path` is a regular file (not a directory, device, FIFO or socket) and returns
/// its length in bytes.
pub fn regular_file(path: &Path) -> Result<u64, Error> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(Error::new(ErrorKind::InvalidInput, format!("is {kind}")));
    }
    Ok(meta.len())
}

/// Reads a regular file of at most `max_bytes` bytes as UTF-8 text.
pub fn read_text(path: &Path, max_bytes: u64) -> Result<String, Error> {
    let too_big = |len: u64| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{len} bytes or more, above the limit of {max_bytes} bytes"),
        )
    };
    let len = regular_file(path)?;
    if len > max_bytes {
        return Err(too_big(len));
    }
    let mut text = String::with_capacity(len as usize);
    // A file that grows while read stops one byte past the limit.
    std::fs::File::open(path)?
        .take(max_bytes + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > max_bytes {
        return Err(too_big(text.len() as u64));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_directories_and_big_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("mosaic-kit-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small.json");
        std::fs::write(&small, "{}").unwrap();
        assert_eq!(read_text(&small, 2).unwrap(), "{}");
        assert!(read_text(&small, 1)
            .unwrap_err()
            .to_string()
            .contains("limit of 1 bytes"));
        assert!(read_text(&dir, 10)
            .unwrap_err()
            .to_string()
            .contains("directory"));
        let zero = read_text(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(zero.to_string().contains("not a regular file"), "{zero}");
        assert_eq!(
            read_text(&dir.join("missing"), 10).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
