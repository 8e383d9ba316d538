//! The batch encoding that carries records across the Wasm boundary (see `wit/topology.wit`).
//!
//! One contiguous little-endian buffer per batch in each direction: the host writes inputs,
//! the guest decodes them in place (no allocation per record or field) and writes what it
//! emits into one output buffer that the host decodes the same way. The host and the guest
//! SDK share this module, so the two ends cannot drift apart.

use std::fmt;

/// A length that means "none" (a null key, value or header value).
pub const NONE: u32 = u32::MAX;

/// An emitted timestamp that means "the timestamp of the input being processed".
pub const INHERIT_TIMESTAMP: i64 = i64::MIN;

/// A buffer that does not follow the encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    /// Byte position where decoding failed.
    pub position: usize,
    /// What was expected there.
    pub expected: &'static str,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed record buffer at byte {}: expected {}",
            self.position, self.expected
        )
    }
}

impl std::error::Error for WireError {}

/// A record header as it lies in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub name: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// The headers of one record, decoded lazily.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    count: u32,
    raw: &'a [u8],
}

impl<'a> Headers<'a> {
    /// No headers.
    pub const EMPTY: Headers<'static> = Headers { count: 0, raw: &[] };

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn iter(&self) -> HeaderIter<'a> {
        HeaderIter {
            left: self.count,
            reader: Reader::new(self.raw),
        }
    }

    /// The value of the first header called `name`.
    pub fn get(&self, name: &str) -> Option<Option<&'a [u8]>> {
        self.iter().find(|h| h.name == name.as_bytes()).map(|h| h.value)
    }
}

impl fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterates over [`Headers`]; the buffer was validated when the record was decoded.
pub struct HeaderIter<'a> {
    left: u32,
    reader: Reader<'a>,
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = Header<'a>;

    fn next(&mut self) -> Option<Header<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let name = self.reader.bytes().ok()?;
        let value = self.reader.opt_bytes().ok()?;
        Some(Header { name, value })
    }
}

/// One input record, borrowed from a batch buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp: i64,
    pub source: u32,
    pub partition: i32,
    pub offset: i64,
    pub headers: Headers<'a>,
}

/// One emitted record, borrowed from an output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted<'a> {
    pub sink: u32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// [`INHERIT_TIMESTAMP`] when the guest left it to the input's.
    pub timestamp: i64,
    pub headers: Headers<'a>,
}

/// A cursor over a buffer.
#[derive(Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    #[inline]
    fn take(&mut self, n: usize, expected: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len());
        match end {
            Some(end) => {
                let out = &self.buf[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            None => Err(WireError {
                position: self.pos,
                expected,
            }),
        }
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4, "a u32")?.try_into().unwrap()))
    }

    #[inline]
    pub fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.take(4, "an s32")?.try_into().unwrap()))
    }

    #[inline]
    pub fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.take(8, "an s64")?.try_into().unwrap()))
    }

    #[inline]
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.u32()?;
        if len == NONE {
            return Err(WireError {
                position: self.pos - 4,
                expected: "a length (not none)",
            });
        }
        self.take(len as usize, "as many bytes as the length says")
    }

    #[inline]
    pub fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, WireError> {
        match self.u32()? {
            NONE => Ok(None),
            len => self.take(len as usize, "as many bytes as the length says").map(Some),
        }
    }

    #[inline]
    fn headers(&mut self) -> Result<Headers<'a>, WireError> {
        let count = self.u32()?;
        check_count(
            self,
            count,
            MIN_HEADER_BYTES,
            "a header count that the bytes after it can hold",
        )?;
        let start = self.pos;
        for _ in 0..count {
            self.bytes()?;
            self.opt_bytes()?;
        }
        Ok(Headers {
            count,
            raw: &self.buf[start..self.pos],
        })
    }

    pub fn is_at_end(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// A record kind of the wire format: how one decodes, and the fewest bytes it takes.
pub trait Decode<'a>: Sized {
    /// The fewest bytes one record takes (a count is checked against it).
    const MIN_BYTES: usize;
    fn decode(reader: &mut Reader<'a>) -> Result<Self, WireError>;
}

/// Iterates over the records of a buffer, validating as it goes.
pub struct Records<'a, T> {
    reader: Reader<'a>,
    left: u32,
    kind: std::marker::PhantomData<T>,
}

impl<'a, T> Records<'a, T> {
    /// Records still to come.
    pub fn remaining(&self) -> u32 {
        self.left
    }
}

impl<'a, T: Decode<'a>> Iterator for Records<'a, T> {
    type Item = Result<T, WireError>;

    // Decoding is static (no function pointer), so it inlines into the caller's loop.
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return if self.reader.is_at_end() {
                None
            } else {
                self.reader.pos = self.reader.buf.len();
                Some(Err(WireError {
                    position: self.reader.pos,
                    expected: "the end of the buffer",
                }))
            };
        }
        self.left -= 1;
        let item = T::decode(&mut self.reader);
        if item.is_err() {
            self.left = 0;
            self.reader.pos = self.reader.buf.len();
        }
        Some(item)
    }
}

/// The fewest bytes an input record takes (both fields none, no headers).
pub const MIN_INPUT_BYTES: usize = 4 + 4 + 8 + 4 + 4 + 8 + 4;
/// The fewest bytes an emitted record takes.
pub const MIN_EMITTED_BYTES: usize = 4 + 4 + 4 + 8 + 4;
/// The fewest bytes a header takes (empty name, no value).
const MIN_HEADER_BYTES: usize = 4 + 4;

/// A count read from a buffer, checked against the bytes left: `count` items of at least
/// `each` bytes must fit, or the buffer lies about its size.
fn check_count(reader: &Reader<'_>, count: u32, each: usize, expected: &'static str) -> Result<(), WireError> {
    let left = reader.buf.len() - reader.pos;
    if (count as usize).saturating_mul(each) > left {
        return Err(WireError {
            position: reader.pos - 4,
            expected,
        });
    }
    Ok(())
}

fn records<'a, T: Decode<'a>>(buf: &'a [u8]) -> Result<Records<'a, T>, WireError> {
    let mut reader = Reader::new(buf);
    let left = reader.u32()?;
    check_count(
        &reader,
        left,
        T::MIN_BYTES,
        "a record count that the bytes after it can hold",
    )?;
    Ok(Records {
        reader,
        left,
        kind: std::marker::PhantomData,
    })
}

impl<'a> Decode<'a> for Input<'a> {
    const MIN_BYTES: usize = MIN_INPUT_BYTES;
    #[inline]
    fn decode(r: &mut Reader<'a>) -> Result<Self, WireError> {
        Ok(Input {
            key: r.opt_bytes()?,
            value: r.opt_bytes()?,
            timestamp: r.i64()?,
            source: r.u32()?,
            partition: r.i32()?,
            offset: r.i64()?,
            headers: r.headers()?,
        })
    }
}

impl<'a> Decode<'a> for Emitted<'a> {
    const MIN_BYTES: usize = MIN_EMITTED_BYTES;
    #[inline]
    fn decode(r: &mut Reader<'a>) -> Result<Self, WireError> {
        Ok(Emitted {
            sink: r.u32()?,
            key: r.opt_bytes()?,
            value: r.opt_bytes()?,
            timestamp: r.i64()?,
            headers: r.headers()?,
        })
    }
}

/// Decodes a batch of inputs (host → guest).
pub fn inputs(buf: &[u8]) -> Result<Records<'_, Input<'_>>, WireError> {
    records(buf)
}

/// Decodes emitted records (guest → host).
pub fn emitted(buf: &[u8]) -> Result<Records<'_, Emitted<'_>>, WireError> {
    records(buf)
}

/// Writes a buffer of records; reusable across batches.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
    count: u32,
}

impl Writer {
    pub fn new() -> Self {
        Writer {
            buf: 0u32.to_le_bytes().to_vec(),
            count: 0,
        }
    }

    /// Starts a new buffer, keeping the allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        self.count = 0;
    }

    pub fn len(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes written so far.
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The finished buffer (valid at any time).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The finished buffer when it holds records (else an empty, unallocated one); the
    /// writer starts over empty.
    pub fn take_if_any(&mut self) -> Vec<u8> {
        if self.count == 0 {
            Vec::new()
        } else {
            self.take()
        }
    }

    /// The finished buffer, taken out; the writer starts over empty.
    pub fn take(&mut self) -> Vec<u8> {
        // The next buffer starts as large as this one: a batch is usually like the last,
        // and growing from empty again would copy it over and over.
        let next = Vec::with_capacity(self.buf.capacity());
        let out = std::mem::replace(&mut self.buf, next);
        self.clear();
        out
    }

    /// Appends one input record; the arguments follow the wire layout field by field.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn push_input<'h>(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
        source: u32,
        partition: i32,
        offset: i64,
        headers: impl ExactSizeIterator<Item = Header<'h>>,
    ) {
        self.opt_bytes(key);
        self.opt_bytes(value);
        self.buf.extend_from_slice(&timestamp.to_le_bytes());
        self.buf.extend_from_slice(&source.to_le_bytes());
        self.buf.extend_from_slice(&partition.to_le_bytes());
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.headers(headers);
        self.bump();
    }

    #[inline]
    pub fn push_emitted<'h>(
        &mut self,
        sink: u32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
        headers: impl ExactSizeIterator<Item = Header<'h>>,
    ) {
        self.buf.extend_from_slice(&sink.to_le_bytes());
        self.opt_bytes(key);
        self.opt_bytes(value);
        self.buf.extend_from_slice(&timestamp.to_le_bytes());
        self.headers(headers);
        self.bump();
    }

    /// Starts an emitted record whose key and value are encoded in place by the caller:
    /// write the key with [`Writer::begin_field`] / [`Writer::end_field`] (or
    /// [`Writer::none_field`]), then the value the same way, then call
    /// [`Writer::finish_emitted`].
    pub fn begin_emitted(&mut self, sink: u32) {
        self.buf.extend_from_slice(&sink.to_le_bytes());
    }

    /// Reserves a length for a field and returns where it starts.
    pub fn begin_field(&mut self) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        at
    }

    /// The buffer to encode a field into, between `begin_field` and `end_field`.
    pub fn field_buffer(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Fills in the length of the field started at `at`.
    pub fn end_field(&mut self, at: usize) {
        let len = (self.buf.len() - at - 4) as u32;
        self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }

    /// Writes a null field.
    pub fn none_field(&mut self) {
        self.buf.extend_from_slice(&NONE.to_le_bytes());
    }

    /// Drops everything written since `at` (an encoding that failed half-way).
    pub fn truncate(&mut self, at: usize) {
        self.buf.truncate(at);
    }

    pub fn finish_emitted<'h>(&mut self, timestamp: i64, headers: impl ExactSizeIterator<Item = Header<'h>>) {
        self.buf.extend_from_slice(&timestamp.to_le_bytes());
        self.headers(headers);
        self.bump();
    }

    #[inline]
    fn bump(&mut self) {
        self.count += 1;
        self.buf[..4].copy_from_slice(&self.count.to_le_bytes());
    }

    #[inline]
    fn opt_bytes(&mut self, bytes: Option<&[u8]>) {
        match bytes {
            Some(b) => {
                self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
                self.buf.extend_from_slice(b);
            }
            None => self.buf.extend_from_slice(&NONE.to_le_bytes()),
        }
    }

    #[inline]
    fn headers<'h>(&mut self, headers: impl ExactSizeIterator<Item = Header<'h>>) {
        self.buf.extend_from_slice(&(headers.len() as u32).to_le_bytes());
        for h in headers {
            self.opt_bytes(Some(h.name));
            self.opt_bytes(h.value);
        }
    }
}

#[cfg(test)]
mod tests;
