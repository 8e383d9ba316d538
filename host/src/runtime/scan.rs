//! What a component holds, counted before any of it is compiled. Compiling is a guest's
//! work: Cranelift's time and memory grow with the functions and the code it is given
//! (measured here: 200,000 empty functions in 886 KiB took 14–21 s and 1.1 GB), and every
//! worker of a cluster compiles every upload. So a component past the worker's bounds is
//! refused before compiling, with an error naming the bound, and one that does not export
//! the topology world is refused before compiling too. Reading the sections is linear in
//! the component's size and keeps nothing of it.

use wasmparser::{Parser, Payload};

/// How much a component may hold (the worker's `component.max.functions` and
/// `component.max.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Core functions with code, and canonical functions (each is compiled).
    pub max_functions: u64,
    /// Bytes of core function bodies.
    pub max_code_bytes: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_functions: 50_000,
            max_code_bytes: 64 << 20,
        }
    }
}

/// What a component holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    pub functions: u64,
    pub code_bytes: u64,
    pub modules: u64,
    /// Core instances it creates (module instantiations, at every depth): what one of its
    /// instances takes of the pooling allocator's core instances.
    pub core_instances: u64,
    /// Linear memories and tables its core modules define (imported ones are another
    /// module's): what one instance takes of the pool's memories and tables.
    pub memories: u64,
    pub tables: u64,
    /// The names the outermost component exports.
    pub exports: Vec<String>,
}

/// Counts what `bytes` (a component) holds; an error says where it does not parse.
pub fn count(bytes: &[u8]) -> Result<Counted, String> {
    let mut counted = Counted::default();
    // How deep in nested modules and components the parser is (0: the outermost).
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ModuleSection { .. } => {
                counted.modules += 1;
                depth += 1;
            }
            Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::CodeSectionStart { count, size, .. } => {
                counted.functions += u64::from(count);
                counted.code_bytes += u64::from(size);
            }
            Payload::ComponentCanonicalSection(reader) => counted.functions += u64::from(reader.count()),
            Payload::InstanceSection(reader) => {
                for instance in reader {
                    if let wasmparser::Instance::Instantiate { .. } = instance.map_err(|e| e.to_string())? {
                        counted.core_instances += 1;
                    }
                }
            }
            Payload::MemorySection(reader) => counted.memories += u64::from(reader.count()),
            Payload::TableSection(reader) => counted.tables += u64::from(reader.count()),
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    counted
                        .exports
                        .push(export.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(counted)
}

impl Bounds {
    /// Whether `counted` is within the bounds; if not, what is over and what to do.
    pub fn check(&self, counted: &Counted) -> Result<(), String> {
        if counted.functions > self.max_functions {
            return Err(format!(
                "it has {} functions to compile, more than this worker compiles for one topology \
                 ({}, component.max.functions)",
                counted.functions, self.max_functions
            ));
        }
        if counted.code_bytes > self.max_code_bytes {
            return Err(format!(
                "it has {} bytes of function code, more than this worker compiles for one topology \
                 ({}, component.max.code)",
                counted.code_bytes, self.max_code_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component wrapping one core module of `functions` empty functions.
    fn component_of(functions: u32) -> Vec<u8> {
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        // type section: one type () -> ()
        module.extend([1, 4, 1, 0x60, 0, 0]);
        // function section: `functions` functions of type 0
        let mut funcs = leb(functions);
        funcs.extend(std::iter::repeat_n(0u8, functions as usize));
        module.push(3);
        module.extend(leb(funcs.len() as u32));
        module.extend(funcs);
        // code section: each body is `size 2, no locals, end`
        let mut code = leb(functions);
        for _ in 0..functions {
            code.extend([2, 0, 0x0b]);
        }
        module.push(10);
        module.extend(leb(code.len() as u32));
        module.extend(code);
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        component.push(1); // core module section
        component.extend(leb(module.len() as u32));
        component.extend(module);
        component
    }

    fn leb(mut n: u32) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    #[test]
    fn a_component_of_many_functions_is_counted_and_refused_before_compiling() {
        let bytes = component_of(200_000);
        assert!(bytes.len() < 1_000_000, "{} bytes", bytes.len());
        let counted = count(&bytes).unwrap();
        assert_eq!((counted.functions, counted.modules), (200_000, 1));
        let err = Bounds::default().check(&counted).unwrap_err();
        assert_eq!(
            err,
            "it has 200000 functions to compile, more than this worker compiles for one topology \
             (50000, component.max.functions)"
        );
        let small = count(&component_of(10)).unwrap();
        assert_eq!(Bounds::default().check(&small), Ok(()));
        assert!(small.exports.is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let bytes = component_of(3);
        for cut in 8..bytes.len() {
            let _ = count(&bytes[..cut]);
        }
        assert!(count(b"\0asm\x0d\0\x01\0\x01\xff\xff\xff\xff\x0f").is_err());
    }
}
