//! A minimal Docker Engine API client over the Unix socket, shared by the benchmarks as their raw
//! baseline (what a bare `docker exec` costs, without our dispatcher). Each example uses a subset.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::{BENCH_LABEL, SANDBOX_USER};

/// Talks HTTP/1.1 to the engine's Unix socket, one connection per request.
pub struct Engine {
    socket: PathBuf,
}

pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

pub struct ExecOutput {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

impl Engine {
    /// `DOCKER_HOST=unix://...` when set, else `/var/run/docker.sock`.
    pub fn from_env() -> Result<Self> {
        let socket = match std::env::var("DOCKER_HOST") {
            Ok(h) if !h.is_empty() => match h.strip_prefix("unix://") {
                Some(path) => PathBuf::from(path),
                None => bail!(
                    "DOCKER_HOST={h}: the benchmark's baseline client speaks only unix:// sockets"
                ),
            },
            _ => PathBuf::from("/var/run/docker.sock"),
        };
        Ok(Self { socket })
    }

    /// One request on a fresh connection; with `upgrade`, the hijacked stream is the body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        upgrade: bool,
    ) -> Result<Reply> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let exchange = async {
            let mut stream = tokio::net::UnixStream::connect(&self.socket)
                .await
                .with_context(|| format!("connecting to {}", self.socket.display()))?;
            let payload = match body {
                Some(v) => serde_json::to_vec(v)?,
                None => Vec::new(),
            };
            let mut head = format!("{method} {path} HTTP/1.1\r\nHost: docker\r\n");
            head.push_str(if upgrade {
                "Connection: Upgrade\r\nUpgrade: tcp\r\n"
            } else {
                "Connection: close\r\n"
            });
            if body.is_some() {
                head.push_str("Content-Type: application/json\r\n");
            }
            head.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
            let mut request = head.into_bytes();
            request.extend_from_slice(&payload);
            stream.write_all(&request).await?;
            let mut raw = Vec::with_capacity(8192);
            stream.read_to_end(&mut raw).await?;
            Ok::<_, anyhow::Error>(raw)
        };
        let raw = tokio::time::timeout(ENGINE_TIMEOUT, exchange)
            .await
            .map_err(|_| anyhow!("{method} {path}: no answer from the engine within 60 s"))??;
        parse_reply(&raw).with_context(|| format!("{method} {path}"))
    }

    /// A request whose 2xx answer is JSON (or empty).
    pub async fn json(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let reply = self.request(method, path, body, false).await?;
        if !(200..300).contains(&reply.status) {
            bail!(
                "{method} {path}: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body).trim()
            );
        }
        if reply.body.is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_slice(&reply.body)?)
    }

    /// `docker exec` as the sandbox user: create, start attached (output to EOF), inspect.
    pub async fn exec(&self, container: &str, argv: &[&str]) -> Result<ExecOutput> {
        let created = self
            .json(
                "POST",
                &format!("/containers/{container}/exec"),
                Some(&json!({
                    "AttachStdin": false, "AttachStdout": true, "AttachStderr": true,
                    "Tty": false, "Cmd": argv, "User": SANDBOX_USER, "WorkingDir": "/workspace",
                })),
            )
            .await?;
        let id = created["Id"]
            .as_str()
            .ok_or_else(|| anyhow!("exec create answered without Id: {created}"))?;
        let started = self
            .request(
                "POST",
                &format!("/exec/{id}/start"),
                Some(&json!({"Detach": false, "Tty": false})),
                true,
            )
            .await?;
        if started.status != 101 && started.status != 200 {
            bail!(
                "exec start: {} {}",
                started.status,
                String::from_utf8_lossy(&started.body)
            );
        }
        let (stdout, stderr) = demux(&started.body)?;
        for _ in 0..1000 {
            let info = self.json("GET", &format!("/exec/{id}/json"), None).await?;
            if info["Running"] == false {
                let exit_code = info["ExitCode"]
                    .as_i64()
                    .ok_or_else(|| anyhow!("exec inspect without ExitCode: {info}"))?;
                return Ok(ExecOutput {
                    exit_code,
                    stdout,
                    stderr,
                });
            }
            tokio::task::yield_now().await;
        }
        bail!("exec {id} still running after its output ended")
    }

    /// Create + start of a container; returns its id.
    pub async fn create_and_start(&self, name: &str, body: &Value) -> Result<String> {
        let created = self
            .json(
                "POST",
                &format!("/containers/create?name={name}"),
                Some(body),
            )
            .await?;
        let id = created["Id"]
            .as_str()
            .ok_or_else(|| anyhow!("container create answered without Id: {created}"))?
            .to_owned();
        if let Err(e) = self
            .json("POST", &format!("/containers/{id}/start"), None)
            .await
        {
            let _ = self.remove_container(&id).await;
            return Err(e);
        }
        Ok(id)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let reply = self
            .request(
                "DELETE",
                &format!("/containers/{id}?force=true&v=true"),
                None,
                false,
            )
            .await?;
        if !(200..300).contains(&reply.status) && reply.status != 404 {
            bail!(
                "removing container {id}: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            );
        }
        Ok(())
    }

    /// Removes containers and volumes of the sandbox scope and containers of this run's label.
    pub async fn remove_labelled(&self, scope: Option<&str>, run_id: &str) -> Result<usize> {
        let mut labels = vec![format!("{BENCH_LABEL}={run_id}")];
        if let Some(scope) = scope {
            labels.push(format!("{}={scope}", dispatcher::labels::SCOPE));
        }
        let mut removed = 0;
        for label in &labels {
            let filter = encode(&json!({"label": [label]}).to_string());
            let list = self
                .json(
                    "GET",
                    &format!("/containers/json?all=1&filters={filter}"),
                    None,
                )
                .await?;
            for c in list.as_array().into_iter().flatten() {
                if let Some(id) = c["Id"].as_str() {
                    self.remove_container(id).await?;
                    removed += 1;
                }
            }
            let list = self
                .json("GET", &format!("/volumes?filters={filter}"), None)
                .await?;
            for v in list["Volumes"].as_array().into_iter().flatten() {
                if let Some(name) = v["Name"].as_str() {
                    let _ = self
                        .request("DELETE", &format!("/volumes/{name}"), None, false)
                        .await?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Splits an HTTP/1.1 response into status and (de-chunked) body.
fn parse_reply(raw: &[u8]) -> Result<Reply> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("the engine's answer has no header end"))?;
    let head = std::str::from_utf8(&raw[..end]).context("header is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line in {head:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        }
    }
    let rest = &raw[end + 4..];
    let body = if status == 101 {
        rest.to_vec()
    } else if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        rest[..n.min(rest.len())].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Reply { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunked body"))?;
        let size_text = std::str::from_utf8(&rest[..line_end])?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size {
            bail!("truncated chunk");
        }
        body.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// Splits Docker's multiplexed stream (8-byte frame headers) into stdout and stderr.
fn demux(mut raw: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while !raw.is_empty() {
        if raw.len() < 8 {
            bail!("truncated frame header in the exec stream");
        }
        let size = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]) as usize;
        let payload = raw
            .get(8..8 + size)
            .ok_or_else(|| anyhow!("truncated frame in the exec stream"))?;
        match raw[0] {
            2 => stderr.extend_from_slice(payload),
            _ => stdout.extend_from_slice(payload),
        }
        raw = &raw[8 + size..];
    }
    Ok((stdout, stderr))
}
