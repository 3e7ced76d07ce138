//! `cmd.run` and `cancel`: one command, started through the spawning machinery of `spawn/` and
//! supervised until it ends or its request is cancelled. `run.rs` ties the steps together for
//! one request (and for a live process, `live/`).

pub mod run;
