//! A SEAL client: attest, sign envelopes, call tools, over HTTP or gRPC.
//!
//! It is what `orchestrator seal attest|call` uses and what the test suite drives the gateway
//! with. Its key is ephemeral (made at construction, never written unless the caller saves the
//! session), and it builds the signed bytes with the same canonical form the Python SDK uses.

use base64::Engine;
use chrono::{DateTime, SecondsFormat, Utc};
use ed25519_dalek::{Signer, SigningKey};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use aegis_proto::seal::gateway_client::GatewayClient;
use aegis_proto::seal::{AttestRequest, InvokeRequest, ListToolsRequest};
use aegis_seal::canonical;

/// Where the gateway is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Transport {
    /// `http://host:port` (REST: `/v1/seal/*`).
    Http(String),
    /// `http://host:port` of the gRPC listener (`seal.v1.Gateway`).
    Grpc(String),
}

/// A refusal or a transport failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The gateway refused: HTTP status (or gRPC code), SEAL code and message.
    #[error("refused ({status}): {code} {message}")]
    Refused {
        /// HTTP status, or the gRPC code number.
        status: u16,
        /// SEAL code (0 when the body had none).
        code: u32,
        /// The message.
        message: String,
        /// The whole error body.
        body: Value,
    },
    /// The gateway could not be reached or answered something unreadable.
    #[error("transport: {0}")]
    Transport(String),
    /// `call_tool` before `attest`.
    #[error("not attested yet")]
    NotAttested,
}

/// What a workload presents at attestation to prove who it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proof {
    /// The context's enrolment secret.
    pub secret: Option<String>,
    /// A one-time attestation token an operator issued.
    pub token: Option<String>,
}

/// Everything needed to continue a session later (what `orchestrator seal attest` saves).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedSession {
    /// Gateway location.
    pub transport: Transport,
    /// Base64 of the 32-byte Ed25519 seed.
    pub seed: String,
    /// The security token.
    pub security_token: String,
    /// The session id.
    pub session_id: String,
}

/// One client session. Connections are reused across calls (one HTTP pool, one gRPC channel).
pub struct SealClient {
    transport: Transport,
    key: SigningKey,
    token: Option<String>,
    session_id: Option<String>,
    http: reqwest::Client,
    channel: tokio::sync::OnceCell<tonic::transport::Channel>,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl SealClient {
    /// A client with a fresh ephemeral key.
    pub fn new(transport: Transport) -> Result<Self, ClientError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| ClientError::Transport(format!("random: {e}")))?;
        Ok(Self {
            transport,
            key: SigningKey::from_bytes(&seed),
            token: None,
            session_id: None,
            http: reqwest::Client::new(),
            channel: tokio::sync::OnceCell::new(),
        })
    }

    /// Restores a saved session.
    pub fn from_saved(saved: &SavedSession) -> Result<Self, ClientError> {
        let seed = base64::engine::general_purpose::STANDARD
            .decode(&saved.seed)
            .ok()
            .and_then(|s| <[u8; 32]>::try_from(s.as_slice()).ok())
            .ok_or_else(|| {
                ClientError::Transport("the saved seed is not 32 bytes of Base64".into())
            })?;
        Ok(Self {
            transport: saved.transport.clone(),
            key: SigningKey::from_bytes(&seed),
            token: Some(saved.security_token.clone()),
            session_id: Some(saved.session_id.clone()),
            http: reqwest::Client::new(),
            channel: tokio::sync::OnceCell::new(),
        })
    }

    /// What `from_saved` needs.
    pub fn save(&self) -> Option<SavedSession> {
        Some(SavedSession {
            transport: self.transport.clone(),
            seed: b64(self.key.as_bytes()),
            security_token: self.token.clone()?,
            session_id: self.session_id.clone()?,
        })
    }

    /// Standard Base64 of the public key, as attestation sends it.
    pub fn public_key_b64(&self) -> String {
        b64(self.key.verifying_key().as_bytes())
    }

    /// The token, once attested.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The session id, once attested.
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// Uses another token (tests: an expired or foreign one).
    pub fn set_token(&mut self, token: String) {
        self.token = Some(token);
    }

    /// Attests without proof (contexts with `allow_unverified`); keeps the token and session id.
    pub async fn attest(&mut self, workload_id: &str, context: &str) -> Result<Value, ClientError> {
        self.attest_with(workload_id, context, &Proof::default())
            .await
    }

    /// Attests presenting `proof`; keeps the token and session id.
    pub async fn attest_with(
        &mut self,
        workload_id: &str,
        context: &str,
        proof: &Proof,
    ) -> Result<Value, ClientError> {
        let mut request = json!({"public_key": self.public_key_b64(), "workload_id": workload_id, "security_context": context});
        if let Some(secret) = &proof.secret {
            request["attestation_secret"] = json!(secret);
        }
        if let Some(token) = &proof.token {
            request["attestation_token"] = json!(token);
        }
        let body = match &self.transport {
            Transport::Http(base) => {
                post(
                    &self.http,
                    &format!("{base}/v1/seal/attest"),
                    request.to_string(),
                )
                .await?
            }
            Transport::Grpc(endpoint) => {
                let mut client = self.grpc(endpoint).await?;
                let r = client
                    .attest(AttestRequest {
                        public_key: self.public_key_b64(),
                        workload_id: workload_id.to_owned(),
                        security_context: context.to_owned(),
                        attestation_secret: proof.secret.clone().unwrap_or_default(),
                        attestation_token: proof.token.clone().unwrap_or_default(),
                    })
                    .await
                    .map_err(refused_grpc)?;
                parse(&r.into_inner().response_json)?
            }
        };
        self.token = body["security_token"].as_str().map(str::to_owned);
        self.session_id = body["session_id"].as_str().map(str::to_owned);
        Ok(body)
    }

    /// A signed envelope for `payload` at time `at`.
    pub fn envelope(&self, payload: &Value, at: DateTime<Utc>) -> Result<Value, ClientError> {
        self.envelope_with(payload, at, canonical::Escaping::Utf8)
    }

    /// A signed envelope whose signature covers non-ASCII text escaped as `escaping` says
    /// (`Ascii` is what a client using `json.dumps` defaults signs).
    pub fn envelope_with(
        &self,
        payload: &Value,
        at: DateTime<Utc>,
        escaping: canonical::Escaping,
    ) -> Result<Value, ClientError> {
        let token = self.token.as_deref().ok_or(ClientError::NotAttested)?;
        let parsed = canonical::parse_preserving(&payload.to_string())
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        let message = canonical::signed_message_with(&parsed, token, at.timestamp(), escaping);
        let signature = self.key.sign(&message);
        Ok(json!({
            "protocol": "seal/v1",
            "security_token": token,
            "signature": b64(&signature.to_bytes()),
            "payload": payload,
            "timestamp": at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }))
    }

    /// Sends an envelope as is; the success body.
    pub async fn send(&self, envelope: &Value) -> Result<Value, ClientError> {
        match &self.transport {
            Transport::Http(base) => {
                post(
                    &self.http,
                    &format!("{base}/v1/seal/invoke"),
                    envelope.to_string(),
                )
                .await
            }
            Transport::Grpc(endpoint) => {
                let mut client = self.grpc(endpoint).await?;
                let r = client
                    .invoke(InvokeRequest {
                        envelope_json: envelope.to_string().into_bytes(),
                    })
                    .await
                    .map_err(refused_grpc)?;
                parse(&r.into_inner().response_json)
            }
        }
    }

    /// Calls a tool; the MCP result (`payload.result`).
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, ClientError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| ClientError::Transport(e.to_string()))?;
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let payload = json!({"jsonrpc": "2.0", "id": format!("req-{id}"), "method": "tools/call",
                             "params": {"name": name, "arguments": arguments}});
        let envelope = self.envelope(&payload, Utc::now())?;
        let body = self.send(&envelope).await?;
        Ok(body["payload"]["result"].clone())
    }

    /// The tools this session may call.
    pub async fn list_tools(&self) -> Result<Value, ClientError> {
        let token = self.token.as_deref().ok_or(ClientError::NotAttested)?;
        match &self.transport {
            Transport::Http(base) => {
                let r = self
                    .http
                    .get(format!("{base}/v1/seal/tools"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .map_err(|e| ClientError::Transport(e.to_string()))?;
                answer(r).await
            }
            Transport::Grpc(endpoint) => {
                let mut client = self.grpc(endpoint).await?;
                let r = client
                    .list_tools(ListToolsRequest {
                        security_token: token.to_owned(),
                    })
                    .await
                    .map_err(refused_grpc)?;
                parse(&r.into_inner().response_json)
            }
        }
    }
}

async fn post(http: &reqwest::Client, url: &str, body: String) -> Result<Value, ClientError> {
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| ClientError::Transport(e.to_string()))?;
    answer(r).await
}

async fn answer(r: reqwest::Response) -> Result<Value, ClientError> {
    let status = r.status().as_u16();
    let body: Value = r
        .json()
        .await
        .map_err(|e| ClientError::Transport(e.to_string()))?;
    if (200..300).contains(&status) && body["status"] != "error" {
        return Ok(body);
    }
    let code = body["error"]["code"]
        .as_u64()
        .or_else(|| body["error_code"].as_u64())
        .unwrap_or(0) as u32;
    let message = body["error"]["message"]
        .as_str()
        .or_else(|| body["message"].as_str())
        .unwrap_or_default()
        .to_owned();
    Err(ClientError::Refused {
        status,
        code,
        message,
        body,
    })
}

impl SealClient {
    /// The gRPC client on the shared channel (connected on first use).
    async fn grpc(
        &self,
        endpoint: &str,
    ) -> Result<GatewayClient<tonic::transport::Channel>, ClientError> {
        let channel = self
            .channel
            .get_or_try_init(|| async {
                tonic::transport::Endpoint::from_shared(endpoint.to_owned())
                    .map_err(|e| ClientError::Transport(e.to_string()))?
                    .connect()
                    .await
                    .map_err(|e| ClientError::Transport(e.to_string()))
            })
            .await?;
        Ok(GatewayClient::new(channel.clone()))
    }
}

fn parse(bytes: &[u8]) -> Result<Value, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Transport(e.to_string()))
}

fn refused_grpc(status: tonic::Status) -> ClientError {
    let body: Value = serde_json::from_slice(status.details()).unwrap_or(Value::Null);
    let code = body["error"]["code"]
        .as_u64()
        .or_else(|| body["error_code"].as_u64())
        .unwrap_or(0) as u32;
    ClientError::Refused {
        status: status.code() as u16,
        code,
        message: status.message().to_owned(),
        body,
    }
}
