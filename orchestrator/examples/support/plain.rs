//! What the benchmarks run without options (`egress_bench`, `seal_bench`) share: their one
//! argument, a count, and how they sum their timings up.

use std::time::Duration;

/// The count the benchmark was given as its one argument, else `default`.
pub fn count_arg(default: usize) -> usize {
    std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// `(p50, p95)` of the timings, in milliseconds (floor rank); the timings must not be empty.
pub fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.95))
}
