//! E2B's control API (`E2B_API_URL`): JSON bodies, query strings and the error body, shaped as
//! E2B's SDK writes them and as its generated client parses them (field names exactly as on the
//! wire: `templateID`, `sandboxID`, `allow_internet_access`, ...). The SDK ignores response
//! fields it does not know but fails on a missing required one, so every required field of a
//! response type here is a plain (non-`Option`) field.
//!
//! Request types read leniently where the SDK may grow (unknown fields ignored) and strictly
//! where a wrong value would change meaning (types, ranges, enums), with the JSON path of the
//! offending field in the error.

mod bodies;
use crate::error_body as error;
mod list;
mod sandbox;

pub use bodies::{
    ConnectSandbox, LogLevel, ResumedSandbox, SandboxForkRequest, SandboxForkResult, SandboxLog,
    SandboxLogEntry, SandboxLogs, SandboxLogsV2Response, SandboxMetric, SandboxNetworkUpdateConfig,
    SandboxPauseRequest, SandboxRefreshRequest, SandboxSnapshotRequest, SandboxTimeoutRequest,
    SandboxesWithMetrics, SnapshotInfo, MAX_FORK_COUNT, MAX_REFRESH_SECS,
};
pub use error::{parse_body, parse_optional_body, ApiError};
pub use list::{
    parse_metadata_filter, parse_sandbox_ids, Cursor, ListQuery, LogsDirection, LogsQuery,
    LogsV1Query, MetricsQuery, Order, SnapshotsQuery, DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT,
};
pub use sandbox::{
    idempotency_key, AutoResume, EgressProxy, Limits, ListedSandbox, NetworkConfig, NewSandbox,
    OnTimeout, PauseMode, Sandbox, SandboxDetail, SandboxLifecycle, SandboxState, VolumeMount,
    API_KEY_HEADER, DEFAULT_TIMEOUT_SECS, DEFAULT_TIMEOUT_SECS_V2, ENVD_VERSION,
    IDEMPOTENCY_KEY_HEADER, NEXT_TOKEN_HEADER, TOTAL_RUNNING_HEADER,
};
