//! `seal.v1.Gateway`: SEAL over gRPC, through the very same gateway code as HTTP.
//!
//! Refusals become gRPC statuses: UNAUTHENTICATED for 1xxx and 3xxx, PERMISSION_DENIED for 2xxx,
//! RESOURCE_EXHAUSTED for rate limits. The message is "<code> <NAME>: <text>" and the status
//! details carry the RFC error body as JSON bytes, so a client gets the SEAL code either way.
//!
//! `InvokeStream` is `Invoke` in its streaming form (`api/streaming.rs`): the same checks and
//! refusals (as the call's status, before any message), then a foreground `cmd.run`'s pid and
//! output as it comes, and last the answer `Invoke` gives. A cancelled call kills its command.

use chrono::Utc;
use serde_json::Value;
use tonic::{Code, Request, Response, Status};

use super::pb::seal::gateway_server::{Gateway, GatewayServer};
use super::pb::seal::{
    invoke_stream_response, AttestRequest, AttestResponse, InvokeRequest, InvokeResponse,
    InvokeStreamResponse, ListToolsRequest, ListToolsResponse,
};
use crate::api::streaming::{seal_invoke, Next};
use crate::gateway::Refusal;
use crate::seal::error::{SealCode, SealError};
use crate::state::AppState;
use crate::tools::OutputChunk;

/// The messages of `InvokeStream`.
type InvokeStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<InvokeStreamResponse, Status>> + Send + 'static>,
>;

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

/// An envelope's text, or the refusal of one that is not UTF-8.
fn envelope_text(raw: Vec<u8>) -> Result<String, Status> {
    String::from_utf8(raw).map_err(|_| {
        let e = SealError::new(
            SealCode::MalformedEnvelope,
            "the envelope is not UTF-8 JSON",
        );
        status(&e, &e.error_body(None, Utc::now()))
    })
}

/// A refusal of the gateway as the status `Invoke` answers.
fn refused(refusal: Refusal) -> Status {
    let body = refusal
        .error
        .error_body(refusal.request_id.as_ref(), Utc::now());
    status(&refusal.error, &body)
}

fn chunk_message(chunk: OutputChunk) -> InvokeStreamResponse {
    let event = match chunk {
        OutputChunk::Started { pid } => invoke_stream_response::Event::StartedPid(pid),
        OutputChunk::Stdout(b) => invoke_stream_response::Event::Stdout(b),
        OutputChunk::Stderr(b) => invoke_stream_response::Event::Stderr(b),
    };
    InvokeStreamResponse { event: Some(event) }
}

/// The last message of `InvokeStream`: `Invoke`'s answer, or its status.
fn last_message(
    ended: Result<Result<Value, Refusal>, String>,
) -> Result<InvokeStreamResponse, Status> {
    match ended {
        Ok(Ok(body)) => Ok(InvokeStreamResponse {
            event: Some(invoke_stream_response::Event::ResponseJson(bytes(&body))),
        }),
        Ok(Err(refusal)) => Err(refused(refusal)),
        Err(failed) => Err(Status::internal(failed)),
    }
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

    type InvokeStreamStream = InvokeStream;

    async fn invoke(
        &self,
        request: Request<InvokeRequest>,
    ) -> Result<Response<InvokeResponse>, Status> {
        let text = envelope_text(request.into_inner().envelope_json)?;
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
            Err(refusal) => Err(refused(refusal)),
        }
    }

    /// `Invoke` in its streaming form (`api/streaming.rs`): nothing is answered before the
    /// command started or the call ended, so every refusal is the status `Invoke` gives; a
    /// client that cancels the call (or goes away) drops it, which kills the command.
    async fn invoke_stream(
        &self,
        request: Request<InvokeRequest>,
    ) -> Result<Response<Self::InvokeStreamStream>, Status> {
        let text = envelope_text(request.into_inner().envelope_json)?;
        let door = crate::metrics::Door::SealGrpc;
        let mut call = seal_invoke(self.state.clone(), door, text);
        let first = match call.next().await {
            Some(Next::Chunk(chunk)) => chunk_message(chunk),
            Some(Next::End(ended)) => {
                let only = last_message(ended)?;
                let once: InvokeStream = Box::pin(futures_util::stream::iter([Ok(only)]));
                return Ok(Response::new(once));
            }
            None => return Err(Status::internal("the call ended without an answer")),
        };
        let rest = futures_util::stream::unfold(Some(call), |call| async move {
            let mut call = call?;
            match call.next().await {
                Some(Next::Chunk(chunk)) => Some((Ok(chunk_message(chunk)), Some(call))),
                Some(Next::End(ended)) => Some((last_message(ended), None)),
                None => None,
            }
        });
        let messages: InvokeStream = Box::pin(futures_util::StreamExt::chain(
            futures_util::stream::once(async move { Ok(first) }),
            rest,
        ));
        Ok(Response::new(messages))
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
