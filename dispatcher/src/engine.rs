//! A handle on the Docker Engine API.
//!
//! One `DockerEngine` is created at start-up and shared; bollard multiplexes requests over the
//! engine's socket. The handle is cheap to clone.

use std::time::Duration;

use bollard::Docker;

/// Why the container engine could not be reached or answered wrongly.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The client could not even be set up (bad `DOCKER_HOST`, missing socket path).
    #[error("cannot connect to the Docker engine: {0}")]
    Connect(#[source] bollard::errors::Error),
    /// The engine did not answer within the allotted time.
    #[error("the Docker engine did not answer within {0:?}")]
    Timeout(Duration),
    /// The engine answered with an error.
    #[error("the Docker engine answered with an error: {0}")]
    Api(#[source] bollard::errors::Error),
    /// `docker info` carried no engine ID, so this engine cannot be told from another.
    #[error("the Docker engine reports no ID (docker info), so it cannot be told from others")]
    NoId,
}

/// The engine's identity, `<ID>@<name>:<data root>` from `docker info`: the same for every
/// replica that drives the daemon and across its restarts. Placement and the reaper tell
/// engines apart by it (`node_instances.engine`, `sandboxes.engine`). The ID alone is not
/// enough: Docker 20.10 derives it from `/etc/docker/key.json`, which a second daemon on the
/// same host (or a cloned machine) shares; the host name and the data root tell those apart.
/// `docker` must speak an API version the engine accepts (the dispatcher's negotiated client).
pub(crate) async fn engine_id(docker: &Docker) -> Result<String, EngineError> {
    let info = docker.info().await.map_err(EngineError::Api)?;
    // Every engine this node supports reports one; refuse rather than guess.
    let id = info
        .id
        .filter(|id| !id.is_empty())
        .ok_or(EngineError::NoId)?;
    Ok(format!(
        "{id}@{}:{}",
        info.name.unwrap_or_default(),
        info.docker_root_dir.unwrap_or_default()
    ))
}

/// Shared client for the local Docker engine.
#[derive(Clone, Debug)]
pub struct DockerEngine {
    docker: Docker,
}

impl DockerEngine {
    /// Connects using `DOCKER_HOST` when set, else the platform's default socket.
    ///
    /// Connecting is lazy in bollard: this only validates the address; `ping` proves the engine is there.
    pub fn connect(host: Option<&str>) -> Result<Self, EngineError> {
        let docker = match host {
            Some(host) if host.starts_with("unix://") => {
                Docker::connect_with_unix(host, 120, bollard::API_DEFAULT_VERSION)
            }
            Some(host) if host.starts_with("tcp://") || host.starts_with("http://") => {
                Docker::connect_with_http(host, 120, bollard::API_DEFAULT_VERSION)
            }
            Some(path) => Docker::connect_with_unix(path, 120, bollard::API_DEFAULT_VERSION),
            None => Docker::connect_with_local_defaults(),
        }
        .map_err(EngineError::Connect)?;
        Ok(Self { docker })
    }

    /// Asks the engine to answer within `timeout`; used by readiness and start-up checks.
    pub async fn ping(&self, timeout: Duration) -> Result<(), EngineError> {
        match tokio::time::timeout(timeout, self.docker.ping()).await {
            Err(_) => Err(EngineError::Timeout(timeout)),
            Ok(Err(e)) => Err(EngineError::Api(e)),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// The engine's version string, for `aegis.system.info` and start-up logs.
    pub async fn version(&self) -> Result<String, EngineError> {
        let v = self.docker.version().await.map_err(EngineError::Api)?;
        Ok(v.version.unwrap_or_else(|| "unknown".to_owned()))
    }

    /// Whether `image` is present locally (this node never pulls), so a caller can refuse work
    /// that needs a missing runtime with a clear message before anything is started.
    pub async fn image_present(&self, image: &str) -> Result<bool, EngineError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if crate::error::is_not_found(&e) => Ok(false),
            Err(e) => Err(EngineError::Api(e)),
        }
    }

    /// The raw bollard client, for the dispatcher's own modules.
    pub fn client(&self) -> &Docker {
        &self.docker
    }
}
