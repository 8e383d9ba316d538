//! The compact binary encoding of member metadata and assignments: LEB128 varints, and task
//! sets as per-topology delta-encoded partition lists (a worker with 50 tasks of one topology
//! costs a few dozen bytes).

use std::collections::BTreeMap;

use super::TaskId;

/// A buffer that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed group metadata at byte {position}: {problem}")]
pub struct DecodeError {
    pub position: usize,
    pub problem: &'static str,
}

#[derive(Default)]
pub struct Encoder {
    pub buf: Vec<u8>,
}

impl Encoder {
    pub fn u64(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }

    /// Signed values zig-zag encoded, so small negatives stay small.
    pub fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }

    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    /// A set of tasks: per topology (or sub-topology, `<topology>/<sub>`) its name and its
    /// sorted partitions as deltas.
    pub fn tasks<'a>(&mut self, tasks: impl IntoIterator<Item = &'a TaskId>) {
        let mut by_unit: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for t in tasks {
            by_unit.entry(t.unit()).or_default().push(t.partition);
        }
        self.u64(by_unit.len() as u64);
        for (unit, mut partitions) in by_unit {
            partitions.sort_unstable();
            partitions.dedup();
            self.str(&unit);
            self.u64(partitions.len() as u64);
            let mut previous = 0u32;
            for p in partitions {
                self.u64((p - previous) as u64);
                previous = p;
            }
        }
    }
}

pub struct Decoder<'a> {
    buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    fn fail<T>(&self, problem: &'static str) -> Result<T, DecodeError> {
        Err(DecodeError {
            position: self.pos,
            problem,
        })
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.buf.get(self.pos) else {
                return self.fail("a varint runs past the end");
            };
            self.pos += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.fail("a varint is longer than 10 bytes")
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let v = self.u64()?;
        u32::try_from(v).or_else(|_| self.fail("a value does not fit 32 bits"))
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        let v = self.u64()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.buf.get(self.pos) {
            Some(0) => {
                self.pos += 1;
                Ok(false)
            }
            Some(1) => {
                self.pos += 1;
                Ok(true)
            }
            Some(_) => self.fail("a flag is neither 0 nor 1"),
            None => self.fail("a flag runs past the end"),
        }
    }

    pub fn bytes_fixed(&mut self) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => self.fail("a worker id runs past the end"),
        }
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u64()? as usize;
        let Some(end) = self.pos.checked_add(len).filter(|&e| e <= self.buf.len()) else {
            return self.fail("a length runs past the end");
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub fn string(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).or_else(|_| self.fail("a name is not UTF-8"))
    }

    pub fn tasks(&mut self) -> Result<Vec<TaskId>, DecodeError> {
        let topologies = self.u64()?;
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..topologies {
            let unit = self.string()?;
            let Some(first) = TaskId::from_unit(&unit, 0) else {
                return self.fail("a task names neither a topology nor a topology and a sub-topology");
            };
            if !seen.insert(unit) {
                return self.fail("a topology's tasks are listed twice");
            }
            let count = self.u64()?;
            if count > self.buf.len() as u64 {
                return self.fail("a task count is larger than the buffer");
            }
            let mut partition = 0u32;
            for i in 0..count {
                let delta = self.u32()?;
                // Partitions are sorted and distinct: after the first, every delta is positive.
                if i > 0 && delta == 0 {
                    return self.fail("a task is listed twice");
                }
                partition = partition
                    .checked_add(delta)
                    .map_or_else(|| self.fail("a partition overflows"), Ok)?;
                out.push(TaskId {
                    partition,
                    ..first.clone()
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_tasks(build: impl FnOnce(&mut Encoder)) -> Result<Vec<TaskId>, DecodeError> {
        let mut e = Encoder::default();
        build(&mut e);
        Decoder::new(&e.buf).tasks()
    }

    /// Found by `dev/fuzz`: a task list naming a task twice (a zero delta after the first
    /// partition, or one topology in two groups) used to decode, and count the task twice.
    #[test]
    fn a_task_listed_twice_is_refused() {
        let twice = decode_tasks(|e| {
            e.u64(1);
            e.str("a");
            e.u64(2);
            e.u64(0);
            e.u64(0);
        });
        assert_eq!(twice.unwrap_err().problem, "a task is listed twice");
        let split = decode_tasks(|e| {
            e.u64(2);
            for _ in 0..2 {
                e.str("a");
                e.u64(1);
                e.u64(3);
            }
        });
        assert_eq!(split.unwrap_err().problem, "a topology's tasks are listed twice");
        let fine = decode_tasks(|e| e.tasks(&[TaskId::new("a", 0), TaskId::new("a", 2), TaskId::new("b", 0)]));
        assert_eq!(fine.unwrap().len(), 3);
    }

    #[test]
    fn tasks_of_sub_topologies_keep_their_sub_topology() {
        let tasks = vec![
            TaskId::new("a", 1),
            TaskId::of("wc", Some("count"), 0),
            TaskId::of("wc", Some("count"), 7),
            TaskId::of("wc", Some("split"), 3),
        ];
        let mut decoded = decode_tasks(|e| e.tasks(&tasks)).unwrap();
        decoded.sort();
        assert_eq!(decoded, tasks);
        assert_eq!(tasks[1].to_string(), "wc/count/0");
        for bad in ["", "a/", "/b", "a/b/c"] {
            let refused = decode_tasks(|e| {
                e.u64(1);
                e.str(bad);
                e.u64(1);
                e.u64(0);
            });
            assert!(refused.is_err(), "{bad:?} decoded");
        }
    }
}
