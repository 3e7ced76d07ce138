//! The gRPC surface (tonic): the standard health service, server reflection, and our services.
//!
//! The health service mirrors `/health/ready`: a background task re-checks readiness and flips
//! the serving status, so `grpc_health_probe`-style clients see the same truth as HTTP probes.

mod node;
mod seal;

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::server::Router;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tower::layer::util::{Identity, Stack};

use super::request_id::RequestIdLayer;
use crate::health;
use crate::state::AppState;

/// Generated protobuf types and service stubs (the `aegis-proto` crate, shared with clients).
pub use aegis_proto as pb;

/// The gRPC services with the request-id layer every call passes through, ready to serve.
pub type GrpcRouter = Router<Stack<RequestIdLayer, Identity>>;

/// Builds the gRPC router (every call inside its request-id span, the id in the response
/// metadata) and starts the task that keeps the health status current.
pub fn router(
    state: AppState,
    shutdown: CancellationToken,
) -> Result<GrpcRouter, tonic_reflection::server::Error> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(track_health(state.clone(), reporter, shutdown));

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    Ok(tonic::transport::Server::builder()
        .layer(RequestIdLayer::new("grpc"))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(node::service(state.clone()))
        .add_service(seal::service(state)))
}

/// Re-evaluates readiness every few seconds until shutdown, then reports NOT_SERVING.
async fn track_health(state: AppState, reporter: HealthReporter, shutdown: CancellationToken) {
    const SERVICES: [&str; 3] = ["", "orchestrator.v1.Node", "seal.v1.Gateway"];
    loop {
        let status = if health::check(&state.pool, &state.docker, &state.sandboxes)
            .await
            .is_ready()
        {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for s in SERVICES {
            reporter.set_service_status(s, status).await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
    }
    for s in SERVICES {
        reporter
            .set_service_status(s, ServingStatus::NotServing)
            .await;
    }
}
