//! The refusal a SEAL client reports (approvals, secrets, seal, speed, ...): one helper instead of
//! a `fn refused` per suite.

use aegis_cli::seal_client::ClientError;
use serde_json::Value;

/// The SEAL code, transport status and message of a call that must have been refused; fails the
/// test with what came back otherwise.
pub fn refused(result: Result<Value, ClientError>) -> (u32, u16, String) {
    match result {
        Err(ClientError::Refused {
            code,
            status,
            message,
            ..
        }) => (code, status, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}
