//! The feed's wire format: frames of a kind byte, a little-endian u32 payload length and the
//! payload. A batch's payload is its step (u64), the producer's preparation time (f64 ms) and
//! its tensors, each a name (u8 length, UTF-8), a dtype (u8: 0 f32, 1 u32, 2 f64), a rank (u8),
//! the dims (u32 each) and the values (little-endian).

use std::io::{self, Read, Write};

use super::prep::Prepared;

/// Producer → trainer, first: worker index (u32) and process id (u32).
pub const HELLO: u8 = 1;
/// Trainer → producer: the [`super::FeedConfig`] as JSON.
pub const CONFIG: u8 = 2;
/// Producer → trainer: the raw data is made (f64 ms it took).
pub const READY: u8 = 3;
/// Trainer → producer: prepare step (u64) of batch (u32) samples.
pub const REQUEST: u8 = 4;
/// Producer → trainer: a prepared batch.
pub const BATCH: u8 = 5;
/// Producer → trainer: it failed (UTF-8 message) and exits.
pub const FAILED: u8 = 6;

/// The largest payload read: a garbled length must not allocate gigabytes.
const MAX_PAYLOAD: u32 = 1 << 30;

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::other(format!("a frame of {} bytes", payload.len())))?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame: `None` when the peer closed the connection between frames.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_PAYLOAD {
        return Err(io::Error::other(format!("a frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// A reader of a payload's fields that fails instead of panicking on a short payload.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// Reads `payload` from its start.
    pub fn new(payload: &'a [u8]) -> Self {
        Fields { rest: payload }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!(
                "a truncated frame ({} bytes left, {n} wanted)",
                self.rest.len()
            ));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    /// The next little-endian u32.
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// The next little-endian f64.
    pub fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_bits(self.u64()?))
    }
}

/// Tensor dtypes on the wire.
const F32: u8 = 0;
const U32: u8 = 1;
const F64: u8 = 2;

/// The names a batch's tensors travel under (the trainer maps them to the model's fields).
const NAMES: [&str; 5] = ["image", "text", "text_len", "order", "cost"];

fn put_tensor(out: &mut Vec<u8>, name: &str, dtype: u8, dims: &[usize], values: &[u8]) {
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.push(dtype);
    out.push(dims.len() as u8);
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_le_bytes());
    }
    out.extend_from_slice(values);
}

/// A prepared batch as a [`BATCH`] payload (`height × width` pixels and `len` tokens a sample).
pub fn encode_batch(p: &Prepared, height: usize, width: usize, len: usize) -> Vec<u8> {
    let b = p.batch;
    let mut out = Vec::with_capacity(32 + 4 * (p.image.len() + p.text.len()) + 16 * b);
    out.extend_from_slice(&p.step.to_le_bytes());
    out.extend_from_slice(&p.prep_ms.to_bits().to_le_bytes());
    out.push(NAMES.len() as u8);
    let f32s: Vec<u8> = p.image.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_tensor(&mut out, NAMES[0], F32, &[b, height, width], &f32s);
    let u32s = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    put_tensor(&mut out, NAMES[1], U32, &[b, len], &u32s(&p.text));
    put_tensor(&mut out, NAMES[2], U32, &[b], &u32s(&p.text_len));
    put_tensor(&mut out, NAMES[3], U32, &[b], &u32s(&p.order));
    let f64s: Vec<u8> = p.cost.iter().flat_map(|x| x.to_le_bytes()).collect();
    put_tensor(&mut out, NAMES[4], F64, &[b], &f64s);
    out
}

/// A [`BATCH`] payload back into a prepared batch, checking every tensor's name, dtype and
/// shape against `height × width` pixels and `len` tokens a sample.
pub fn decode_batch(
    payload: &[u8],
    height: usize,
    width: usize,
    len: usize,
) -> Result<Prepared, String> {
    let mut f = Fields::new(payload);
    let step = f.u64()?;
    let prep_ms = f.f64()?;
    if usize::from(f.u8()?) != NAMES.len() {
        return Err("a batch frame with the wrong number of tensors".into());
    }
    let mut batch = None;
    let mut raw: Vec<Vec<u8>> = Vec::new();
    for (i, want) in NAMES.iter().enumerate() {
        let n = usize::from(f.u8()?);
        let name = f.take(n)?;
        let dtype = f.u8()?;
        let rank = usize::from(f.u8()?);
        let dims = (0..rank)
            .map(|_| f.u32().map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        let b = *batch.get_or_insert(dims.first().copied().unwrap_or(0));
        let (shape, kind): (Vec<usize>, u8) = match i {
            0 => (vec![b, height, width], F32),
            1 => (vec![b, len], U32),
            4 => (vec![b], F64),
            _ => (vec![b], U32),
        };
        if name != want.as_bytes() || dtype != kind || dims != shape {
            return Err(format!(
                "tensor {i} is `{}` of dtype {dtype} and shape {dims:?}; expected `{want}` of \
                 dtype {kind} and shape {shape:?}",
                String::from_utf8_lossy(name)
            ));
        }
        let bytes = shape.iter().product::<usize>() * if kind == F64 { 8 } else { 4 };
        raw.push(f.take(bytes)?.to_vec());
    }
    if !f.rest.is_empty() {
        return Err(format!("{} stray bytes after a batch", f.rest.len()));
    }
    let u32s = |v: &[u8]| -> Vec<u32> {
        v.chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    };
    Ok(Prepared {
        step,
        batch: batch.unwrap_or(0),
        image: raw[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        text: u32s(&raw[1]),
        text_len: u32s(&raw[2]),
        order: u32s(&raw[3]),
        cost: raw[4]
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        prep_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_and_garbage_is_refused() {
        let p = Prepared {
            step: 7,
            batch: 2,
            image: vec![0.5, -1.25, 3.0, f32::MIN_POSITIVE, 0.0, -0.0, 1e-30, 2.0],
            text: vec![1, 2, 63, 4, 5, 63],
            text_len: vec![3, 3],
            order: vec![1, 0],
            cost: vec![10.5, 3.0],
            prep_ms: 1.5,
        };
        let bytes = encode_batch(&p, 2, 2, 3);
        assert_eq!(decode_batch(&bytes, 2, 2, 3).unwrap(), p);
        assert!(decode_batch(&bytes, 2, 2, 4).is_err());
        assert!(decode_batch(&bytes[..bytes.len() - 1], 2, 2, 3).is_err());
        let mut frame = Vec::new();
        write_frame(&mut frame, BATCH, &bytes).unwrap();
        let mut r = &frame[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some((BATCH, bytes)));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        assert!(read_frame(&mut &frame[..3]).is_err());
    }
}
