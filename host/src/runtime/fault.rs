//! What can go wrong inside a guest, classified so that the task's error says whose fault
//! it is and what happened; and the guest's own words in it (and in its log lines) made one
//! line of the worker's log ([`one_line`]).

use std::borrow::Cow;
use std::time::Duration;

/// A guest call failed. Every variant is the guest's fault; none can harm the worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestFault {
    /// The guest returned an error (its own message).
    #[error("the topology reported an error: {}", one_line(message))]
    Error { message: String, record_index: Option<u32> },
    /// The guest trapped: a panic, `unreachable`, an out-of-bounds access, …
    #[error("the guest trapped: {}{}", one_line(trap), stderr_suffix(.stderr))]
    Trap { trap: String, stderr: String },
    /// The call ran past its deadline (an endless loop, or far too much work per call).
    #[error("the guest call exceeded its deadline of {}", humantime::format_duration(*.timeout))]
    Deadline { timeout: Duration },
    /// The guest tried to grow its memory beyond the cap.
    #[error("the guest exceeded its memory limit of {limit} bytes (it asked for {requested} bytes)")]
    Memory { limit: usize, requested: usize },
    /// The guest made the host hold more than its budget allows (records emitted through
    /// the host, state writes not yet committed).
    #[error("the guest exceeded its {budget} budget of {limit} {unit}: {what} would make it {wanted} {unit}")]
    Budget {
        budget: &'static str,
        unit: &'static str,
        limit: usize,
        wanted: usize,
        what: &'static str,
    },
    /// The guest called something topologies may not use (e.g. a blocking wait).
    #[error("the guest called {call}, which topologies may not use: {why}")]
    Denied { call: &'static str, why: &'static str },
    /// The guest used a sink or store it did not declare (even if it ignored the error it got).
    #[error("the topology used {}, which it did not declare", one_line(what))]
    Undeclared { what: String },
    /// The guest handed back records that do not follow the contract.
    #[error("the guest returned invalid output: {}", one_line(detail))]
    BadOutput { detail: String },
    /// The host could not create an instance (e.g. the pooling allocator is full).
    #[error("cannot instantiate the topology: {}", one_line(detail))]
    Instantiate { detail: String },
}

impl GuestFault {
    /// A short machine-friendly kind, used as a metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            GuestFault::Error { .. } => "error",
            GuestFault::Trap { .. } => "trap",
            GuestFault::Deadline { .. } => "deadline",
            GuestFault::Memory { .. } | GuestFault::Budget { .. } => "memory",
            GuestFault::Denied { .. } => "denied",
            GuestFault::Undeclared { .. } => "undeclared",
            GuestFault::BadOutput { .. } => "bad_output",
            GuestFault::Instantiate { .. } => "instantiate",
        }
    }

    /// The index of the batch record the guest was at, when it said so.
    pub fn record_index(&self) -> Option<u32> {
        match self {
            GuestFault::Error { record_index, .. } => *record_index,
            _ => None,
        }
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let trimmed = stderr.trim();
    if trimmed.is_empty() {
        String::new()
    } else {
        let lines: Vec<Cow<'_, str>> = trimmed.lines().map(one_line).collect();
        format!(" (guest stderr: {})", lines.join(" | "))
    }
}

/// `text` (a guest's log message, error, trap or output) as one line of the worker's log:
/// line breaks, other control characters and the characters that reorder or break a line
/// (Unicode line and paragraph separators, bidirectional controls) escaped as Rust writes
/// them (`\n`, `\r`, `\t`, `\u{1b}`), so no guest can forge or hide a line of the log.
/// Everything else (text in any script, a backslash) is kept as it is.
pub fn one_line(text: &str) -> Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    }
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{one_line, GuestFault};

    #[test]
    fn one_line_escapes_what_breaks_or_hides_a_line_and_keeps_the_rest() {
        assert_eq!(one_line("plain text, ünïcödé, \\ kept"), "plain text, ünïcödé, \\ kept");
        assert!(matches!(one_line("plain"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(one_line("a\nb\r\tc"), r"a\nb\r\tc");
        assert_eq!(one_line("\u{1b}[2J\u{7f}\u{85}"), r"\u{1b}[2J\u{7f}\u{85}");
        assert_eq!(one_line("x\u{2028}y\u{202e}z"), r"x\u{2028}y\u{202e}z");
    }

    /// Every fault that carries the guest's text (its error, a trap's message and backtrace
    /// with the guest's function names, its stderr) is one line with no control characters.
    #[test]
    fn what_a_guest_puts_in_a_fault_stays_one_line() {
        let forged = "oops\n2030-01-01T00:00:00Z ERROR sluice: forged\r\u{1b}[2J\u{2028}";
        for fault in [
            GuestFault::Error {
                message: forged.into(),
                record_index: None,
            },
            GuestFault::Trap {
                trap: format!("unreachable\nwasm backtrace:\n 0: {forged}"),
                stderr: format!("panicked at {forged}\nsecond line\r\n"),
            },
            GuestFault::Undeclared { what: forged.into() },
            GuestFault::BadOutput { detail: forged.into() },
            GuestFault::Instantiate { detail: forged.into() },
        ] {
            let text = fault.to_string();
            assert!(
                !text.chars().any(|c| c.is_control() || c == '\u{2028}'),
                "{:?} displays a control character: {text:?}",
                fault.kind()
            );
            assert!(text.contains(r"oops\n2030") || text.contains(r"forged\r"), "{text:?}");
        }
    }
}
