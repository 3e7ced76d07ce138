//! `orchestrator keys create|list|revoke` (admin key).

use serde_json::json;

use super::client::{segment, Client};
use super::error::CliError;
use super::output;
use super::Connection;

/// Key verbs.
#[derive(clap::Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key; prints the secret (shown only now) on stdout.
    Create {
        /// A name to recognise it by.
        name: String,
        /// admin, operator or readonly.
        #[arg(long, default_value = "operator")]
        role: String,
        /// Expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z).
        #[arg(long, value_name = "TIME")]
        expires_at: Option<String>,
        /// Bind the key to this security context (for MCP clients).
        #[arg(long, value_name = "NAME")]
        security_context: Option<String>,
    },
    /// Every key (never the secrets).
    List,
    /// Revoke a key by id or name.
    Revoke {
        /// Key id or name.
        #[arg(value_name = "ID|NAME")]
        id_or_name: String,
    },
}

/// Runs one keys verb.
pub async fn run(conn: &Connection, command: KeysCommand) -> Result<(), CliError> {
    let client = Client::new(conn)?;
    match command {
        KeysCommand::Create {
            name,
            role,
            expires_at,
            security_context,
        } => {
            let out = client
                .post(
                    "/v1/api-keys",
                    json!({"name": name, "role": role, "expires_at": expires_at,
                           "security_context": security_context}),
                )
                .await?;
            if client.json {
                output::json(&out);
            } else {
                println!("{}", out["key"].as_str().unwrap_or_default());
                eprintln!(
                    "created {} key `{name}` ({}); the secret above is shown only now",
                    output::cell(&out["role"]),
                    output::cell(&out["id"])
                );
            }
        }
        KeysCommand::List => {
            let out = client.get("/v1/api-keys").await?;
            let cols = [
                ("name", "name"),
                ("role", "role"),
                ("prefix", "key_prefix"),
                ("created", "created_at"),
                ("last used", "last_used_at"),
                ("expires", "expires_at"),
                ("revoked", "revoked_at"),
                ("context", "security_context"),
                ("id", "id"),
            ];
            output::listing(client.json, &out, &out, &cols, "no keys");
        }
        KeysCommand::Revoke { id_or_name } => {
            let out = client
                .delete(&format!("/v1/api-keys/{}", segment(&id_or_name)))
                .await?;
            output::done(client.json, &out, format!("revoked key {id_or_name}"));
        }
    }
    Ok(())
}
