//! A hostile topology, written against the raw WIT bindings (not the SDK's safe paths), for
//! the sandbox suite. It passes records through to `output`, except for values that name an
//! attack; each attack must cost only this topology's own task.
//!
//! | value              | attack                                                        |
//! |--------------------|---------------------------------------------------------------|
//! | `bad-count`        | returns `ff ff ff ff`: four billion records, no bytes         |
//! | `sleep`            | `std::thread::sleep` for a minute (a blocking WASI call)      |
//! | `loop`             | spins forever                                                 |
//! | `stack`            | unbounded recursion                                           |
//! | `alloc`            | asks for 4 GiB at once                                        |
//! | `grow`             | keeps 16 MiB (within the cap) and goes on passing records     |
//! | `state-bomb`       | puts 8 MiB values in one call until something stops it        |
//! | `state-fill`       | puts 4 MiB in one call (within budget) to fill the disk quota  |
//! | `emit-flood`       | emits 1 MiB records through `host.emit` until stopped         |
//! | `log-flood`        | writes 100,000 log lines of 10 KiB, then passes the record   |
//! | `stdout-flood`     | prints 100,000 lines, then passes the record                  |
//! | `undeclared-store` | opens a store it did not declare (ignoring the error)         |
//! | `undeclared-sink`  | emits to a sink it did not declare (ignoring the error)       |
//! | `spin:MS`          | spins MS milliseconds of host time (just under a deadline)    |
//! | `busy:MS`          | spins until MS milliseconds after the call began (every call  |
//! |                    | of a batch of these takes MS, however many records it holds)  |
//! | `big-value:N`      | puts 900 KiB of zeros under key N (a changelog record fits)   |
//! | `scan-all`         | scans the whole store with `next-page(10000)`                 |
//! | `log-forge`        | logs a message whose newline forges a line of the worker's log |
//! | `ambient`          | emits what WASI tells it instead of the record: its clocks,   |
//! |                    | environment, arguments, working directory, stdin and random   |
//!
//! `init` traps when the topology's deployed name contains `init-trap`. What it says of its
//! operators (`introspection`) is an escape sequence, a 100 KB line and 10,000 more lines.

use std::hint::black_box;
use std::sync::Mutex;

use sluice_guest::__private::bindings::exports::sluice::topology0_2_0::processor::{
    Description, Guest, GuestError, TaskInfo,
};
use sluice_guest::__private::bindings::sluice::topology0_1_0::state::Store;
use sluice_guest::__private::bindings::sluice::topology0_1_0::{host, types};
use sluice_guest::wire::{self, Writer};

/// Memory kept by `grow`.
static KEPT: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

struct Hostile;

/// Recurses until the stack runs out (the depth check is never true in practice; it keeps
/// the compiler from calling the function endless).
fn recurse(depth: u64, pad: [u8; 256]) -> u64 {
    if black_box(depth) == u64::MAX {
        return 0;
    }
    recurse(depth + 1, black_box(pad)) + u64::from(pad[0])
}

/// What the WASI context hands a guest, as `key=value` words: the wall clock and monotonic
/// clock (nanoseconds, each read five times), the environment, arguments, working
/// directory, what stdin holds, and 16 bytes from `wasi:random` (through std's hash keys).
fn ambient() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::io::Read;
    let mut words = Vec::new();
    for i in 0..5 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        words.push(format!("wall{i}={wall}"));
        black_box((0..10_000u64).map(black_box).sum::<u64>());
    }
    // std keeps no origin for Instant: its Debug shows the clock's raw reading.
    for i in 0..5 {
        words.push(format!("mono{i}={}", mono_nanos(std::time::Instant::now())));
        black_box((0..10_000u64).map(black_box).sum::<u64>());
    }
    words.push(format!("env={}", std::env::vars_os().count()));
    words.push(format!("args={}", std::env::args_os().count()));
    words.push(format!("cwd={:?}", std::env::current_dir().ok()));
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    words.push(format!("stdin={}", stdin.len()));
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u8(0);
    words.push(format!("random={:016x}", hasher.finish()));
    words.join(" ")
}

/// The nanoseconds of a wasi monotonic-clock reading, from `Instant`'s Debug, exactly:
/// `Instant { t: Timespec { tv_sec: S, tv_nsec: N } }` (or a `Duration`, `Instant(1.5s)`).
fn mono_nanos(instant: std::time::Instant) -> u128 {
    let text = format!("{instant:?}");
    let numbers: Vec<&str> = text
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    if text.contains("tv_nsec") {
        let [secs, nanos] = numbers[..] else { return u128::MAX };
        return secs.parse::<u128>().unwrap_or(u128::MAX / 2) * 1_000_000_000 + nanos.parse::<u128>().unwrap_or(0);
    }
    let Some(number) = numbers.first() else {
        return u128::MAX;
    };
    let unit = &text[text.find(number).unwrap_or(0) + number.len()..];
    let digits = if unit.starts_with("ns") {
        0
    } else if unit.starts_with("\u{b5}s") {
        3
    } else if unit.starts_with("ms") {
        6
    } else {
        9
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut fraction = fraction.to_string();
    fraction.truncate(digits);
    while fraction.len() < digits {
        fraction.push('0');
    }
    format!("{whole}{fraction}").parse().unwrap_or(u128::MAX)
}

impl Guest for Hostile {
    fn describe() -> Description {
        Description {
            name: "hostile".into(),
            sources: vec!["input".into()],
            sinks: vec!["output".into()],
            stores: vec!["state".into()],
            internal_topics: Vec::new(),
            subtopologies: Vec::new(),
            global_stores: Vec::new(),
        }
    }

    fn init(task: TaskInfo) -> Result<(), GuestError> {
        if task.topology.contains("init-trap") {
            panic!("init refuses to start");
        }
        Ok(())
    }

    fn process(batch: Vec<u8>) -> Result<Vec<u8>, GuestError> {
        let began = host::now_ms();
        let mut out = Writer::new();
        let inputs = wire::inputs(&batch).map_err(|e| GuestError {
            record_index: None,
            message: e.to_string(),
        })?;
        for input in inputs {
            let input = input.map_err(|e| GuestError {
                record_index: None,
                message: e.to_string(),
            })?;
            match input.value.unwrap_or_default() {
                b"bad-count" => return Ok(vec![0xff; 4]),
                b"sleep" => std::thread::sleep(std::time::Duration::from_secs(60)),
                b"loop" => loop {
                    black_box(0u64);
                },
                b"stack" => {
                    black_box(recurse(0, [1; 256]));
                }
                b"alloc" => {
                    let mut v: Vec<u8> = Vec::new();
                    v.reserve_exact(black_box(usize::MAX / 2));
                    black_box(&v);
                }
                b"grow" => {
                    let mut kept = KEPT.lock().unwrap();
                    if kept.is_empty() {
                        kept.push(black_box(vec![7u8; 16 << 20]));
                    }
                }
                b"state-bomb" => {
                    let store = Store::open("state").map_err(|_| GuestError {
                        record_index: None,
                        message: "cannot open the store".into(),
                    })?;
                    let value = vec![1u8; 8 << 20];
                    for i in 0u32.. {
                        let _ = store.put(&i.to_le_bytes(), &value);
                    }
                }
                b"state-fill" => {
                    let store = Store::open("state").map_err(|_| GuestError {
                        record_index: None,
                        message: "cannot open the store".into(),
                    })?;
                    let value = vec![3u8; 512 << 10];
                    for i in 0u32..8 {
                        store.put(&i.to_le_bytes(), &value).map_err(|_| GuestError {
                            record_index: None,
                            message: "put failed".into(),
                        })?;
                    }
                }
                b"emit-flood" => {
                    let value = vec![2u8; 1 << 20];
                    loop {
                        let _ = host::emit(
                            "output",
                            &types::Output {
                                key: None,
                                value: Some(value.clone()),
                                timestamp: None,
                                headers: Vec::new(),
                            },
                        );
                    }
                }
                b"log-flood" => {
                    let line = "x".repeat(10 << 10);
                    for _ in 0..100_000 {
                        host::log(types::Level::Info, &line);
                    }
                }
                b"stdout-flood" => {
                    for i in 0..100_000 {
                        println!("stdout line {i} of a flood that must not fill anything");
                    }
                }
                b"undeclared-store" => {
                    let _ = Store::open("not-declared");
                }
                b"undeclared-sink" => {
                    let _ = host::emit(
                        "not-declared",
                        &types::Output {
                            key: None,
                            value: Some(b"x".to_vec()),
                            timestamp: None,
                            headers: Vec::new(),
                        },
                    );
                }
                b"log-forge" => {
                    host::log(
                        types::Level::Info,
                        "innocent\n2030-01-01T00:00:00.000000Z ERROR sluice::worker: FORGED by a guest\r\u{1b}[2J",
                    );
                }
                b"ambient" => {
                    out.push_emitted(
                        0,
                        input.key,
                        Some(ambient().as_bytes()),
                        wire::INHERIT_TIMESTAMP,
                        std::iter::empty(),
                    );
                    continue;
                }
                b"scan-all" => {
                    let store = Store::open("state").map_err(|_| GuestError {
                        record_index: None,
                        message: "cannot open the store".into(),
                    })?;
                    if let Ok(scan) = store.range(None, None) {
                        while let Ok(page) = scan.next_page(10_000) {
                            if page.is_empty() {
                                break;
                            }
                            black_box(page.len());
                        }
                    }
                }
                other => {
                    if let Some(ms) = other
                        .strip_prefix(b"spin:")
                        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<i64>().ok())
                    {
                        let until = host::now_ms() + ms;
                        while host::now_ms() < until {
                            black_box(0u64);
                        }
                    } else if let Some(ms) = other
                        .strip_prefix(b"busy:")
                        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<i64>().ok())
                    {
                        while host::now_ms() < began + ms {
                            black_box(0u64);
                        }
                    } else if let Some(n) = other.strip_prefix(b"big-value:") {
                        let store = Store::open("state").map_err(|_| GuestError {
                            record_index: None,
                            message: "cannot open the store".into(),
                        })?;
                        store.put(n, &vec![0u8; 900 << 10]).map_err(|_| GuestError {
                            record_index: None,
                            message: "put failed".into(),
                        })?;
                    }
                }
            }
            out.push_emitted(0, input.key, input.value, wire::INHERIT_TIMESTAMP, std::iter::empty());
        }
        Ok(out.take())
    }

    fn punctuate(_stream_time_ms: i64, _wall_clock_ms: i64) -> Result<Vec<u8>, GuestError> {
        Ok(Writer::new().take())
    }

    fn close() -> Result<Vec<u8>, GuestError> {
        Ok(Writer::new().take())
    }
}

/// What it says of its operators is hostile too: a terminal escape sequence that would
/// clear the screen of whoever describes it, a line of 100 KB and 10,000 more lines.
impl sluice_guest::__private::IntrospectionGuest for Hostile {
    fn describe_operators() -> Vec<(String, Vec<String>)> {
        let mut lines = vec!["\u{1b}[2J\u{1b}[Hcleared".to_string(), "x".repeat(100_000)];
        lines.extend((0..10_000).map(|i| format!("operator_{i}")));
        vec![("hostile".to_string(), lines)]
    }
}

/// It declares no formats: its topics are bytes.
impl sluice_guest::__private::FormatsGuest for Hostile {
    fn describe_formats() -> Vec<sluice_guest::__private::WitTopicFormat> {
        Vec::new()
    }
}

sluice_guest::__private::bindings::__export_topology!(Hostile with_types_in sluice_guest::__private::bindings);
