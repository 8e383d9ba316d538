//! Running a [`Plan`] over one record's bytes: checked as the writer's schema says they
//! are, and written as the reader's schema wants them (or handed over as they are when the
//! two read alike).
//!
//! The bytes are a tenant's: a length or count is never trusted beyond the bytes left, a
//! block of items that take no bytes is bounded by a count, nesting by a depth, the items of
//! one record by a total, and what a record grows to (defaults added to each of many
//! items) by a size.

use super::default::write_long;
use super::plan::{Node, Plan};

/// What one record may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes the record may take in the reader's schema.
    pub max_out: usize,
    /// Nesting (records, arrays, maps, unions within each other).
    pub max_depth: u32,
    /// Items of arrays and maps, all of them together.
    pub max_items: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_out: 16 << 20,
            max_depth: 100,
            max_items: 1 << 24,
        }
    }
}

/// Why a record does not read: where in it (field path, byte) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    /// Field names and `[index]`/`{key}` steps, outermost first once complete.
    path: Vec<String>,
    at: usize,
    message: String,
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.path.is_empty() {
            let mut path = String::new();
            for step in self.path.iter().rev() {
                if !path.is_empty() && !step.starts_with('[') && !step.starts_with('{') {
                    path.push('.');
                }
                path.push_str(step);
            }
            write!(f, "field {path}: ")?;
        }
        write!(f, "{} (at byte {})", self.message, self.at)
    }
}

impl std::error::Error for RunError {}

impl RunError {
    fn within(mut self: Box<Self>, step: impl Into<String>) -> Box<RunError> {
        self.path.push(step.into());
        self
    }
}

/// Boxed: the error is rare and large, and a plan's every step returns a result (a pointer
/// on the way back, not 56 bytes).
type Result<T> = std::result::Result<T, Box<RunError>>;

struct In<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    #[cold]
    fn fail<T>(&self, message: impl Into<String>) -> Result<T> {
        Err(Box::new(RunError {
            path: Vec::new(),
            at: self.at,
            message: message.into(),
        }))
    }

    #[inline]
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.left() {
            return self.fail(format!("{n} bytes needed, {} left", self.left()));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    #[inline]
    fn long(&mut self) -> Result<i64> {
        // One byte: the common case for lengths, counts, indexes and small numbers.
        if let Some(&byte) = self.bytes.get(self.at) {
            if byte & 0x80 == 0 {
                self.at += 1;
                let v = u64::from(byte);
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        let mut value: u64 = 0;
        let start = self.at;
        for shift in (0..70).step_by(7) {
            let Some(&byte) = self.bytes.get(self.at) else {
                self.at = start;
                return self.fail("the record ends inside a number");
            };
            self.at += 1;
            if shift == 63 && byte > 1 {
                self.at = start;
                return self.fail("a number longer than a long");
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        self.at = start;
        self.fail("a number longer than a long")
    }

    fn int(&mut self) -> Result<i32> {
        let start = self.at;
        let n = self.long()?;
        i32::try_from(n).or_else(|_| {
            self.at = start;
            self.fail(format!("{n} is out of an int's range"))
        })
    }

    /// A length: not negative, and not past the bytes left.
    fn length(&mut self, what: &str) -> Result<usize> {
        let start = self.at;
        let n = self.long()?;
        if n < 0 {
            self.at = start;
            return self.fail(format!("{what} has a negative length ({n})"));
        }
        if n as u64 > self.left() as u64 {
            self.at = start;
            return self.fail(format!("{what} of {n} bytes, but {} bytes are left", self.left()));
        }
        Ok(n as usize)
    }

    fn utf8(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.length(what)?;
        let start = self.at;
        let s = self.take(n)?;
        if let Err(e) = std::str::from_utf8(s) {
            self.at = start + e.valid_up_to();
            return self.fail(format!("{what} is not UTF-8"));
        }
        Ok(s)
    }
}

/// Where a record goes: nowhere (checking it, or a field the reader skips) or bytes.
trait Out {
    const WRITES: bool;
    fn put(&mut self, bytes: &[u8]);
    fn long(&mut self, n: i64);
    fn len(&self) -> usize;
}

struct Discard;

impl Out for Discard {
    const WRITES: bool = false;
    #[inline]
    fn put(&mut self, _: &[u8]) {}
    #[inline]
    fn long(&mut self, _: i64) {}
    #[inline]
    fn len(&self) -> usize {
        0
    }
}

impl Out for Vec<u8> {
    const WRITES: bool = true;
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    #[inline]
    fn long(&mut self, n: i64) {
        write_long(n, self);
    }
    #[inline]
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

struct Run<'p> {
    plan: &'p Plan,
    limits: &'p Limits,
    items: u64,
}

impl Plan {
    /// Reads `record` (in the writer's schema): the record in the reader's schema, which is
    /// `record` itself when the two read alike (checked all the same), or what was written
    /// to `out` (cleared first).
    pub fn run<'a>(&self, record: &'a [u8], out: &'a mut Vec<u8>, limits: &Limits) -> Result<&'a [u8]> {
        let mut run = Run {
            plan: self,
            limits,
            items: 0,
        };
        let mut input = In { bytes: record, at: 0 };
        if self.is_identity() {
            run.node(self.root, &mut input, &mut Discard, 0)?;
            run.finished(&input)?;
            return Ok(record);
        }
        out.clear();
        run.node(self.root, &mut input, out, 0)?;
        run.finished(&input)?;
        Ok(&out[..])
    }

    /// Checks that `record` reads (in the writer's schema) without writing anything.
    pub fn check_bytes(&self, record: &[u8], limits: &Limits) -> Result<()> {
        let mut run = Run {
            plan: self,
            limits,
            items: 0,
        };
        let mut input = In { bytes: record, at: 0 };
        run.node(self.root, &mut input, &mut Discard, 0)?;
        run.finished(&input)
    }
}

impl Run<'_> {
    fn finished(&self, input: &In<'_>) -> Result<()> {
        if input.left() > 0 {
            return input.fail(format!("{} bytes follow the end of the value", input.left()));
        }
        Ok(())
    }

    fn grew<O: Out>(&self, out: &O, input: &In<'_>) -> Result<()> {
        if O::WRITES && out.len() > self.limits.max_out {
            return input.fail(format!(
                "the record grows past {} bytes in the reader's schema",
                self.limits.max_out
            ));
        }
        Ok(())
    }

    fn node<O: Out>(&mut self, id: usize, input: &mut In<'_>, out: &mut O, depth: u32) -> Result<()> {
        if depth > self.limits.max_depth {
            return input.fail(format!("the record is nested deeper than {}", self.limits.max_depth));
        }
        // A part both schemas read alike is checked, then copied as it came.
        if O::WRITES && self.plan.identity[id] {
            let start = input.at;
            self.node(id, input, &mut Discard, depth)?;
            out.put(&input.bytes[start..input.at]);
            return self.grew(out, input);
        }
        match &self.plan.nodes[id] {
            Node::Null => Ok(()),
            Node::Boolean => {
                let b = input.take(1)?[0];
                if b > 1 {
                    input.at -= 1;
                    return input.fail(format!("a boolean is 0 or 1, not {b}"));
                }
                out.put(&[b]);
                Ok(())
            }
            Node::Int => {
                let n = input.int()?;
                out.long(n as i64);
                Ok(())
            }
            Node::Long => {
                let n = input.long()?;
                out.long(n);
                Ok(())
            }
            Node::Float => {
                let b = input.take(4)?;
                out.put(b);
                Ok(())
            }
            Node::Double => {
                let b = input.take(8)?;
                out.put(b);
                Ok(())
            }
            Node::IntToFloat => {
                let n = input.int()?;
                out.put(&(n as f32).to_le_bytes());
                Ok(())
            }
            Node::IntToDouble => {
                let n = input.int()?;
                out.put(&(n as f64).to_le_bytes());
                Ok(())
            }
            Node::LongToFloat => {
                let n = input.long()?;
                out.put(&(n as f32).to_le_bytes());
                Ok(())
            }
            Node::LongToDouble => {
                let n = input.long()?;
                out.put(&(n as f64).to_le_bytes());
                Ok(())
            }
            Node::FloatToDouble => {
                let b = input.take(4)?;
                let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                out.put(&(x as f64).to_le_bytes());
                Ok(())
            }
            Node::Bytes => {
                let n = input.length("the bytes")?;
                let b = input.take(n)?;
                out.long(n as i64);
                out.put(b);
                Ok(())
            }
            Node::Str | Node::BytesToStr => {
                let s = input.utf8("the string")?;
                out.long(s.len() as i64);
                out.put(s);
                self.grew(out, input)
            }
            Node::Fixed(size) => {
                let b = input.take(*size)?;
                out.put(b);
                Ok(())
            }
            Node::Enum(symbols) => {
                let start = input.at;
                let i = input.int()?;
                if i < 0 || i as u32 >= *symbols {
                    input.at = start;
                    return input.fail(format!("enum index {i} is not below its {symbols} symbols"));
                }
                out.long(i as i64);
                Ok(())
            }
            Node::EnumMap {
                map,
                writer_symbols,
                reader,
            } => {
                let start = input.at;
                let i = input.int()?;
                let Some(mapped) = usize::try_from(i).ok().and_then(|i| map.get(i)) else {
                    input.at = start;
                    return input.fail(format!("enum index {i} is not below its {} symbols", map.len()));
                };
                match mapped {
                    Some(r) => {
                        out.long(*r as i64);
                        Ok(())
                    }
                    None => {
                        input.at = start;
                        input.fail(format!(
                            "the symbol {:?} is not one of the reader's enum {reader}, which has no default",
                            writer_symbols[i as usize]
                        ))
                    }
                }
            }
            Node::Array(items) => self.blocks(*items, false, input, out, depth),
            Node::Map(values) => self.blocks(*values, true, input, out, depth),
            Node::Record(r) => {
                if r.in_order {
                    let mut defaults = r.defaults.iter().peekable();
                    for step in &r.steps {
                        match step.keep {
                            Some(pos) => {
                                while let Some((_, bytes)) = defaults.next_if(|(d, _)| *d < pos) {
                                    out.put(bytes);
                                }
                                self.node(step.node, input, out, depth + 1)
                                    .map_err(|e| e.within(step.name.clone()))?;
                            }
                            None => self
                                .node(step.node, input, &mut Discard, depth + 1)
                                .map_err(|e| e.within(step.name.clone()))?,
                        }
                    }
                    for (_, bytes) in defaults {
                        out.put(bytes);
                    }
                    return self.grew(out, input);
                }
                // The reader wants the fields in another order: each is written aside.
                let mut fields: Vec<Vec<u8>> = vec![Vec::new(); r.reader_fields];
                for (pos, bytes) in &r.defaults {
                    fields[*pos] = bytes.clone();
                }
                for step in &r.steps {
                    match step.keep {
                        Some(pos) if O::WRITES => {
                            let mut aside = Vec::new();
                            self.node(step.node, input, &mut aside, depth + 1)
                                .map_err(|e| e.within(step.name.clone()))?;
                            fields[pos] = aside;
                        }
                        _ => self
                            .node(step.node, input, &mut Discard, depth + 1)
                            .map_err(|e| e.within(step.name.clone()))?,
                    }
                }
                for f in &fields {
                    out.put(f);
                }
                self.grew(out, input)
            }
            Node::WriterUnion(branches) => {
                let start = input.at;
                let i = input.long()?;
                let Some(branch) = usize::try_from(i).ok().and_then(|i| branches.get(i)) else {
                    input.at = start;
                    return input.fail(format!("union branch {i} is not below its {} branches", branches.len()));
                };
                match branch {
                    Ok(b) => {
                        if let Some(r) = b.reader {
                            out.long(r as i64);
                        }
                        self.node(b.node, input, out, depth + 1)
                    }
                    Err(why) => {
                        input.at = start;
                        input.fail(why.clone())
                    }
                }
            }
            Node::ReaderUnion { branch, node } => {
                out.long(*branch as i64);
                self.node(*node, input, out, depth + 1)
            }
            Node::Pending => unreachable!("a plan is complete once compiled"),
        }
    }

    /// An array's items or a map's values, in blocks: a count (negative: followed by the
    /// block's size in bytes), the items, and a count of 0 at the end. Written as blocks of
    /// positive counts.
    fn blocks<O: Out>(&mut self, item: usize, map: bool, input: &mut In<'_>, out: &mut O, depth: u32) -> Result<()> {
        let empty = self.plan.empty[item];
        let mut index: u64 = 0;
        loop {
            let start = input.at;
            let mut count = input.long()?;
            if count == 0 {
                out.long(0);
                return Ok(());
            }
            if count < 0 {
                if count == i64::MIN {
                    input.at = start;
                    return input.fail("a block count out of range");
                }
                count = -count;
                let size = input.long()?;
                if size < 0 || size as u64 > input.left() as u64 {
                    input.at = start;
                    return input.fail(format!("a block of {size} bytes, with {} bytes left", input.left()));
                }
            }
            let count = count as u64;
            // Items that take no bytes are bounded by the total alone; the others by the
            // bytes left too (each takes at least one, a map entry its key's length).
            if !empty && !map && count > input.left() as u64 {
                input.at = start;
                return input.fail(format!("a block of {count} items, with {} bytes left", input.left()));
            }
            if map && count > input.left() as u64 {
                input.at = start;
                return input.fail(format!("a block of {count} entries, with {} bytes left", input.left()));
            }
            self.items += count;
            if self.items > self.limits.max_items {
                input.at = start;
                return input.fail(format!(
                    "more than {} array items and map entries in the record",
                    self.limits.max_items
                ));
            }
            out.long(count as i64);
            for _ in 0..count {
                if map {
                    let key = input.utf8("a map key")?;
                    out.long(key.len() as i64);
                    out.put(key);
                    let shown = String::from_utf8_lossy(&key[..key.len().min(40)]).into_owned();
                    self.node(item, input, out, depth + 1)
                        .map_err(|e| e.within(format!("{{{shown}}}")))?;
                } else {
                    self.node(item, input, out, depth + 1)
                        .map_err(|e| e.within(format!("[{index}]")))?;
                }
                index += 1;
                self.grew(out, input)?;
            }
        }
    }
}
