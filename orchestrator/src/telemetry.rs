//! Structured logging set-up (tracing), chosen by the node config.
//!
//! Logs go to stderr. Colour codes are written only when stderr is a terminal: a log file, a
//! pipe or `docker logs` gets plain text. Every line of a request carries its `request_id` (the
//! span `api::request_id` opens at the edge), in text as `request{request_id=...}:` and in JSON
//! in the `span`/`spans` fields.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber; `RUST_LOG` overrides the configured level.
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_wanted(std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Colour only on a terminal, and never when `NO_COLOR` is set (<https://no-color.org>).
fn colour_wanted(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
