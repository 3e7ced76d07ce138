//! `orchestrator.v1.Node`: identity and readiness of this instance over gRPC.

use tonic::{Request, Response, Status};

use super::pb::orchestrator::node_server::{Node, NodeServer};
use super::pb::orchestrator::{GetInfoRequest, NodeInfo};
use crate::health;
use crate::state::AppState;

struct NodeService {
    state: AppState,
}

/// The tonic service for `orchestrator.v1.Node`.
pub(super) fn service(state: AppState) -> NodeServer<impl Node> {
    NodeServer::new(NodeService { state })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn get_info(&self, _: Request<GetInfoRequest>) -> Result<Response<NodeInfo>, Status> {
        let report =
            health::check(&self.state.pool, &self.state.docker, &self.state.sandboxes).await;
        Ok(Response::new(NodeInfo {
            instance_id: self.state.instance_id.to_string(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: self.state.started_at.to_rfc3339(),
            ready: report.is_ready(),
            failing: report.failing.iter().map(|s| (*s).to_owned()).collect(),
        }))
    }
}
