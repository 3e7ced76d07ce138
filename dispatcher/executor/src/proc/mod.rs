//! The process tools: `proc.list`, `logs.read` and `env.get`, one file each.
//!
//! They let an agent debug what it started without a shell: which processes run and on which
//! TCP ports they listen, the filtered tail of a log, and the environment with secrets masked.
//! Like `fs.*` they run on handler threads whose filesystem uid/gid are the sandbox user's, so
//! `/proc` answers only what that user may see (the executor and the sub-reapers run as root and
//! are not dumpable: their descriptors stay hidden), and files are opened only through `roots`.

pub mod env;
pub mod list;
pub mod logs;
