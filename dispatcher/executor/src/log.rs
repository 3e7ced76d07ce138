//! One-line event logging to stderr.
//!
//! stdout belongs to the protocol, so diagnostics go to stderr, one short line per event, prefixed
//! so they stand out in `docker logs`. No log crate: the executor is tiny and logs little.

/// Writes one line to stderr: `sandbox-executor: <message>`.
#[macro_export]
macro_rules! log_event {
    ($($arg:tt)*) => {
        eprintln!("sandbox-executor: {}", format_args!($($arg)*))
    };
}
