//! The sandbox of each MCP session, kept on a SEAL session row so the existing machinery
//! (quotas, `ensure_sandbox`, the sweeper of ended sessions) owns its life.
//!
//! An MCP session (an `Mcp-Session-Id` under one API key) gets one row in `seal_sessions` the
//! first time it calls a sandbox tool; the sandbox is created with the key's security context and
//! recorded on that row. The row expires after `mcp.session_idle_secs` without a call; calls
//! push that back (at most once per tenth of it). When the MCP session ends (DELETE, or rmcp's idle timeout) the row is revoked
//! and the sandbox destroyed at once; if the node dies first, the gateway's sweeper destroys it
//! once the row has expired. Session-less requests (protocol 2026-07-28) have no session id: their
//! sandbox is the API key's own, ending by idle expiry.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::Utc;
use dispatcher::SandboxId;
use uuid::Uuid;

use crate::gateway::sessions::{self, Session};
use crate::seal::context::SecurityContext;
use crate::state::AppState;

/// Which MCP conversation a sandbox belongs to: the API key and, with sessions, the session id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The API key's id.
    pub key_id: Uuid,
    /// The `Mcp-Session-Id`, when the revision has sessions.
    pub session: Option<String>,
}

/// The rows (and so sandboxes) of the live MCP conversations of this instance.
#[derive(Default)]
pub struct SessionSandboxes {
    rows: Mutex<HashMap<Owner, Uuid>>,
}

impl SessionSandboxes {
    /// The owner's sandbox, created on first use with the context's runtime (quotas apply).
    pub async fn sandbox_for(
        &self,
        state: &AppState,
        owner: &Owner,
        key_name: &str,
        context: &SecurityContext,
        idle_secs: u64,
    ) -> Result<SandboxId, String> {
        let known = self.row_of(owner);
        if let Some(row) = known {
            // Still live: push the idle deadline back (once a tenth of it has passed: the calls
            // of one session in flight together would otherwise queue on the row's lock, and
            // the session may end at most a tenth of `idle_secs` early), reuse its sandbox.
            let touched = aegis_store::mcp_sessions::touch(&state.pool, row, idle_secs)
                .await
                .map_err(|e| format!("session store unavailable: {e}"))?;
            match touched {
                Some(Some(sandbox)) => return Ok(SandboxId(sandbox)),
                Some(None) => return self.create_sandbox(state, row, owner, context).await,
                // Revoked by an operator or expired: the sweeper destroys its sandbox; a new
                // row (and sandbox) follows.
                None => self.forget(owner, row),
            }
        }
        // The row needs a 32-byte client key; MCP sessions sign nothing, so it is random (no one
        // holds its private half) and the row's token id is one no SEAL token ever carries.
        let mut unusable_key = [0u8; 32];
        getrandom::fill(&mut unusable_key).map_err(|e| format!("random: {e}"))?;
        let now = Utc::now();
        let row = Session {
            id: Uuid::new_v4(),
            context_name: context.name.clone(),
            workload_id: format!("mcp:{key_name}"),
            public_key: unusable_key.to_vec(),
            token_id: format!("mcp:{}", Uuid::new_v4()),
            status: "active".to_owned(),
            created_at: now,
            expires_at: now + chrono::Duration::seconds(idle_secs as i64),
            revoked_at: None,
            sandbox_id: None,
        };
        sessions::create(&state.pool, crate::DEFAULT_TENANT, &row)
            .await
            .map_err(|e| format!("session store unavailable: {e}"))?;
        let row_id = {
            let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
            *rows.entry(owner.clone()).or_insert(row.id)
        };
        if row_id != row.id {
            // A concurrent first call won: retire our row (it holds no sandbox).
            let _ = sessions::revoke(&state.pool, crate::DEFAULT_TENANT, row.id).await;
        }
        self.create_sandbox(state, row_id, owner, context).await
    }

    /// The sandbox is labelled with the conversation's key, its owner for every door.
    async fn create_sandbox(
        &self,
        state: &AppState,
        row: Uuid,
        owner: &Owner,
        context: &SecurityContext,
    ) -> Result<SandboxId, String> {
        // In a task of its own: a client that goes away cannot leave an unrecorded sandbox.
        tokio::spawn(sessions::ensure_sandbox(
            state.gateway_services(),
            row,
            context.clone(),
            Some(owner.key_id),
        ))
        .await
        .map_err(|e| format!("no sandbox for this session: {e}"))?
    }

    fn row_of(&self, owner: &Owner) -> Option<Uuid> {
        self.rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
            .copied()
    }

    fn forget(&self, owner: &Owner, row: Uuid) {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        if rows.get(owner) == Some(&row) {
            rows.remove(owner);
        }
    }

    /// Ends the owner's session: revokes its row and destroys its sandbox now.
    pub async fn end(&self, state: &AppState, owner: &Owner) {
        let Some(row) = self.row_of(owner) else {
            return;
        };
        self.forget(owner, row);
        match sessions::revoke(&state.pool, crate::DEFAULT_TENANT, row).await {
            Ok(Some(Session {
                sandbox_id: Some(sandbox),
                ..
            })) => {
                if let Err(e) = state.sandboxes.destroy(SandboxId(sandbox)).await {
                    // The row is revoked: the sweeper tries again.
                    tracing::warn!(sandbox = %sandbox, error = %e, "could not destroy an MCP session's sandbox");
                    return;
                }
                let _ = sessions::clear_sandbox(&state.pool, row).await;
                tracing::info!(sandbox = %sandbox, "destroyed the sandbox of an ended MCP session");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not end an MCP session's row"),
        }
    }
}
