//! `seal.v1.Gateway`: SEAL over gRPC, through the very same gateway code as HTTP.
//!
//! Refusals become gRPC statuses: UNAUTHENTICATED for 1xxx and 3xxx, PERMISSION_DENIED for 2xxx,
//! RESOURCE_EXHAUSTED for rate limits. The message is "<code> <NAME>: <text>" and the status
//! details carry the RFC error body as JSON bytes, so a client gets the SEAL code either way.

use chrono::Utc;
use serde_json::Value;
use tonic::{Code, Request, Response, Status};

use super::pb::seal::gateway_server::{Gateway, GatewayServer};
use super::pb::seal::{
    AttestRequest, AttestResponse, InvokeRequest, InvokeResponse, ListToolsRequest,
    ListToolsResponse,
};
use crate::seal::error::{SealCode, SealError};
use crate::state::AppState;

struct GatewayService {
    state: AppState,
}

/// The tonic service for `seal.v1.Gateway`.
pub(super) fn service(state: AppState) -> GatewayServer<impl Gateway> {
    GatewayServer::new(GatewayService { state })
}

/// Maps a SEAL error (and its RFC body) to a gRPC status.
fn status(e: &SealError, body: &Value) -> Status {
    let code = if e.retry_after_secs.is_some() || e.code == SealCode::RateLimitExceeded {
        Code::ResourceExhausted
    } else if e.code.is_policy() {
        Code::PermissionDenied
    } else {
        Code::Unauthenticated
    };
    Status::with_details(code, e.to_string(), body.to_string().into_bytes().into())
}

fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn attest(
        &self,
        request: Request<AttestRequest>,
    ) -> Result<Response<AttestResponse>, Status> {
        let source = request.remote_addr().map(|a| a.ip());
        let r = request.into_inner();
        let req = crate::gateway::AttestRequest {
            public_key: r.public_key,
            workload_id: r.workload_id,
            security_context: r.security_context,
            attestation_secret: (!r.attestation_secret.is_empty()).then_some(r.attestation_secret),
            attestation_token: (!r.attestation_token.is_empty()).then_some(r.attestation_token),
        };
        match self
            .state
            .gateway
            .attest(&self.state.gateway_services(), req, source)
            .await
        {
            Ok(body) => Ok(Response::new(AttestResponse {
                response_json: bytes(&body),
            })),
            Err(e) => Err(status(&e, &e.attestation_error_body())),
        }
    }

    async fn invoke(
        &self,
        request: Request<InvokeRequest>,
    ) -> Result<Response<InvokeResponse>, Status> {
        let raw = request.into_inner().envelope_json;
        let text = match String::from_utf8(raw) {
            Ok(t) => t,
            Err(_) => {
                let e = SealError::new(
                    SealCode::MalformedEnvelope,
                    "the envelope is not UTF-8 JSON",
                );
                return Err(status(&e, &e.error_body(None, Utc::now())));
            }
        };
        let invoked = crate::metrics::through(
            crate::metrics::Door::SealGrpc,
            self.state
                .gateway
                .invoke(&self.state.gateway_services(), &text),
        )
        .await;
        match invoked {
            Ok(body) => Ok(Response::new(InvokeResponse {
                response_json: bytes(&body),
            })),
            Err(refusal) => {
                let body = refusal
                    .error
                    .error_body(refusal.request_id.as_ref(), Utc::now());
                Err(status(&refusal.error, &body))
            }
        }
    }

    async fn list_tools(
        &self,
        request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let token = request.into_inner().security_token;
        match self
            .state
            .gateway
            .tools_for_token(&self.state.gateway_services(), &token)
            .await
        {
            Ok(body) => Ok(Response::new(ListToolsResponse {
                response_json: bytes(&body),
            })),
            Err(e) => Err(status(&e, &e.error_body(None, Utc::now()))),
        }
    }
}
