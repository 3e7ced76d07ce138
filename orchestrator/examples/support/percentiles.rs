//! How the benchmarks that keep every timing as a `Duration` sum them up.

use std::time::Duration;

/// `(p50, p95)` of the timings, in milliseconds (floor rank); the timings must not be empty.
pub fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.95))
}
