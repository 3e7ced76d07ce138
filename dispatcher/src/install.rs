//! Delivering the executor binary into sandboxes: one read-only, content-addressed volume.
//!
//! Docker refuses archive uploads into a container whose root filesystem is read-only, and the
//! executor must exist before the container starts (it is the entrypoint). So the binary lives in
//! a named volume, `aegis-executor-<sha256 prefix>`, that every sandbox mounts read-only at
//! `/opt/sandbox`. The volume is filled once per binary: a helper container that mounts it
//! read-write is created (never started) and the binary is uploaded into it as a tar archive; a
//! marker file written after the binary says the volume is complete.
//!
//! The volume is named by the binary's hash, so a new executor gets a new volume and sandboxes
//! still running keep the binary they started with. It is shared by every orchestrator on the
//! engine and carries no `org.aegis.managed` label: the reaper never removes it (old ones are a
//! megabyte each; `docker volume rm` them when no sandbox uses them). A node stopping with
//! `shutdown.sandboxes: destroy` removes it when no other node on the engine beats (beacons) and
//! no container mounts it, so `docker-compose down -v` leaves nothing; a node that finds it gone
//! before creating a sandbox installs it again.
//!
//! Concurrent installers (parallel tests, replicas starting together) are serialized with a
//! Postgres advisory lock keyed by the hash, so a half-written binary is never seen as complete.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, CreateContainerOptionsBuilder, ListImagesOptions,
    RemoveContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::DispatcherConfig;
use crate::error::{db, engine, is_not_found, DispatchError, Result};
use crate::labels;
use crate::ustar;

/// Where the executor volume is mounted in every sandbox.
pub const EXECUTOR_DIR: &str = "/opt/sandbox";
/// The executor's file name inside the volume.
pub const EXECUTOR_NAME: &str = "sandbox-executor";

/// The result of an install: which volume to mount.
#[derive(Debug, Clone)]
pub(crate) struct ExecutorVolume {
    /// The volume's name.
    pub name: String,
    /// Hex SHA-256 of the binary.
    pub sha256: String,
}

impl ExecutorVolume {
    /// The entrypoint path inside a sandbox.
    pub fn entrypoint() -> String {
        format!("{EXECUTOR_DIR}/{EXECUTOR_NAME}")
    }
}

/// Makes sure the executor volume for `config.executor_path` exists and is complete.
pub(crate) async fn install(
    docker: &Docker,
    pg: &PgPool,
    config: &DispatcherConfig,
    scope: &crate::store::Scope,
    instance: Uuid,
) -> Result<ExecutorVolume> {
    let path = &config.executor_path;
    let binary = read_binary(path).await?;
    let arch = docker
        .version()
        .await
        .map_err(engine("asking the engine for its architecture"))?
        .arch
        .unwrap_or_default();
    check_binary(path, &binary, &arch)?;

    let sha256 = hex(&Sha256::digest(&binary));
    let volume = ExecutorVolume {
        name: format!("aegis-executor-{}", &sha256[..16]),
        sha256,
    };
    let marker = format!(".installed-{}", volume.sha256);

    // Serialize installers of the same binary across every process using this PostgreSQL
    // cluster; the transaction-scoped lock is released however this function returns.
    let mut tx = pg
        .begin()
        .await
        .map_err(db("locking the executor install"))?;
    let key = i64::from_str_radix(&volume.sha256[..15], 16).unwrap_or_default();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(key)
        .execute(&mut *tx)
        .await
        .map_err(db("locking the executor install"))?;

    let step = |step: &'static str, name: &str| {
        let volume = name.to_owned();
        move |source| DispatchError::ExecutorInstall {
            volume,
            step,
            source,
        }
    };
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(volume.name.clone()),
            labels: Some(HashMap::from([
                (labels::COMPONENT.to_owned(), "executor".to_owned()),
                (labels::EXECUTOR_SHA256.to_owned(), volume.sha256.clone()),
            ])),
            ..Default::default()
        })
        .await
        .map_err(step("creating the volume", &volume.name))?;

    let helper_image = helper_image(docker, config).await?;
    let helper = format!("aegis-executor-installer-{}", Uuid::new_v4().simple());
    let body = helper_body(helper_image, instance, scope, &volume.name);
    docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(&helper).build()),
            body,
        )
        .await
        .map_err(step("creating the helper container", &volume.name))?;

    let outcome = fill(docker, &helper, &volume, &marker, &binary).await;
    if let Err(e) = docker
        .remove_container(
            &helper,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
    {
        tracing::warn!(container = %helper, error = %e, "could not remove the executor install helper; the reaper will");
    }
    outcome?;
    tx.commit()
        .await
        .map_err(db("unlocking the executor install"))?;
    Ok(volume)
}

/// Reading the binary is the first step: a missing file and an unreadable one are told apart.
async fn read_binary(path: &std::path::Path) -> Result<Vec<u8>> {
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(DispatchError::ExecutorMissing {
            path: path.to_owned(),
        }),
        Err(e) => Err(DispatchError::ExecutorInvalid {
            path: path.to_owned(),
            reason: format!("cannot read it: {e}"),
        }),
    }
}

/// The helper container that fills the volume: never started, no network, the volume mounted
/// writable at the executor's directory, labelled so the reaper removes it if this does not.
fn helper_body(
    helper_image: String,
    instance: Uuid,
    scope: &crate::store::Scope,
    volume_name: &str,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(helper_image),
        // Never started: the entrypoint only has to satisfy images without a CMD.
        entrypoint: Some(vec![ExecutorVolume::entrypoint()]),
        labels: Some(
            [
                (labels::MANAGED.to_owned(), "true".to_owned()),
                (labels::INSTANCE.to_owned(), instance.to_string()),
                (
                    labels::COMPONENT.to_owned(),
                    "executor-installer".to_owned(),
                ),
            ]
            .into_iter()
            .chain(scope.labels())
            .collect(),
        ),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            mounts: Some(vec![Mount {
                target: Some(EXECUTOR_DIR.to_owned()),
                source: Some(volume_name.to_owned()),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Uploads the binary and then the marker, unless the marker is already there.
async fn fill(
    docker: &Docker,
    helper: &str,
    volume: &ExecutorVolume,
    marker: &str,
    binary: &[u8],
) -> Result<()> {
    let marker_path = format!("{EXECUTOR_DIR}/{marker}");
    match docker
        .get_container_archive_info(
            helper,
            Some(
                ContainerArchiveInfoOptionsBuilder::new()
                    .path(&marker_path)
                    .build(),
            ),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(volume = %volume.name, "sandbox executor already installed");
            return Ok(());
        }
        Err(e) if is_not_found(&e) => {}
        Err(source) => {
            return Err(DispatchError::ExecutorInstall {
                volume: volume.name.clone(),
                step: "checking for the install marker",
                source,
            })
        }
    }
    let started = Instant::now();
    tracing::info!(volume = %volume.name, bytes = binary.len(), "installing the sandbox executor into its volume");
    // The binary first, the marker last: tar entries are extracted in order, so the marker
    // exists only once the binary is complete.
    let mut archive = Vec::with_capacity(binary.len() + 4096);
    tar_append(&mut archive, EXECUTOR_NAME, 0o555, binary);
    tar_append(&mut archive, marker, 0o444, volume.sha256.as_bytes());
    archive.extend_from_slice(&[0u8; 1024]);
    docker
        .upload_to_container(
            helper,
            Some(
                UploadToContainerOptionsBuilder::new()
                    .path(EXECUTOR_DIR)
                    .build(),
            ),
            bollard::body_full(archive.into()),
        )
        .await
        .map_err(|source| DispatchError::ExecutorInstall {
            volume: volume.name.clone(),
            step: "uploading the binary",
            source,
        })?;
    tracing::info!(
        volume = %volume.name,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "sandbox executor installed"
    );
    Ok(())
}

/// The image for the stopped helper: configured, else the first pool image, else any local one.
async fn helper_image(docker: &Docker, config: &DispatcherConfig) -> Result<String> {
    if let Some(image) = config
        .helper_image
        .clone()
        .or_else(|| config.pool.keys().next().cloned())
    {
        return Ok(image);
    }
    let images = docker
        .list_images(Some(ListImagesOptions::default()))
        .await
        .map_err(engine("listing images for the executor install helper"))?;
    let mut tagged: Vec<(bool, i64, String)> = images
        .into_iter()
        .filter_map(|i| {
            let tag = i.repo_tags.into_iter().find(|t| t != "<none>:<none>")?;
            Some((!tag.starts_with("aegis-runtime/"), i.size, tag))
        })
        .collect();
    tagged.sort();
    tagged
        .into_iter()
        .next()
        .map(|(_, _, tag)| tag)
        .ok_or_else(|| DispatchError::ImageMissing {
            image: "any image (to host the executor install helper)".to_owned(),
        })
}

/// Refuses anything but an executable, statically linked ELF for the engine's architecture.
pub(crate) fn check_binary(path: &Path, bytes: &[u8], engine_arch: &str) -> Result<()> {
    let invalid = |reason: String| {
        Err(DispatchError::ExecutorInvalid {
            path: path.to_owned(),
            reason,
        })
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => return invalid("not a regular file".into()),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                return invalid("not executable (chmod +x it)".into())
            }
            Ok(_) => {}
            Err(e) => return invalid(format!("cannot stat it: {e}")),
        }
    }
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return invalid("not an ELF executable".into());
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return invalid("not a 64-bit little-endian ELF".into());
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
    let e_type = u16_at(16);
    if e_type != 2 && e_type != 3 {
        return invalid("not an executable (ELF type is neither EXEC nor DYN)".into());
    }
    let machine = match u16_at(18) {
        62 => "amd64",
        183 => "arm64",
        other => return invalid(format!("unsupported ELF machine {other}")),
    };
    let engine_arch = match engine_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    if !engine_arch.is_empty() && engine_arch != machine {
        return invalid(format!(
            "built for {machine} but the Docker engine runs {engine_arch}"
        ));
    }
    let phoff = u64::from_le_bytes(bytes[32..40].try_into().unwrap_or_default()) as usize;
    let phentsize = u16_at(54) as usize;
    let phnum = u16_at(56) as usize;
    for i in 0..phnum {
        let at = phoff.saturating_add(i.saturating_mul(phentsize));
        let Some(header) = bytes.get(at..at.saturating_add(4)) else {
            return invalid("truncated ELF program headers".into());
        };
        // PT_INTERP: the file needs a dynamic loader, which a scratch or musl image lacks.
        if u32::from_le_bytes(header.try_into().unwrap_or_default()) == 3 {
            return invalid(
                "dynamically linked (it has an ELF interpreter); build it with \
                 RUSTFLAGS=\"-C target-feature=+crt-static\""
                    .into(),
            );
        }
    }
    Ok(())
}

/// Appends one regular file to a ustar archive (owner root, fixed mtime).
fn tar_append(archive: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]) {
    let entry = ustar::Entry {
        name: name.as_bytes(),
        kind: b'0',
        mode,
        owner: (0, 0),
        size: data.len() as u64,
        mtime: 0,
        link: b"",
    };
    entry.append_header(archive);
    archive.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    archive.extend(std::iter::repeat_n(0u8, pad));
}

/// Lower-case hex of a digest.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_header_is_well_formed() {
        let mut a = Vec::new();
        tar_append(&mut a, "x", 0o555, b"hello");
        assert_eq!(a.len(), 1024);
        assert_eq!(&a[257..262], b"ustar");
        assert_eq!(&a[124..135], b"00000000005");
        assert_eq!(&a[512..517], b"hello");
    }

    #[test]
    fn non_elf_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("dispatcher-check-{}", Uuid::new_v4()));
        std::fs::write(&dir, b"#!/bin/sh\necho hi\n").unwrap();
        let err = check_binary(&dir, b"#!/bin/sh\necho hi\n", "amd64").unwrap_err();
        let _ = std::fs::remove_file(&dir);
        assert!(err.to_string().contains("not executable") || err.to_string().contains("ELF"));
    }
}
