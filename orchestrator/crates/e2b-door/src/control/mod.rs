//! E2B's control API (`E2B_API_URL`): create, get, list, kill, timeout, refresh and connect
//! sandboxes (pause, resume, snapshots and fork are [`super::lifecycle`]'s; metrics and logs
//! [`super::observe`]'s). Thin handlers: authenticate the key, parse with `aegis_e2b::api`, make or end the
//! sandbox through `sandboxes` (quotas, the runtime's image, the key's security context) and
//! keep its row ([`super::store`]). A key sees and touches only the sandboxes it created.

pub mod fork;
pub mod lifecycle;
pub mod network;
pub mod observe;
pub mod services;

use std::time::Instant;

use aegis_policy::sandboxes::SandboxAccess;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dispatcher::SandboxId;
use serde_json::json;
use uuid::Uuid;

use aegis_e2b::api::{
    parse_body, parse_optional_body, ApiError, ConnectSandbox, Cursor, ListQuery, ListedSandbox,
    NewSandbox, Order, Sandbox, SandboxDetail, SandboxRefreshRequest, SandboxState,
    SandboxTimeoutRequest, DEFAULT_TIMEOUT_SECS, DEFAULT_TIMEOUT_SECS_V2, NEXT_TOKEN_HEADER,
};

use super::store::{self, Row};
use super::{api_error, json_response, keys, Refusal, ENVD_VERSION};
use aegis_core::caller::Caller;
use aegis_sandboxes::e2b_egress::{Grant, NetworkRules};
use aegis_sandboxes::SandboxError;
use aegis_tools::state::AppState;
use aegis_tools::tools::control::{self, Control, ControlError};

/// Largest control API request body.
pub(super) const MAX_BODY: usize = 256 * 1024;
/// Most sandboxes of one key a listing reads (the per-key quota is the real bound).
const MAX_LISTED: i64 = 10_000;
/// The deprecated `clientID` the SDK still requires.
const CLIENT_ID: &str = "aegis";

type Answer = Result<Response, Refusal>;

pub(super) fn db(e: sqlx::Error) -> Refusal {
    tracing::error!(error = %e, "E2B door: database failure");
    Refusal(ApiError::new(503, "the node's database is unavailable"))
}

pub(super) fn not_found(id: &str) -> Refusal {
    Refusal(ApiError::new(404, format!("sandbox \"{id}\" not found")))
}

/// The sandbox id in a path: ours are UUIDs; anything else names no sandbox.
pub(super) fn sandbox_id(raw: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(raw).map_err(|_| not_found(raw))
}

pub(super) async fn authenticated(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Caller, Refusal> {
    keys::caller(state, headers).await.map_err(Refusal)
}

/// The key of a control API request (`X-API-KEY`), authenticated: the one prologue of the
/// handlers here, in [`super::lifecycle`] and in [`super::observe`].
pub struct Key(pub Caller);

/// A [`Key`] whose role may change sandboxes (create, kill, timeouts, connect, pause,
/// snapshots, fork).
pub struct WriteKey(pub Caller);

impl FromRequestParts<AppState> for Key {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Refusal> {
        authenticated(state, &parts.headers).await.map(Key)
    }
}

impl FromRequestParts<AppState> for WriteKey {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Refusal> {
        let caller = authenticated(state, &parts.headers).await?;
        keys::require_write(&caller).map_err(Refusal)?;
        Ok(WriteKey(caller))
    }
}

/// The sandbox `id` of `caller`, running or paused; "not found" otherwise (another key's
/// sandbox included: its existence is not told).
pub(super) async fn known(state: &AppState, caller: &Caller, id: &str) -> Result<Row, Refusal> {
    store::get_known(&state.pool, sandbox_id(id)?, &caller.id)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))
}

/// The running sandbox `id` of `caller`; "not found" otherwise.
pub(super) async fn running(state: &AppState, caller: &Caller, id: &str) -> Result<Row, Refusal> {
    store::get_owned(&state.pool, sandbox_id(id)?, &caller.id)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))
}

/// Which of the key's sandboxes a lifecycle call takes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Held {
    /// Running or paused ([`known`]).
    Known,
    /// Running ([`running`]).
    Running,
}

/// The key's sandbox `id` for a lifecycle call (`action`): a key with no such sandbox is
/// refused, and the refusal audited, through the router's `control::refused`, as any refused
/// call is.
pub(super) async fn row_for(
    state: &AppState,
    caller: &Caller,
    id: &str,
    action: &str,
    held: Held,
) -> Result<Row, Refusal> {
    let found = match held {
        Held::Known => known(state, caller, id).await,
        Held::Running => running(state, caller, id).await,
    };
    match found {
        Err(Refusal(e)) if e.code == 404 => {
            control::refused(
                state,
                caller,
                action,
                &json!({"sandboxID": id}),
                Uuid::parse_str(id).ok(),
                "sandbox_unavailable",
                &e.message,
            )
            .await
            .map_err(db)?;
            Err(Refusal(e))
        }
        other => other,
    }
}

/// A permit for `call` on the sandbox of a row the key owns (the door's record already said
/// so; the router decides again on the dispatcher's). `None` when the dispatcher no longer has
/// the sandbox (a paused sandbox that kept only its files, or one removed meanwhile).
pub(super) async fn permit<'a>(
    state: &'a AppState,
    caller: &'a Caller,
    call: Control<'_>,
) -> Result<Option<control::Permit<'a>>, Refusal> {
    match control::admit(state, caller, call).await {
        Ok(permit) => Ok(Some(permit)),
        Err(ControlError::Unknown(_)) => Ok(None),
        Err(ControlError::Refused(_)) => Err(not_found(&call.sandbox.to_string())),
        Err(ControlError::Sandbox(e)) => Err(Refusal(sandbox_error(e))),
        Err(ControlError::Audit(e)) => Err(db(e)),
    }
}

/// The router's permit to act on (pause, snapshot, fork) the running sandbox of the key's
/// `row`; "not found" when the dispatcher no longer has it.
pub(super) async fn acting<'a>(
    state: &'a AppState,
    caller: &'a Caller,
    row: &Row,
    action: &str,
    args: &serde_json::Value,
) -> Result<control::Permit<'a>, Refusal> {
    let call = Control {
        action,
        sandbox: SandboxId(row.current),
        access: SandboxAccess::Act,
        args,
    };
    permit(state, caller, call)
        .await?
        .ok_or_else(|| not_found(&row.sandbox_id.to_string()))
}

pub(super) fn sandbox_error(e: SandboxError) -> ApiError {
    match e {
        SandboxError::QuotaExceeded { .. } => ApiError::new(429, e.to_string()),
        SandboxError::NoSuchRuntime { .. } => ApiError::new(
            400,
            format!("templateID: {e}; templates are the node's runtimes (`base` is E2B's general image)"),
        ),
        SandboxError::Dispatch(dispatcher::DispatchError::ImageMissing { .. }) => {
            ApiError::new(400, format!("templateID: {e}"))
        }
        SandboxError::Unavailable(_) | SandboxError::Dispatch(_) => {
            ApiError::new(503, e.to_string())
        }
        other => {
            tracing::error!(error = %other, "E2B door: sandbox failure");
            ApiError::new(500, "internal error making the sandbox")
        }
    }
}

/// Whether pause snapshot `id` kept memory (a checkpointed gVisor sandbox).
async fn keeps_memory(state: &AppState, id: Uuid) -> Result<bool, Refusal> {
    Ok(aegis_store::e2b::snapshots::get(&state.pool, id)
        .await
        .map_err(db)?
        .is_some_and(|s| s.keeps_memory))
}

pub(super) fn created_answer(row: &Row, domain: &str) -> Sandbox {
    Sandbox {
        template_id: row.template_id.clone(),
        sandbox_id: row.sandbox_id.to_string(),
        alias: None,
        client_id: CLIENT_ID.to_owned(),
        envd_version: ENVD_VERSION.to_owned(),
        envd_access_token: row.envd_access_token.clone(),
        traffic_access_token: row.traffic_access_token.clone(),
        domain: Some(domain.to_owned()),
    }
}

fn listed(row: &Row) -> ListedSandbox {
    let limits = dispatcher::Limits::default();
    ListedSandbox {
        template_id: row.template_id.clone(),
        alias: None,
        sandbox_id: row.sandbox_id.to_string(),
        client_id: CLIENT_ID.to_owned(),
        started_at: row.started_at,
        end_at: row.end_at,
        cpu_count: u32::try_from(limits.nano_cpus.div_ceil(1_000_000_000)).unwrap_or(1),
        memory_mb: u32::try_from(limits.memory_bytes / (1024 * 1024)).unwrap_or(u32::MAX),
        disk_size_mb: u32::try_from(limits.workspace_bytes / (1024 * 1024)).unwrap_or(u32::MAX),
        metadata: Some(row.metadata.0.clone()),
        state: state_of(row),
        envd_version: ENVD_VERSION.to_owned(),
        envd_unresponsive_at_pause: None,
        volume_mounts: None,
    }
}

pub(super) fn to_json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => json_response(status, body),
        Err(e) => api_error(ApiError::new(500, format!("cannot encode the answer: {e}"))),
    }
}

/// A fresh envd access token: 32 random bytes, hex.
pub(super) fn new_token() -> Result<String, Refusal> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw)
        .map_err(|e| Refusal(ApiError::new(503, format!("no randomness: {e}"))))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the operator grants `caller`'s E2B sandboxes (`e2b.egress`).
pub(super) fn grant_of(state: &AppState, caller: &Caller) -> Grant {
    state.config.e2b.egress.grant_of(&caller.id)
}

/// Whether a new container for `row` (a resume, a fork) gets a network: it had one, and the
/// operator still grants its key something.
pub(super) fn networked(state: &AppState, caller: &Caller, row: &Row) -> bool {
    row.egress.is_some() && !grant_of(state, caller).is_nothing()
}

/// The sandbox's own rules as recorded (`None`: it has no network).
pub(super) fn rules_of(row: &Row) -> Option<NetworkRules> {
    row.egress
        .as_ref()
        .and_then(|e| serde_json::from_value(e.0.clone()).ok())
}

/// `POST /sandboxes`: a sandbox of the template's runtime under the key's policy. Nothing is
/// left behind when it fails: the dispatcher removes a sandbox it could not start, and a
/// sandbox whose row cannot be written is destroyed before answering.
pub async fn create(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    body: Bytes,
) -> Answer {
    let req: NewSandbox = parse_body(&body, MAX_BODY).map_err(Refusal)?;
    let row = create_row(&state, &caller, req, DEFAULT_TIMEOUT_SECS).await?;
    Ok(to_json(
        StatusCode::CREATED,
        &created_answer(&row, &state.config.e2b.domain),
    ))
}

/// Longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY: usize = 256;

/// `POST /v2/sandboxes` (SDKs from 2.51): the same create, five minutes by default, and an
/// optional `Idempotency-Key`: a retry with the same key and body answers the sandbox the first
/// made (never a second one), the same key with another body is refused (422), and a retry
/// while the first still runs is told so (409).
pub async fn create_v2(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let req: NewSandbox = parse_body(&body, MAX_BODY).map_err(Refusal)?;
    let Some(key) = headers.get("idempotency-key") else {
        let row = create_row(&state, &caller, req, DEFAULT_TIMEOUT_SECS_V2).await?;
        return Ok(to_json(
            StatusCode::CREATED,
            &created_answer(&row, &state.config.e2b.domain),
        ));
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY)
        .filter(|k| k.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| {
            Refusal(ApiError::bad_request(format!(
                "Idempotency-Key: expected 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters without spaces"
            )))
        })?
        .to_owned();
    let digest = {
        use sha2::Digest as _;
        let sum = sha2::Sha256::digest(&body);
        sum.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    match store::claim(&state.pool, &caller.id, &key, &digest)
        .await
        .map_err(db)?
    {
        store::Claim::Done(answer) => return Ok(to_json(StatusCode::CREATED, &answer)),
        store::Claim::Running => {
            return Err(Refusal(ApiError::new(
                409,
                "a create with this Idempotency-Key is still running; retry when it has answered",
            )))
        }
        store::Claim::Mismatch => {
            return Err(Refusal(ApiError::new(
                422,
                "this Idempotency-Key was used with another request body; use a new key for another sandbox",
            )))
        }
        store::Claim::New => {}
    }
    match create_row(&state, &caller, req, DEFAULT_TIMEOUT_SECS_V2).await {
        Ok(row) => {
            let answer = serde_json::to_value(created_answer(&row, &state.config.e2b.domain))
                .map_err(|e| Refusal(ApiError::new(500, e.to_string())))?;
            store::answer_claim(&state.pool, &caller.id, &key, &answer)
                .await
                .map_err(db)?;
            Ok(to_json(StatusCode::CREATED, &answer))
        }
        Err(refused) => {
            if let Err(e) = store::release_claim(&state.pool, &caller.id, &key).await {
                tracing::warn!(error = %e, "an E2B create failed and its Idempotency-Key could not be released; it expires in a day");
            }
            Err(refused)
        }
    }
}

/// What a create asks for, checked before anything is made: its network, its environment, the
/// runtime of its template (or of the key's snapshot it names).
struct CreatePlan {
    /// It gets a network of its own (the key is granted some egress and its rules admit some).
    networked: bool,
    /// Its egress rules as stored.
    egress: serde_json::Value,
    /// Its ports need its traffic access token.
    private: bool,
    env_vars: std::collections::BTreeMap<String, String>,
    /// The key's snapshot its template names, restored into it once made.
    from_snapshot: Option<super::snapshots::Snapshot>,
    runtime: &'static aegis_core::runtimes::Runtime,
}

/// Checks a create's request and plans it ([`CreatePlan`]); every refusal here leaves nothing.
async fn plan_create(
    state: &AppState,
    caller: &Caller,
    req: &NewSandbox,
) -> Result<CreatePlan, Refusal> {
    req.check(&aegis_e2b::api::Limits::default())
        .map_err(Refusal)?;
    // Egress: the sandbox's own rules, bounded by what the operator grants the key; a
    // sandbox that can reach nothing gets no network (and may come from a warm pool).
    let rules = NetworkRules::new(
        req.network.as_ref().and_then(|n| n.allow_out.clone()),
        req.network.as_ref().and_then(|n| n.deny_out.clone()),
        req.allow_internet_access,
    )
    .map_err(|e| Refusal(ApiError::bad_request(e.to_string())))?;
    let networked = !grant_of(state, caller).is_nothing() && rules.admits_anything();
    let egress =
        serde_json::to_value(&rules).map_err(|e| Refusal(ApiError::new(500, e.to_string())))?;
    let private = req.network.as_ref().and_then(|n| n.allow_public_traffic) == Some(false);
    let env_vars = req.env_vars.clone().unwrap_or_default();
    if let Some(name) = env_vars
        .keys()
        .find(|n| aegis_policy::command::CommandPolicy::forbidden_env(n))
    {
        return Err(Refusal(ApiError::bad_request(format!(
            "envVars: `{name}` may never be set (it changes which code runs, or makes a program run another)"
        ))));
    }
    // A template is a runtime, or one of the key's snapshots (by id or name).
    let from_snapshot = match services::template_runtime(&req.template_id) {
        Ok(_) => None,
        Err(e) => Some(
            super::snapshots::find(&state.pool, &caller.id, &req.template_id)
                .await
                .map_err(db)?
                .ok_or_else(|| Refusal(sandbox_error(e)))?,
        ),
    };
    let runtime = services::template_runtime(
        from_snapshot
            .as_ref()
            .map_or(req.template_id.as_str(), |s| s.runtime.as_str()),
    )
    .map_err(|e| Refusal(sandbox_error(e)))?;
    // `autoPauseMemory: true` is honoured by the classes whose pause keeps memory (gVisor).
    let keeps_memory =
        control::isolation_of(state, &runtime.image) == Some(dispatcher::Isolation::Gvisor);
    let unsupported: Vec<&str> = req
        .extensions()
        .into_iter()
        .filter(|e| !(keeps_memory && *e == "autoPauseMemory"))
        .collect();
    if !unsupported.is_empty() {
        let why = if unsupported.contains(&"autoPauseMemory") {
            format!(
                " (template {} runs in the container class, whose pause keeps files only; \
                 gVisor templates keep memory)",
                req.template_id
            )
        } else {
            String::new()
        };
        return Err(Refusal(ApiError::bad_request(format!(
            "this node does not offer {}{why} (see README, E2B clients)",
            unsupported.join(", ")
        ))));
    }
    Ok(CreatePlan {
        networked,
        egress,
        private,
        env_vars,
        from_snapshot,
        runtime,
    })
}

/// The one create both versions share: checks, sandbox, row, restore; the row it made.
async fn create_row(
    state: &AppState,
    caller: &Caller,
    req: NewSandbox,
    default_timeout: u32,
) -> Result<Row, Refusal> {
    let plan = plan_create(state, caller, &req).await?;
    let (networked, private, runtime) = (plan.networked, plan.private, plan.runtime);
    let timeout = req.timeout_secs(default_timeout);
    let token = new_token()?;
    let started = Instant::now();
    let made = control::create_for_e2b(state, caller, runtime, networked).await;
    let metadata = req.metadata.clone().unwrap_or_default();
    let row = match &made {
        Ok((id, _)) => {
            let row = store::insert(
                &state.pool,
                &store::NewRow {
                    sandbox_id: id.0,
                    tenant: &caller.tenant,
                    owner_key_id: &caller.id,
                    template_id: &req.template_id,
                    metadata: &metadata,
                    env_vars: &plan.env_vars,
                    allow_internet_access: req.allow_internet_access,
                    envd_access_token: &token,
                    timeout_secs: timeout,
                    pause_on_timeout: req.auto_pause == Some(true),
                    pause_keeps_memory: req.auto_pause_memory != Some(false),
                    egress: networked.then_some(&plan.egress),
                    auto_resume: req.auto_resume(),
                    mask_request_host: req.host_mask(),
                },
            )
            .await;
            if row.is_err() {
                let _ = control::discard(
                    state,
                    caller,
                    *id,
                    "E2B create: its row could not be stored",
                )
                .await;
            }
            Some(row)
        }
        Err(_) => None,
    };
    let ok = matches!(row, Some(Ok(_)));
    aegis_store::audit::record_admin_of(
        &state.pool,
        caller,
        "e2b.sandbox.create",
        &json!({"templateID": req.template_id, "timeout": timeout, "metadata_keys": metadata.len(),
                "network": networked}),
        ok,
        started,
        made.as_ref().ok().map(|(id, _)| id.0),
    )
    .await
    .map_err(db)?;
    let row = match (made, row) {
        (Err(e), _) => return Err(Refusal(sandbox_error(e))),
        (Ok(_), Some(Ok(row))) => row,
        (Ok(_), Some(Err(e))) => return Err(db(e)),
        (Ok(_), None) => return Err(db(sqlx::Error::Protocol("no row".into()))),
    };
    if let Some(snapshot) = &plan.from_snapshot {
        if let Err(e) = lifecycle::restore_into(state, caller, &row, snapshot).await {
            undo_create(state, caller, &row, "its snapshot could not be restored").await?;
            return Err(e);
        }
    }
    if let Err(e) = services::start(
        state,
        caller,
        SandboxId(row.current),
        &row.env_vars.0,
        runtime,
    )
    .await
    {
        tracing::warn!(sandbox = %row.sandbox_id, error = %e, "E2B create: the template's server did not start; the sandbox goes");
        undo_create(state, caller, &row, "its template's server did not start").await?;
        return Err(Refusal(ApiError::new(503, e.to_string())));
    }
    let mut row = row;
    if private {
        row.traffic_access_token = Some(make_private(state, caller, &row).await?);
    }
    Ok(row)
}

/// Takes back a create whose last step failed (`why`): its sandbox goes (the reaper finishes
/// it if the engine cannot now) and its row with it.
async fn undo_create(
    state: &AppState,
    caller: &Caller,
    row: &Row,
    why: &str,
) -> Result<(), Refusal> {
    let _ = control::discard(state, caller, SandboxId(row.current), why).await;
    store::delete(&state.pool, row.sandbox_id).await.map_err(db)
}

/// Makes `row`'s sandbox private: a new traffic access token, which its ports then require.
/// A sandbox that cannot be made private is not left public: it goes.
async fn make_private(state: &AppState, caller: &Caller, row: &Row) -> Result<String, Refusal> {
    let made = match aegis_store::e2b::traffic::new_token() {
        Ok(token) => aegis_store::e2b::traffic::set_token(&state.pool, row.sandbox_id, &token)
            .await
            .map(|()| token)
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!("no randomness: {e}")),
    };
    let why = match made {
        Ok(token) => return Ok(token),
        Err(why) => why,
    };
    tracing::warn!(sandbox = %row.sandbox_id, %why, "E2B create: the sandbox could not be made private; it goes");
    let _ = control::discard(
        state,
        caller,
        SandboxId(row.current),
        "it could not be made private",
    )
    .await;
    store::delete(&state.pool, row.sandbox_id)
        .await
        .map_err(db)?;
    Err(Refusal(ApiError::new(
        503,
        format!("the sandbox could not be made private: {why}"),
    )))
}

/// `GET /sandboxes/{id}`.
pub async fn detail(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
) -> Answer {
    let row = known(&state, &caller, &id).await?;
    let grant = grant_of(&state, &caller);
    let rules = rules_of(&row).filter(|_| !grant.is_nothing());
    let has_egress = rules.as_ref().is_some_and(NetworkRules::admits_anything);
    let detail = SandboxDetail {
        sandbox: listed(&row),
        envd_access_token: row.envd_access_token.clone(),
        // What it really has: no network reads as everything denied; otherwise its own rules,
        // with the operator's bound beside them.
        allow_internet_access: Some(has_egress),
        domain: Some(state.config.e2b.domain.clone()),
        network: Some(aegis_e2b::api::NetworkConfig {
            allow_public_traffic: Some(row.traffic_access_token.is_none()),
            mask_request_host: row.mask_request_host.clone(),
            allow_out: rules
                .as_ref()
                .map(|r| r.allow_out.clone())
                .filter(|a| !a.is_empty()),
            deny_out: match &rules {
                Some(r) if r.deny_out.is_empty() => None,
                Some(r) => Some(r.deny_out.clone()),
                None => Some(vec![aegis_sandboxes::e2b_egress::ALL_TRAFFIC.to_owned()]),
            },
            ..Default::default()
        }),
        egress_grant: Some(grant.report()),
        lifecycle: Some(aegis_e2b::api::SandboxLifecycle {
            auto_resume: row.auto_resume,
            on_timeout: if row.pause_on_timeout {
                aegis_e2b::api::OnTimeout::Pause
            } else {
                aegis_e2b::api::OnTimeout::Kill
            },
        }),
        pause_mode: match (state_of(&row) == SandboxState::Paused, row.paused_snapshot) {
            (false, _) => None,
            (true, Some(snapshot)) if keeps_memory(&state, snapshot).await? => {
                Some(aegis_e2b::api::PauseMode::Full)
            }
            (true, _) => Some(aegis_e2b::api::PauseMode::Filesystem),
        },
    };
    Ok(to_json(StatusCode::OK, &detail))
}

async fn owned_rows(state: &AppState, caller: &Caller) -> Result<Vec<Row>, Refusal> {
    store::list_owned(&state.pool, &caller.id, None, MAX_LISTED)
        .await
        .map_err(db)
}

/// `GET /sandboxes`: every running sandbox of the key matching the metadata filter.
pub async fn list_v1(
    State(state): State<AppState>,
    Key(caller): Key,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = ListQuery::parse_v1(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    let rows = owned_rows(&state, &caller).await?;
    let out: Vec<ListedSandbox> = rows
        .iter()
        .filter(|r| q.matches_metadata(&r.metadata.0))
        .map(listed)
        .collect();
    Ok(to_json(StatusCode::OK, &out))
}

/// `GET /v2/sandboxes`: filtered by metadata, state (running, paused) and start
/// time, ordered, one page at a time (`X-Next-Token` names where the next page starts).
pub async fn list_v2(
    State(state): State<AppState>,
    Key(caller): Key,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = ListQuery::parse_v2(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    // A running row may report paused already (its timeout pauses it and passed), so both
    // kinds are read and then kept by the state each reports.
    let mut rows: Vec<Row> = owned_rows(&state, &caller).await?;
    if q.includes_state(SandboxState::Paused) {
        rows.extend(
            store::list_paused(&state.pool, &caller.id, MAX_LISTED)
                .await
                .map_err(db)?,
        );
    }
    rows.retain(|r| {
        q.includes_state(state_of(r))
            && q.matches_metadata(&r.metadata.0)
            && q.started_after.is_none_or(|t| r.started_at >= t)
            && q.template.as_ref().is_none_or(|t| *t == r.template_id)
            && q.next_token
                .as_ref()
                .is_none_or(|c| c.admits(q.order, r.started_at, &r.sandbox_id.to_string()))
    });
    let key = |r: &Row| (r.started_at, r.sandbox_id.to_string());
    match q.order {
        Order::Asc => rows.sort_by_key(key),
        Order::Desc => rows.sort_by_key(|r| std::cmp::Reverse(key(r))),
    }
    let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    let page: Vec<ListedSandbox> = rows.iter().map(listed).collect();
    let next = rows.last().filter(|_| more).map(|last| Cursor {
        at: last.started_at,
        id: last.sandbox_id.to_string(),
    });
    Ok(paged(to_json(StatusCode::OK, &page), next))
}

/// `DELETE /sandboxes/{id}`: destroys the sandbox with its workspace; 404 when the key has no
/// such sandbox (the SDK's `kill` then answers false).
pub async fn kill(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
) -> Answer {
    let row = row_for(&state, &caller, &id, KILL, Held::Known).await?;
    let uuid = row.sandbox_id;
    let started = Instant::now();
    let paused = row.paused_snapshot.is_some();
    let args = if paused {
        json!({"sandboxID": uuid, "paused": true})
    } else {
        json!({"sandboxID": uuid})
    };
    let call = Control {
        action: KILL,
        sandbox: SandboxId(row.current),
        access: SandboxAccess::Destroy,
        args: &args,
    };
    let permit = permit(&state, &caller, call).await?;
    // A paused sandbox is its row and its snapshot, and when it kept its memory its
    // checkpointed sandbox: all go (the sandbox first; the sweep finishes one cut short). A
    // running one goes off the caller's path: unreachable when this returns, removed in the
    // background. One the dispatcher no longer has is gone already.
    let done = match &permit {
        Some(permit) if paused => permit.destroy().await,
        Some(permit) => permit.retire().await,
        None => Ok(()),
    };
    let gone = match &done {
        Ok(()) => true,
        Err(SandboxError::Dispatch(dispatcher::DispatchError::SandboxNotFound { .. })) => true,
        Err(_) => false,
    };
    if gone {
        store::delete(&state.pool, uuid).await.map_err(db)?;
        if let Some(snapshot) = row.paused_snapshot {
            super::snapshots::delete(&state.pool, snapshot)
                .await
                .map_err(db)?;
        }
    }
    match permit {
        Some(permit) => permit.finish(&args, gone).await.map(|_| ()),
        None => aegis_store::audit::record_admin(&state.pool, &caller, KILL, &args, gone, started)
            .await
            .map(|_| ()),
    }
    .map_err(db)?;
    match done {
        Err(e) if !gone => Err(Refusal(sandbox_error(e))),
        _ => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// The audit action of a kill.
const KILL: &str = "e2b.sandbox.kill";

async fn deadline(
    state: &AppState,
    caller: &Caller,
    id: &str,
    secs: u32,
    extend_only: bool,
) -> Result<Row, Refusal> {
    let limits = aegis_e2b::api::Limits::default();
    if secs > limits.max_timeout_secs {
        return Err(Refusal(ApiError::bad_request(format!(
            "timeout {secs} s is longer than this node's limit of {} s",
            limits.max_timeout_secs
        ))));
    }
    let uuid = sandbox_id(id)?;
    store::set_deadline(&state.pool, uuid, &caller.id, secs, extend_only)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
pub async fn set_timeout(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SandboxTimeoutRequest = parse_body(&body, MAX_BODY).map_err(Refusal)?;
    deadline(&state, &caller, &id, req.timeout, false).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/refreshes`: the sandbox lives `duration` more seconds (default the
/// v1 create default).
pub async fn refresh(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SandboxRefreshRequest = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    req.check().map_err(Refusal)?;
    let secs = req.duration.unwrap_or(DEFAULT_TIMEOUT_SECS);
    deadline(&state, &caller, &id, secs, false).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect`: the running sandbox, alive at least `timeout` more seconds
/// (a connect never shortens its life), 200; a paused one is resumed first
/// ([`lifecycle::resume_row`]: its files back, no process), 201.
pub async fn connect(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: ConnectSandbox = parse_body(&body, MAX_BODY).map_err(Refusal)?;
    let secs = req.required_timeout().map_err(Refusal)?;
    connect_for(state, caller, id, secs).await
}

/// `POST /v2/sandboxes/{id}/connect` (SDKs from 2.51): the same, its timeout optional (absent:
/// five minutes, the v2 default).
pub async fn connect_v2(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: ConnectSandbox = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    let secs = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS_V2);
    connect_for(state, caller, id, secs).await
}

async fn connect_for(state: AppState, caller: Caller, id: String, secs: u32) -> Answer {
    let (row, resumed) = connect_row(&state, &caller, &id, secs).await?;
    Ok(to_json(
        if resumed {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &created_answer(&row, &state.config.e2b.domain),
    ))
}

/// What a connect does, answered or not: a running sandbox lives at least `secs` more, a
/// paused one is resumed (`true`: it was) as `caller`, with its audit row.
async fn connect_row(
    state: &AppState,
    caller: &Caller,
    id: &str,
    secs: u32,
) -> Result<(Row, bool), Refusal> {
    let running = deadline(state, caller, id, secs, true).await;
    if !matches!(&running, Err(Refusal(ApiError { code: 404, .. }))) {
        return running.map(|row| (row, false));
    }
    // Not running: perhaps a pause is under way (a timeout's, while it checkpoints, seconds
    // under gVisor). It ends first, so that what is read next is the pause to undo, never the
    // half-paused row (which a wake by traffic would take for "gone").
    if let Ok(uuid) = id.parse::<Uuid>() {
        store::wait_for_pause(&state.pool, uuid).await.map_err(db)?;
    }
    let paused = match known(state, caller, id).await {
        Ok(row) if row.paused_snapshot.is_some() => row,
        Ok(_) | Err(Refusal(ApiError { code: 404, .. })) => {
            return running.map(|row| (row, false));
        }
        Err(e) => return Err(e),
    };
    let row = lifecycle::resume_row(state, caller, &paused, secs).await?;
    Ok((row, true))
}

/// How long a sandbox woken by traffic lives before its timeout pauses it again: what E2B's
/// edge asks of its API when it auto-resumes one.
pub const WAKE_SECS: u32 = 600;

/// Wakes the paused sandbox `id` for a request to one of its ports (`autoResume`), exactly as
/// `connect()` would as `owner`, its owner key: the same resume, single flight per id on this
/// replica (`lifecycle::resume_row`), the same `e2b.sandbox.resume` audit row. A sandbox whose
/// timeout passed and whose pause the sweep has not yet taken simply lives on.
pub async fn wake(state: &AppState, owner: &Caller, id: Uuid) -> Result<Row, Refusal> {
    connect_row(state, owner, &id.to_string(), WAKE_SECS)
        .await
        .map(|(row, _)| row)
}

/// A page's answer with the cursor of the next page, when there is one, in
/// [`NEXT_TOKEN_HEADER`] (the sandbox and snapshot listings page alike).
pub(super) fn paged(mut response: Response, next: Option<Cursor>) -> Response {
    if let Some(value) = next.and_then(|c| HeaderValue::from_str(&c.encode()).ok()) {
        response.headers_mut().insert(NEXT_TOKEN_HEADER, value);
    }
    response
}
/// The state E2B reports of a row: paused once its pause snapshot is stored, and also from the
/// moment a timeout that pauses it passed (the sweep is taking the snapshot; envd already
/// refuses it, as `store::envd_target` serves no sandbox past its deadline).
pub fn state_of(row: &Row) -> SandboxState {
    if row.paused() {
        SandboxState::Paused
    } else {
        SandboxState::Running
    }
}
