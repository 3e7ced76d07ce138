//! Entry point of the `sandbox-executor` binary (the container's PID 1); all logic is in the
//! library so it can be unit-tested.

fn main() {
    let supervise = std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == sandbox_executor::cmd::subreaper::SUPERVISE_ARG);
    std::process::exit(if supervise {
        sandbox_executor::cmd::subreaper::main()
    } else {
        sandbox_executor::run()
    });
}
