//! Files in and out of a live sandbox's workspace as tar archives, through the engine.
//!
//! Persistent agent volumes (the orchestrator's `volumes/`) live in PostgreSQL between
//! executions and inside the workspace while one runs: they are copied in right after the
//! sandbox is ready and copied out before it is destroyed. The engine accepts archive uploads
//! into a volume even though the container's root filesystem is read-only, and it keeps the
//! owners recorded in the archive, so files come back owned by the sandbox user. Only paths
//! beneath the workspace are accepted, so nothing lands on (or is read from) the image.

use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;

use crate::dispatcher::Dispatcher;
use crate::error::{engine, DispatchError, Result};
use crate::hardening::{SANDBOX_GID, SANDBOX_UID};
use crate::spec::{SandboxId, WORKSPACE};

impl Dispatcher {
    /// The tar archive of the contents of `dir` (the workspace or a directory beneath it),
    /// entries relative to `dir`; refused once it passes `max_bytes`.
    pub async fn export_dir(&self, id: SandboxId, dir: &str, max_bytes: u64) -> Result<Vec<u8>> {
        beneath_workspace(dir)?;
        let sandbox = self.inner.attached(id).await?;
        let path = format!("{}/.", dir.trim_end_matches('/'));
        let mut stream = self.inner.docker.download_from_container(
            &sandbox.container,
            Some(
                DownloadFromContainerOptionsBuilder::new()
                    .path(&path)
                    .build(),
            ),
        );
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(engine(format!("copying {dir} out of sandbox {id}")))?;
            archive.extend_from_slice(&chunk);
            if archive.len() as u64 > max_bytes {
                return Err(DispatchError::ArchiveTooLarge {
                    id,
                    dir: dir.to_owned(),
                    max_bytes,
                });
            }
        }
        Ok(archive)
    }

    /// Unpacks `archive` into `dir` (the workspace or a directory beneath it, created first
    /// with its missing parents, owned by the sandbox user).
    pub async fn import_dir(&self, id: SandboxId, dir: &str, archive: Vec<u8>) -> Result<()> {
        let relative = beneath_workspace(dir)?;
        let sandbox = self.inner.attached(id).await?;
        let upload = |to: String, body: Vec<u8>| {
            let docker = self.inner.docker.clone();
            let container = sandbox.container.clone();
            async move {
                docker
                    .upload_to_container(
                        &container,
                        Some(UploadToContainerOptionsBuilder::new().path(&to).build()),
                        bollard::body_full(body.into()),
                    )
                    .await
                    .map_err(engine(format!("copying into {to} of sandbox {id}")))
            }
        };
        if !relative.is_empty() {
            upload(WORKSPACE.to_owned(), directories(&relative)).await?;
        }
        if !archive.is_empty() {
            upload(dir.trim_end_matches('/').to_owned(), archive).await?;
        }
        Ok(())
    }
}

/// `dir` relative to the workspace (empty for the workspace itself), or a refusal.
fn beneath_workspace(dir: &str) -> Result<String> {
    let trimmed = dir.trim_end_matches('/');
    let relative = if trimmed == WORKSPACE {
        ""
    } else {
        trimmed
            .strip_prefix(WORKSPACE)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| DispatchError::InvalidSpec {
                reason: format!("{dir} is not beneath {WORKSPACE}"),
            })?
    };
    if relative
        .split('/')
        .any(|s| s == ".." || s == "." || (s.is_empty() && !relative.is_empty()))
        || dir.contains('\0')
    {
        return Err(DispatchError::InvalidSpec {
            reason: format!("{dir} is not a normalised path"),
        });
    }
    Ok(relative.to_owned())
}

/// A tar archive of directory entries for `relative` and each of its parents, owned by the
/// sandbox user, mode 0755.
fn directories(relative: &str) -> Vec<u8> {
    let mut archive = Vec::new();
    let mut path = String::new();
    for part in relative.split('/') {
        path.push_str(part);
        path.push('/');
        let mut header = [0u8; 512];
        let name = path.as_bytes();
        header[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
        let octal = |field: &mut [u8], value: u64| {
            let digits = field.len() - 1;
            let text = format!("{value:0digits$o}");
            field[..digits].copy_from_slice(text.as_bytes());
        };
        octal(&mut header[100..108], 0o755);
        octal(&mut header[108..116], u64::from(SANDBOX_UID));
        octal(&mut header[116..124], u64::from(SANDBOX_GID));
        octal(&mut header[124..136], 0);
        octal(&mut header[136..148], 0);
        header[156] = b'5';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        archive.extend_from_slice(&header);
    }
    archive.extend_from_slice(&[0u8; 1024]);
    archive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_normalised_paths_beneath_the_workspace() {
        assert_eq!(beneath_workspace("/workspace").unwrap(), "");
        assert_eq!(beneath_workspace("/workspace/").unwrap(), "");
        assert_eq!(beneath_workspace("/workspace/a/b").unwrap(), "a/b");
        for bad in [
            "/etc",
            "/workspaces",
            "/workspace/../etc",
            "/workspace/a//b",
            "/workspace/./a",
        ] {
            assert!(beneath_workspace(bad).is_err(), "{bad}");
        }
        let tar = directories("a/b");
        assert_eq!(tar.len(), 512 * 2 + 1024);
        assert_eq!(&tar[..2], b"a/");
        assert_eq!(&tar[512..516], b"a/b/");
    }
}
