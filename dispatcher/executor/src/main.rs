//! Entry point of the `sandbox-executor` binary (the container's PID 1); all logic is in the
//! library so it can be unit-tested.

fn main() {
    std::process::exit(sandbox_executor::run());
}
