//! The control API's query strings: sandbox listings (v1 and v2, with metadata, state,
//! template and start-time filters, order and pages), snapshot listings, metrics and logs.
//!
//! The metadata filter arrives encoded three times over. The SDK percent-encodes each key and
//! value, joins them as a form (`k=v&k2=v2`, encoding again), and its HTTP client encodes that
//! string as the value of the `metadata` parameter. [`ListQuery::parse_v2`] takes the raw query
//! string (as it follows `?` in the URL) and undoes all three; [`parse_metadata_filter`] takes
//! the parameter's value once the query string itself is decoded (what a framework's query
//! extractor hands over). Malformed escapes are refused, not passed through.

use std::collections::BTreeMap;

use base64::Engine as _;
use chrono::{DateTime, Utc};

use super::bodies::LogLevel;
use super::error::ApiError;
use super::sandbox::SandboxState;
use crate::query::{decode, form_pairs, params};

/// Page size when a listing names none.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// Largest page a listing may ask for.
pub const MAX_PAGE_LIMIT: u32 = 100;
/// Most metadata pairs in one filter.
const MAX_FILTER_PAIRS: usize = 64;
/// Most ids in `sandbox_ids`.
const MAX_SANDBOX_IDS: usize = 100;
/// Longest id inside a page token.
const MAX_CURSOR_ID_BYTES: usize = 128;
/// Longest `search` of a logs query.
const MAX_LOG_SEARCH_BYTES: usize = 256;
/// Most log entries one logs query may ask for.
const MAX_LOG_LIMIT: u32 = 1000;

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// The metadata filter from the `metadata` parameter's decoded value (`user%3Dabc&app=prod`
/// style: a form whose keys and values are percent-encoded once more). Every pair must match
/// for a sandbox to be listed; a key given twice is refused.
pub fn parse_metadata_filter(value: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut filter = BTreeMap::new();
    for (key, val) in form_pairs(value, "metadata", MAX_FILTER_PAIRS)? {
        let key = decode(&key, "metadata key")?;
        let val = decode(&val, "metadata value")?;
        if key.is_empty() {
            return Err(bad("metadata: empty key".to_owned()));
        }
        if filter.insert(key.clone(), val).is_some() {
            return Err(bad(format!(
                "metadata: key {key:?} is given more than once"
            )));
        }
    }
    Ok(filter)
}

/// `sandbox_ids=a,b,c`: at most 100 ids, each non-empty; repeats collapse.
pub fn parse_sandbox_ids(value: &str) -> Result<Vec<String>, ApiError> {
    let mut ids: Vec<String> = Vec::new();
    for id in value.split(',') {
        let id = id.trim();
        if id.is_empty() {
            return Err(bad("sandbox_ids: empty id".to_owned()));
        }
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_owned());
        }
        if ids.len() > MAX_SANDBOX_IDS {
            return Err(bad(format!("sandbox_ids: more than {MAX_SANDBOX_IDS} ids")));
        }
    }
    Ok(ids)
}

/// Listing order by start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    Asc,
    /// Newest first: the API's default.
    #[default]
    Desc,
}

/// Where a page ended: the last listed item's time and id. Carried to the client as an opaque
/// token (`X-Next-Token`) and back as `nextToken`; the next page holds the items after it in
/// the listing's order, so items added meanwhile neither repeat nor shift the pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at: DateTime<Utc>,
    pub id: String,
}

impl Cursor {
    /// The token: base64url of `<microseconds>:<id>`.
    pub fn encode(&self) -> String {
        let text = format!("{}:{}", self.at.timestamp_micros(), self.id);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// Reads a token this node issued; anything else is refused.
    pub fn decode(token: &str) -> Result<Cursor, ApiError> {
        let refused = || bad("nextToken is not a page token of this node".to_owned());
        if token.len() > 4 * MAX_CURSOR_ID_BYTES {
            return Err(refused());
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| refused())?;
        let text = String::from_utf8(bytes).map_err(|_| refused())?;
        let (micros, id) = text.split_once(':').ok_or_else(refused)?;
        let micros: i64 = micros.parse().map_err(|_| refused())?;
        let at = DateTime::from_timestamp_micros(micros).ok_or_else(refused)?;
        let id_ok = !id.is_empty()
            && id.len() <= MAX_CURSOR_ID_BYTES
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !id_ok {
            return Err(refused());
        }
        Ok(Cursor {
            at,
            id: id.to_owned(),
        })
    }

    /// Whether an item (its time and id) comes after this cursor in `order` (time, then id).
    pub fn admits(&self, order: Order, at: DateTime<Utc>, id: &str) -> bool {
        let item = (at, id);
        let cursor = (self.at, self.id.as_str());
        match order {
            Order::Asc => item > cursor,
            Order::Desc => item < cursor,
        }
    }
}

fn limit(value: Option<&String>, default: u32, max: u32, min: u32) -> Result<u32, ApiError> {
    let Some(text) = value else {
        return Ok(default);
    };
    match text.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(bad(format!("limit must be an integer from {min} to {max}"))),
    }
}

fn non_empty(value: Option<&String>) -> Option<String> {
    value.filter(|v| !v.is_empty()).cloned()
}

/// The `metadata` filter of a listing, empty when absent.
fn metadata_param(p: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ApiError> {
    match non_empty(p.get("metadata")) {
        Some(value) => parse_metadata_filter(&value),
        None => Ok(BTreeMap::new()),
    }
}

/// The `nextToken` of a listing, if any.
fn cursor_param(p: &BTreeMap<String, String>) -> Result<Option<Cursor>, ApiError> {
    non_empty(p.get("nextToken"))
        .map(|token| Cursor::decode(&token))
        .transpose()
}

/// `GET /v2/sandboxes` (and `GET /sandboxes`, whose only filter is metadata).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListQuery {
    /// Every pair must be in a sandbox's metadata.
    pub metadata: BTreeMap<String, String>,
    /// The states to list; `None` when the query names none (the API then lists running and
    /// paused sandboxes).
    pub states: Option<Vec<SandboxState>>,
    pub order: Order,
    /// Only sandboxes started at or after this instant.
    pub started_after: Option<DateTime<Utc>>,
    /// Only sandboxes of this template (id or alias).
    pub template: Option<String>,
    pub next_token: Option<Cursor>,
    pub limit: u32,
}

impl ListQuery {
    /// Reads a v2 listing's raw query string. Unknown parameters are ignored (a newer SDK may
    /// send more); known ones must be well-formed.
    pub fn parse_v2(raw_query: &str) -> Result<ListQuery, ApiError> {
        let p = params(raw_query)?;
        let metadata = metadata_param(&p)?;
        let states = match p.get("state") {
            None => None,
            Some(text) => {
                let mut states = Vec::new();
                for name in text.split(',') {
                    let state = SandboxState::parse(name.trim()).ok_or_else(|| {
                        bad(format!(
                            "state: {:?} is not a state (running, paused)",
                            name.chars().take(32).collect::<String>()
                        ))
                    })?;
                    if !states.contains(&state) {
                        states.push(state);
                    }
                }
                Some(states)
            }
        };
        let order = match p.get("order").map(String::as_str) {
            None => Order::Desc,
            Some("asc") => Order::Asc,
            Some("desc") => Order::Desc,
            Some(_) => return Err(bad("order must be asc or desc".to_owned())),
        };
        let started_after = match p.get("startedAfter") {
            None => None,
            Some(text) => Some(
                DateTime::parse_from_rfc3339(text)
                    .map_err(|_| bad("startedAfter must be an RFC 3339 date-time".to_owned()))?
                    .with_timezone(&Utc),
            ),
        };
        let next_token = cursor_param(&p)?;
        Ok(ListQuery {
            metadata,
            states,
            order,
            started_after,
            template: non_empty(p.get("template")),
            next_token,
            limit: limit(p.get("limit"), DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, 1)?,
        })
    }

    /// Reads a v1 listing's raw query string: running sandboxes, the metadata filter only,
    /// one page of every match.
    pub fn parse_v1(raw_query: &str) -> Result<ListQuery, ApiError> {
        let p = params(raw_query)?;
        let metadata = metadata_param(&p)?;
        Ok(ListQuery {
            metadata,
            states: Some(vec![SandboxState::Running]),
            limit: u32::MAX,
            ..ListQuery::default()
        })
    }

    /// Whether a sandbox's metadata holds every pair of the filter.
    pub fn matches_metadata(&self, metadata: &BTreeMap<String, String>) -> bool {
        self.metadata
            .iter()
            .all(|(k, v)| metadata.get(k).is_some_and(|have| have == v))
    }

    /// Whether the listing includes sandboxes in `state`.
    pub fn includes_state(&self, state: SandboxState) -> bool {
        self.states.as_ref().is_none_or(|s| s.contains(&state))
    }
}

/// `GET /snapshots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotsQuery {
    /// Only snapshots taken from this sandbox.
    pub sandbox_id: Option<String>,
    /// Only snapshots of this name or id.
    pub name: Option<String>,
    pub next_token: Option<Cursor>,
    pub limit: u32,
}

impl SnapshotsQuery {
    /// Reads the raw query string.
    pub fn parse(raw_query: &str) -> Result<SnapshotsQuery, ApiError> {
        let p = params(raw_query)?;
        let next_token = cursor_param(&p)?;
        Ok(SnapshotsQuery {
            sandbox_id: non_empty(p.get("sandboxID")),
            name: non_empty(p.get("name")),
            next_token,
            limit: limit(p.get("limit"), DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, 1)?,
        })
    }
}

/// `GET /sandboxes/{id}/metrics`: an interval in seconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsQuery {
    pub start: Option<i64>,
    pub end: Option<i64>,
}

impl MetricsQuery {
    /// Reads the raw query string; `start` after `end` is refused.
    pub fn parse(raw_query: &str) -> Result<MetricsQuery, ApiError> {
        let p = params(raw_query)?;
        let seconds = |name: &str| -> Result<Option<i64>, ApiError> {
            match p.get(name) {
                None => Ok(None),
                Some(text) => match text.parse::<i64>() {
                    Ok(n) if n >= 0 => Ok(Some(n)),
                    _ => Err(bad(format!("{name} must be whole seconds since the epoch"))),
                },
            }
        };
        let query = MetricsQuery {
            start: seconds("start")?,
            end: seconds("end")?,
        };
        if let (Some(s), Some(e)) = (query.start, query.end) {
            if s > e {
                return Err(bad("start is after end".to_owned()));
            }
        }
        Ok(query)
    }
}

/// Reading order of logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogsDirection {
    #[default]
    Forward,
    Backward,
}

/// `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsQuery {
    /// Milliseconds since the epoch to start from.
    pub cursor: Option<i64>,
    pub limit: u32,
    pub direction: LogsDirection,
    /// The lowest level returned.
    pub level: Option<LogLevel>,
    /// A case-sensitive substring of the message.
    pub search: Option<String>,
}

/// `GET /sandboxes/{id}/logs` (v1, deprecated by E2B for v2): from `start` (milliseconds
/// since the epoch) on, oldest first, at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsV1Query {
    pub start: Option<i64>,
    pub limit: u32,
}

impl LogsV1Query {
    /// Reads the raw query string.
    pub fn parse(raw_query: &str) -> Result<LogsV1Query, ApiError> {
        let p = params(raw_query)?;
        let start = match p.get("start") {
            None => None,
            Some(text) => match text.parse::<i64>() {
                Ok(n) if n >= 0 => Some(n),
                _ => return Err(bad("start must be milliseconds since the epoch".to_owned())),
            },
        };
        Ok(LogsV1Query {
            start,
            limit: limit(p.get("limit"), MAX_LOG_LIMIT, MAX_LOG_LIMIT, 0)?,
        })
    }
}

impl LogsQuery {
    /// Reads the raw query string.
    pub fn parse(raw_query: &str) -> Result<LogsQuery, ApiError> {
        let p = params(raw_query)?;
        let cursor = match p.get("cursor") {
            None => None,
            Some(text) => match text.parse::<i64>() {
                Ok(n) if n >= 0 => Some(n),
                _ => return Err(bad("cursor must be milliseconds since the epoch".to_owned())),
            },
        };
        let direction = match p.get("direction").map(String::as_str) {
            None | Some("forward") => LogsDirection::Forward,
            Some("backward") => LogsDirection::Backward,
            Some(_) => return Err(bad("direction must be forward or backward".to_owned())),
        };
        let level = match p.get("level") {
            None => None,
            Some(text) => Some(
                LogLevel::parse(text)
                    .ok_or_else(|| bad("level must be debug, info, warn or error".to_owned()))?,
            ),
        };
        let search = non_empty(p.get("search"));
        if search
            .as_ref()
            .is_some_and(|s| s.len() > MAX_LOG_SEARCH_BYTES)
        {
            return Err(bad(format!(
                "search is longer than {MAX_LOG_SEARCH_BYTES} bytes"
            )));
        }
        Ok(LogsQuery {
            cursor,
            limit: limit(p.get("limit"), MAX_LOG_LIMIT, MAX_LOG_LIMIT, 0)?,
            direction,
            level,
            search,
        })
    }
}
