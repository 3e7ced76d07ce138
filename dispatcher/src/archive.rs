//! Files in and out of a live sandbox's workspace as tar archives, through the engine, as data
//! only.
//!
//! Persistent agent volumes (the orchestrator's `volumes.rs`) live in PostgreSQL between
//! executions and inside the workspace while one runs: they are copied in right after the
//! sandbox is ready and copied out before it is destroyed. The engine accepts archive uploads
//! into a volume even though the container's root filesystem is read-only. Only paths beneath
//! the workspace are accepted, and an archive never carries more than data:
//!
//! - **Out** ([`Dispatcher::export_dir`]): the engine follows a symbolic link anywhere on the
//!   path it is asked for except in the last component (observed on Docker 20.10:
//!   `GET /archive?path=/workspace/data` of a link answers the link itself, while `data/` and
//!   `data/.` answer the target's content, and `/workspace/a/sbin` with `a -> /usr` answers
//!   the image's `/usr/sbin`). So the engine is asked for the first component beneath the
//!   workspace (or the workspace itself), which it archives without following any link, and the
//!   volume's entries are taken from that stream: every component of the volume's path must
//!   appear as a directory entry, else nothing is saved. An agent that replaces its volume by a
//!   link to `/usr/sbin` saves nothing of the image.
//! - **In** ([`Dispatcher::import_dir`]): every entry is rewritten before the engine sees it
//!   (the engine keeps the owners, modes and types recorded in an archive): owner and group
//!   become the sandbox user, modes lose setuid, setgid and sticky bits, extended attributes
//!   (file capabilities) are dropped, and so are devices, FIFOs, names with `..`, symbolic
//!   links whose text is absolute or climbs out of the directory, hard links to anything but a
//!   regular file of the same archive, and anything beneath a non-directory. Missing parents are
//!   added as directories of the sandbox user (the engine would make them root's). So an archive
//!   saved before these rules, or written by anyone, restores as the sandbox user's plain files.
//!
//! The stream is parsed here (ustar, POSIX pax and GNU long names, as Go's `archive/tar` in the
//! engine writes them) rather than with a crate: the filter needs to read, rename and rewrite
//! headers incrementally while the engine streams (siblings of a nested volume are skipped
//! without being held in memory), and the format subset is small.

use std::collections::HashSet;

use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt;

use crate::dispatcher::Dispatcher;
use crate::error::{engine, is_not_found, DispatchError, Result};
use crate::hardening::{SANDBOX_GID, SANDBOX_UID};
use crate::spec::SandboxId;
#[cfg(test)]
use crate::spec::WORKSPACE;
use crate::ustar;

impl Dispatcher {
    /// [`Dispatcher::export_dir`] with the sandbox frozen while it is read (the kernel's cgroup
    /// freezer, the engine's pause): no process of it writes meanwhile, so the archive is the
    /// files as they were at one moment, not a mix of before and after a write. Tool calls wait
    /// out the freeze (the executor is frozen too); the sandbox is thawed whatever the export
    /// did, and a failure to thaw it is the error.
    pub async fn export_dir_frozen(
        &self,
        id: SandboxId,
        dir: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, crate::budget::Reservation)> {
        // One freeze at a time per sandbox: a second capture waits for the first (pausing a
        // paused container is an engine error, and thawing one would end the other's freeze).
        let lock = self.inner.freeze_lock(id);
        let _frozen_by_us = lock.lock().await;
        let sandbox = self.inner.attached(id).await?;
        // Counted against the node's memory bound as it is read: many captures at once fail
        // at the bound (nothing stored) instead of each buffering up to its own quota.
        let mut held = self.inner.memory.reserve(0)?;
        self.inner
            .docker
            .pause_container(&sandbox.container)
            .await
            .map_err(engine(format!("freezing sandbox {id} to read its files")))?;
        let exported = self
            .export_dir_within(id, dir, max_bytes, Some(&mut held))
            .await;
        self.inner
            .docker
            .unpause_container(&sandbox.container)
            .await
            .map_err(engine(format!(
                "thawing sandbox {id} after reading its files"
            )))?;
        Ok((exported?, held))
    }

    /// The node's bound on client data held in memory (`budget.rs`), for the buffers the
    /// orchestrator makes itself (a snapshot loaded to be restored).
    pub fn memory(&self) -> &crate::budget::MemoryBudget {
        &self.inner.memory
    }

    /// The tar archive of the contents of `dir` (the workspace or a directory beneath it),
    /// entries relative to `dir`, rewritten as the sandbox user's plain data; refused once it
    /// passes `max_bytes`, and refused when `dir` or a directory on its way is not a real
    /// directory (a symbolic link, a file, missing).
    pub async fn export_dir(&self, id: SandboxId, dir: &str, max_bytes: u64) -> Result<Vec<u8>> {
        self.export_dir_within(id, dir, max_bytes, None).await
    }

    /// [`Dispatcher::export_dir`], counting what it holds in `held` as it reads.
    async fn export_dir_within(
        &self,
        id: SandboxId,
        dir: &str,
        max_bytes: u64,
        mut held: Option<&mut crate::budget::Reservation>,
    ) -> Result<Vec<u8>> {
        let sandbox = self.inner.attached(id).await?;
        let workspace = sandbox.spec.workspace_dir().to_owned();
        let relative = beneath_workspace(dir, &workspace)?;
        // The engine archives the last component of the path it is given without following it,
        // but follows links in the components before: ask for the first component beneath the
        // workspace (a mount point, which cannot be replaced, is all that is resolved).
        let (request, prefix, parent) = if relative.is_empty() {
            let last = workspace.rsplit('/').next().unwrap_or_default();
            (workspace.clone(), vec![last.as_bytes().to_vec()], "")
        } else {
            let parts: Vec<Vec<u8>> = relative.split('/').map(|p| p.as_bytes().to_vec()).collect();
            let first = String::from_utf8_lossy(&parts[0]).into_owned();
            (format!("{workspace}/{first}"), parts, workspace.as_str())
        };
        let refused = |reason: String| DispatchError::ArchiveRefused {
            id,
            dir: dir.to_owned(),
            reason,
        };
        let mut filter = Filter::new(Scope::Beneath(prefix), parent, max_bytes);
        let mut stream = self.inner.docker.download_from_container(
            &sandbox.container,
            Some(
                DownloadFromContainerOptionsBuilder::new()
                    .path(&request)
                    .build(),
            ),
        );
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) if is_not_found(&e) => {
                    return Err(refused(format!(
                        "{request} does not exist: a volume must be a directory"
                    )))
                }
                Err(e) => return Err(engine(format!("copying {dir} out of sandbox {id}"))(e)),
            };
            if let Some(held) = held.as_deref_mut() {
                // Before the filter grows: what it will hold with this chunk, twice (a growing
                // buffer is copied into one twice its size, and both exist for a moment).
                held.grow_to(2 * (filter.held() + chunk.len()) as u64)?;
            }
            filter.push(&chunk).map_err(|e| match e {
                Refused::TooLarge => DispatchError::ArchiveTooLarge {
                    id,
                    dir: dir.to_owned(),
                    max_bytes,
                },
                other => refused(other.to_string()),
            })?;
        }
        let (archive, dropped) = filter.finish().map_err(|e| refused(e.to_string()))?;
        if dropped > 0 {
            tracing::info!(sandbox = %id, dir, dropped, "entries that are not plain data were left out of a saved directory");
        }
        Ok(archive)
    }

    /// Unpacks `archive` into `dir` (the workspace or a directory beneath it, created first
    /// with its missing parents, owned by the sandbox user), after rewriting it as the sandbox
    /// user's plain data (see the module's documentation); an archive that is not a tar stream
    /// is refused before anything is copied.
    pub async fn import_dir(&self, id: SandboxId, dir: &str, archive: Vec<u8>) -> Result<()> {
        let sandbox = self.inner.attached(id).await?;
        let workspace = sandbox.spec.workspace_dir().to_owned();
        let relative = beneath_workspace(dir, &workspace)?;
        let archive = if archive.is_empty() {
            archive
        } else {
            let mut filter = Filter::new(Scope::All, "", u64::MAX);
            // In slices, so the filter's buffer stays small next to the archive.
            let cleaned = archive
                .chunks(1 << 16)
                .try_for_each(|chunk| filter.push(chunk))
                .and_then(|()| filter.finish());
            let (cleaned, dropped) = cleaned.map_err(|e| DispatchError::ArchiveRefused {
                id,
                dir: dir.to_owned(),
                reason: e.to_string(),
            })?;
            if dropped > 0 {
                tracing::warn!(sandbox = %id, dir, dropped, "entries that are not plain data were left out of a restored directory");
            }
            cleaned
        };
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
            upload(workspace.clone(), directories(&relative)).await?;
        }
        if !archive.is_empty() {
            upload(dir.trim_end_matches('/').to_owned(), archive).await?;
        }
        Ok(())
    }
}

/// What a [`DataEntry`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// A directory.
    Dir,
    /// A regular file; its bytes are in [`DataEntry::data`].
    File,
    /// A symbolic link whose text ([`DataEntry::link`]) stays inside the archive's root.
    Symlink,
    /// A hard link to a regular file of the same archive ([`DataEntry::link`], its path).
    HardLink,
}

/// One entry of an archive read as plain data: a path relative to the archive's root (empty
/// for the root itself), its kind, its permission bits (never set-id or sticky) and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataEntry {
    /// Relative path, `/`-separated, without `.` or `..` components.
    pub path: String,
    /// What it is.
    pub kind: DataKind,
    /// Permission bits (`0o777` at most).
    pub mode: u32,
    /// A link's target (see [`DataKind`]); empty otherwise.
    pub link: String,
    /// A regular file's bytes; empty otherwise.
    pub data: Vec<u8>,
}

/// Reads `archive` as plain data, for a caller that restores it by other means than the engine
/// (the E2B door writes each file through its tool calls): the archive first passes the same
/// rewriting as [`Dispatcher::import_dir`] (owners, set-id bits, devices, links out of the root,
/// names with `..` all gone), then its entries are listed. Entries whose names are not UTF-8
/// are left out; the second value counts what was left out in all.
pub fn data_entries(archive: &[u8]) -> std::result::Result<(Vec<DataEntry>, usize), String> {
    if archive.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let mut filter = Filter::new(Scope::All, "", u64::MAX);
    archive
        .chunks(1 << 16)
        .try_for_each(|chunk| filter.push(chunk))
        .map_err(|e| e.to_string())?;
    let (clean, mut dropped) = filter.finish().map_err(|e| e.to_string())?;
    let mut entries = Vec::new();
    let mut pos = 0;
    let mut long_path: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut long_size: Option<u64> = None;
    while pos + BLOCK <= clean.len() {
        let block = &clean[pos..pos + BLOCK];
        pos += BLOCK;
        if block.iter().all(|&b| b == 0) {
            break;
        }
        let kind = block[156];
        let size = long_size
            .take()
            .or_else(|| number(&block[124..136]))
            .ok_or("bad size field")?;
        let size_usize = usize::try_from(size).map_err(|_| "entry too large")?;
        let end = pos
            .checked_add(size_usize)
            .filter(|&e| e <= clean.len())
            .ok_or("truncated entry")?;
        let data = &clean[pos..end];
        pos = end + padding(size) as usize;
        if kind == b'x' {
            for (key, value) in pax_records(data).map_err(|e| e.to_string())? {
                match key {
                    b"path" => long_path = Some(value.to_vec()),
                    b"linkpath" => long_link = Some(value.to_vec()),
                    b"size" => long_size = decimal(value),
                    _ => {}
                }
            }
            continue;
        }
        let name = long_path
            .take()
            .unwrap_or_else(|| field(&block[0..100]).to_vec());
        let link = long_link
            .take()
            .unwrap_or_else(|| field(&block[157..257]).to_vec());
        let kind = match kind {
            DIR => DataKind::Dir,
            SYMLINK => DataKind::Symlink,
            HARD_LINK => DataKind::HardLink,
            _ => DataKind::File,
        };
        let (Ok(name), Ok(link)) = (String::from_utf8(name), String::from_utf8(link)) else {
            dropped += 1;
            continue;
        };
        let path = name
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect::<Vec<_>>()
            .join("/");
        entries.push(DataEntry {
            path,
            kind,
            mode: number(&block[100..108]).unwrap_or(0) as u32 & 0o777,
            link,
            data: if kind == DataKind::File {
                data.to_vec()
            } else {
                Vec::new()
            },
        });
    }
    Ok((entries, dropped))
}

/// `dir` relative to the sandbox's workspace (`/workspace`, or where its spec mounts it; empty
/// for the workspace itself), or a refusal.
fn beneath_workspace(dir: &str, workspace: &str) -> Result<String> {
    let trimmed = dir.trim_end_matches('/');
    let relative = if trimmed == workspace {
        ""
    } else {
        trimmed
            .strip_prefix(workspace)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| DispatchError::InvalidSpec {
                reason: format!("{dir} is not beneath {workspace}"),
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
    let mut path = Vec::new();
    for part in relative.split('/') {
        path.extend_from_slice(part.as_bytes());
        path.push(b'/');
        write_header(&mut archive, &path, DIR, 0o755, 0, 0, b"");
    }
    archive.extend_from_slice(&[0u8; 2 * BLOCK]);
    archive
}

/// Tar block size.
const BLOCK: usize = 512;
/// Largest pax or GNU long-name record accepted (names are bounded by `PATH_MAX` anyway).
const MAX_META: u64 = 1 << 20;
/// Largest value of an 11-digit octal field (size, mtime).
const MAX_OCTAL_11: u64 = 0o777_7777_7777;

/// Type flags.
const REGULAR: u8 = b'0';
const HARD_LINK: u8 = b'1';
const SYMLINK: u8 = b'2';
const DIR: u8 = b'5';

/// Why an archive was refused (nothing is copied when it is).
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// The bytes are not a tar stream this filter can read.
    #[error("not a tar archive: {0}")]
    NotTar(&'static str),
    /// The stream ended inside an entry.
    #[error("the tar archive is truncated")]
    Truncated,
    /// A component of the volume's path is not a directory.
    #[error("{path} is {what}, not a directory: a volume must be a real directory beneath /workspace, with no symbolic link on its path")]
    NotADirectory {
        /// The path in the sandbox.
        path: String,
        /// What it is instead.
        what: &'static str,
    },
    /// The volume's directory is not in the archive the engine gave.
    #[error("{0} is not a directory")]
    Missing(String),
    /// The rewritten archive passed the caller's bound.
    #[error("the archive is over its size bound")]
    TooLarge,
}

/// Which entries of the stream are kept, and how they are named.
enum Scope {
    /// The entries of the directory whose components (from the archive's root) these are,
    /// renamed relative to it; each component must be a directory entry of the stream.
    Beneath(Vec<Vec<u8>>),
    /// Every entry, named relative to the archive's root.
    All,
}

/// Overrides for the next entry, from pax and GNU long-name records.
#[derive(Default)]
struct Overrides {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    mtime: Option<u64>,
}

/// Where the reader is in the stream.
enum State {
    /// Expecting a header block.
    Header,
    /// Collecting a pax or GNU long-name record's data.
    Meta {
        kind: u8,
        left: u64,
        pad: u64,
        data: Vec<u8>,
    },
    /// Copying (or skipping) an entry's data, then its padding.
    Data { left: u64, pad: u64, keep: bool },
    /// Past the end-of-archive block: the rest is ignored.
    End,
}

/// What becomes of an entry.
enum Decision {
    /// Outside the directory asked for (siblings of a nested volume, the directories above it).
    Skipped,
    /// Not plain data, or beneath something that is not a directory: left out, counted.
    Dropped,
    /// Written; `data` when its content follows.
    Kept { data: bool },
}

/// One entry as read.
struct Entry {
    path: Vec<u8>,
    link: Vec<u8>,
    kind: u8,
    mode: u32,
    size: u64,
    mtime: u64,
}

/// An incremental tar reader that writes a cleaned archive of the entries it keeps.
struct Filter {
    scope: Scope,
    /// The sandbox directory the archive's root names are in, for messages (`/workspace`).
    parent: String,
    limit: u64,
    out: Vec<u8>,
    buf: Vec<u8>,
    state: State,
    next: Overrides,
    root_seen: bool,
    /// Kept paths (relative to the output's root), so a name is never written twice.
    kept: HashSet<Vec<u8>>,
    /// Kept directories, so missing parents are added once.
    dirs: HashSet<Vec<u8>>,
    /// Kept regular files: the only targets a hard link may have.
    files: HashSet<Vec<u8>>,
    /// Kept entries that are not directories: nothing is written beneath them.
    non_dirs: HashSet<Vec<u8>>,
    dropped: usize,
}

impl Filter {
    fn new(scope: Scope, parent: &str, limit: u64) -> Self {
        Filter {
            scope,
            parent: parent.to_owned(),
            limit,
            out: Vec::new(),
            buf: Vec::new(),
            state: State::Header,
            next: Overrides::default(),
            root_seen: false,
            kept: HashSet::new(),
            dirs: HashSet::new(),
            files: HashSet::new(),
            non_dirs: HashSet::new(),
            dropped: 0,
        }
    }

    /// Bytes this filter holds now (its output and what waits to be parsed, as allocated).
    fn held(&self) -> usize {
        self.out.capacity() + self.buf.capacity()
    }

    /// Reads `chunk`, writing what is kept; data is never held beyond one chunk.
    fn push(&mut self, chunk: &[u8]) -> Result<(), Refused> {
        if matches!(self.state, State::End) {
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        let mut pos = 0;
        loop {
            let avail = self.buf.len() - pos;
            match &mut self.state {
                State::End => {
                    pos = self.buf.len();
                    break;
                }
                State::Header => {
                    if avail < BLOCK {
                        break;
                    }
                    let mut block = [0u8; BLOCK];
                    block.copy_from_slice(&self.buf[pos..pos + BLOCK]);
                    pos += BLOCK;
                    self.header(&block)?;
                }
                State::Meta {
                    left, pad, data, ..
                } => {
                    let take = (*left).min(avail as u64) as usize;
                    data.extend_from_slice(&self.buf[pos..pos + take]);
                    pos += take;
                    *left -= take as u64;
                    let take = (*pad).min((self.buf.len() - pos) as u64) as usize;
                    pos += take;
                    *pad -= take as u64;
                    if *left > 0 || *pad > 0 {
                        break;
                    }
                    if let State::Meta { kind, data, .. } =
                        std::mem::replace(&mut self.state, State::Header)
                    {
                        self.meta(kind, &data)?;
                    }
                }
                State::Data { left, pad, keep } => {
                    let take = (*left).min(avail as u64) as usize;
                    if *keep {
                        self.out.extend_from_slice(&self.buf[pos..pos + take]);
                    }
                    pos += take;
                    *left -= take as u64;
                    if *left > 0 {
                        break;
                    }
                    let take = (*pad).min((self.buf.len() - pos) as u64) as usize;
                    pos += take;
                    *pad -= take as u64;
                    if *pad > 0 {
                        break;
                    }
                    if *keep {
                        let rest = self.out.len() % BLOCK;
                        if rest != 0 {
                            self.out.resize(self.out.len() + BLOCK - rest, 0);
                        }
                    }
                    self.state = State::Header;
                }
            }
            if self.out.len() as u64 > self.limit {
                return Err(Refused::TooLarge);
            }
        }
        self.buf.drain(..pos);
        if self.out.len() as u64 > self.limit {
            return Err(Refused::TooLarge);
        }
        Ok(())
    }

    /// The cleaned archive and how many entries were left out.
    fn finish(mut self) -> Result<(Vec<u8>, usize), Refused> {
        match self.state {
            State::Header if self.buf.is_empty() => {}
            State::End => {}
            _ => return Err(Refused::Truncated),
        }
        if let Scope::Beneath(prefix) = &self.scope {
            if !self.root_seen {
                return Err(Refused::Missing(self.shown(prefix)));
            }
        }
        self.out.extend_from_slice(&[0u8; 2 * BLOCK]);
        if self.out.len() as u64 > self.limit {
            return Err(Refused::TooLarge);
        }
        Ok((self.out, self.dropped))
    }

    /// `parts` as a path of the sandbox.
    fn shown(&self, parts: &[Vec<u8>]) -> String {
        let joined = parts
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect::<Vec<_>>()
            .join("/");
        format!("{}/{joined}", self.parent)
    }

    fn header(&mut self, block: &[u8; BLOCK]) -> Result<(), Refused> {
        if block.iter().all(|&b| b == 0) {
            self.state = State::End;
            return Ok(());
        }
        let stored = number(&block[148..156]).ok_or(Refused::NotTar("bad checksum field"))?;
        let unsigned = ustar::checksum(block, i64::from);
        let signed = ustar::checksum(block, |b| i64::from(b as i8));
        let stored = i64::try_from(stored).ok();
        if stored != Some(unsigned) && stored != Some(signed) {
            return Err(Refused::NotTar("a header's checksum does not match"));
        }
        let kind = block[156];
        let header_size = number(&block[124..136]).ok_or(Refused::NotTar("bad size field"))?;
        if matches!(kind, b'x' | b'g' | b'L' | b'K') {
            if header_size > MAX_META {
                return Err(Refused::NotTar("a pax or long-name record is too large"));
            }
            self.state = State::Meta {
                kind,
                left: header_size,
                pad: padding(header_size),
                data: Vec::new(),
            };
            return Ok(());
        }
        let next = std::mem::take(&mut self.next);
        let size = next.size.unwrap_or(header_size);
        let header_only = matches!(kind, HARD_LINK | SYMLINK | b'3' | b'4' | DIR | b'6');
        let data = if header_only { 0 } else { size };
        let path = next.path.unwrap_or_else(|| {
            let name = field(&block[0..100]);
            let prefix = if &block[257..263] == b"ustar\0" {
                field(&block[345..500])
            } else {
                &[]
            };
            if prefix.is_empty() {
                name.to_vec()
            } else {
                [prefix, b"/", name].concat()
            }
        });
        let entry = Entry {
            path,
            link: next
                .link
                .unwrap_or_else(|| field(&block[157..257]).to_vec()),
            kind,
            mode: number(&block[100..108]).unwrap_or(0) as u32,
            size: data,
            mtime: next.mtime.or_else(|| number(&block[136..148])).unwrap_or(0),
        };
        let keep = match self.accept(&entry)? {
            Decision::Skipped => false,
            Decision::Dropped => {
                self.dropped += 1;
                false
            }
            Decision::Kept { data } => data,
        };
        self.state = State::Data {
            left: data,
            pad: padding(data),
            keep,
        };
        Ok(())
    }

    fn meta(&mut self, kind: u8, data: &[u8]) -> Result<(), Refused> {
        match kind {
            b'L' => self.next.path = Some(field(data).to_vec()),
            b'K' => self.next.link = Some(field(data).to_vec()),
            b'x' => {
                for (key, value) in pax_records(data)? {
                    match key {
                        b"path" => self.next.path = Some(value.to_vec()),
                        b"linkpath" => self.next.link = Some(value.to_vec()),
                        b"size" => {
                            self.next.size =
                                Some(decimal(value).ok_or(Refused::NotTar("bad pax size record"))?)
                        }
                        b"mtime" => {
                            let whole = value.split(|&b| b == b'.').next().unwrap_or_default();
                            self.next.mtime = decimal(whole);
                        }
                        // Owners, names, extended attributes (file capabilities, ACLs): never
                        // carried over.
                        _ => {}
                    }
                }
            }
            // A global pax header: nothing in it is carried over either.
            _ => {}
        }
        Ok(())
    }

    /// Decides on `entry` and writes it (and any missing parents) when kept.
    fn accept(&mut self, entry: &Entry) -> Result<Decision, Refused> {
        let parts = components(&entry.path);
        let rel: Vec<Vec<u8>> = match &self.scope {
            Scope::All => match parts {
                Some(p) => p,
                None => return Ok(Decision::Dropped),
            },
            Scope::Beneath(prefix) => {
                let Some(parts) = parts else {
                    return Err(Refused::NotTar("an entry's name climbs with `..`"));
                };
                if prefix.starts_with(&parts) {
                    if entry.kind != DIR {
                        return Err(Refused::NotADirectory {
                            path: self.shown(&parts),
                            what: describe(entry.kind),
                        });
                    }
                    if parts.len() < prefix.len() {
                        return Ok(Decision::Skipped);
                    }
                    self.root_seen = true;
                    Vec::new()
                } else if parts.starts_with(prefix) {
                    if !self.root_seen {
                        return Err(Refused::Missing(self.shown(prefix)));
                    }
                    parts[prefix.len()..].to_vec()
                } else {
                    return Ok(Decision::Skipped);
                }
            }
        };
        // Never beneath something that is not a directory (the engine would write through a
        // link), never a name twice (the engine would replace what was written first).
        let name = rel.join(&b'/');
        if (1..rel.len()).any(|k| self.non_dirs.contains(&rel[..k].join(&b'/')))
            || self.kept.contains(&name)
        {
            return Ok(Decision::Dropped);
        }
        let mode = entry.mode & 0o777;
        let link = match entry.kind {
            DIR => Vec::new(),
            REGULAR | 0 | b'7' if !rel.is_empty() => Vec::new(),
            SYMLINK if !rel.is_empty() && link_stays_inside(&rel, &entry.link) => {
                entry.link.clone()
            }
            HARD_LINK if !rel.is_empty() => match self.hard_link_target(&entry.link) {
                Some(target) => target,
                None => return Ok(Decision::Dropped),
            },
            _ => return Ok(Decision::Dropped),
        };
        // Parents the archive did not list become the sandbox user's directories.
        for k in 1..rel.len() {
            let parent = rel[..k].join(&b'/');
            if self.dirs.insert(parent.clone()) {
                self.kept.insert(parent.clone());
                let mut shown = parent;
                shown.push(b'/');
                write_header(&mut self.out, &shown, DIR, 0o755, 0, entry.mtime, b"");
            }
        }
        self.kept.insert(name.clone());
        let (kind, size, shown) = match entry.kind {
            DIR => {
                self.dirs.insert(name.clone());
                let mut shown = if rel.is_empty() { b".".to_vec() } else { name };
                shown.push(b'/');
                (DIR, 0, shown)
            }
            SYMLINK | HARD_LINK => {
                self.non_dirs.insert(name.clone());
                (entry.kind, 0, name)
            }
            _ => {
                self.non_dirs.insert(name.clone());
                self.files.insert(name.clone());
                (REGULAR, entry.size, name)
            }
        };
        write_header(&mut self.out, &shown, kind, mode, size, entry.mtime, &link);
        Ok(Decision::Kept {
            data: kind == REGULAR,
        })
    }

    /// A hard link's target, relative to the output's root, when it is a regular file already
    /// kept.
    fn hard_link_target(&self, link: &[u8]) -> Option<Vec<u8>> {
        let parts = components(link)?;
        let rel = match &self.scope {
            Scope::All => parts,
            Scope::Beneath(prefix) => parts.strip_prefix(prefix.as_slice())?.to_vec(),
        };
        let target = rel.join(&b'/');
        self.files.contains(&target).then_some(target)
    }
}

/// A name's components without `.` and empty ones; `None` when one is `..`.
fn components(path: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut parts = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => parts.push(p.to_vec()),
        }
    }
    Some(parts)
}

/// Whether a symbolic link at `rel` whose text is `target` points inside the archive's root,
/// read as text: not absolute, never above the root.
fn link_stays_inside(rel: &[Vec<u8>], target: &[u8]) -> bool {
    if target.is_empty() || target.starts_with(b"/") || target.contains(&0) {
        return false;
    }
    let mut depth = rel.len() - 1;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => depth += 1,
        }
    }
    true
}

fn describe(kind: u8) -> &'static str {
    match kind {
        SYMLINK => "a symbolic link",
        HARD_LINK => "a hard link",
        REGULAR | 0 | b'7' => "a file",
        b'3' | b'4' => "a device",
        b'6' => "a FIFO",
        _ => "not a directory",
    }
}

/// Zero bytes after `size` bytes of data up to the next block.
fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// A NUL-terminated header field.
fn field(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// A numeric header field: octal text (spaces and NULs around it), or GNU base-256.
fn number(bytes: &[u8]) -> Option<u64> {
    let first = *bytes.first()?;
    if first & 0x80 != 0 {
        if first == 0xff {
            return None;
        }
        let mut value = u64::from(first & 0x7f);
        for &b in &bytes[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(value);
    }
    let text = field(bytes);
    let text = std::str::from_utf8(text).ok()?.trim_matches(' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// A decimal number of a pax record.
fn decimal(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A pax record: key and value.
type PaxRecord<'a> = (&'a [u8], &'a [u8]);

/// The `key=value` records of a pax header (`"<length> <key>=<value>\n"` each).
fn pax_records(mut data: &[u8]) -> Result<Vec<PaxRecord<'_>>, Refused> {
    let bad = || Refused::NotTar("malformed pax record");
    let mut records = Vec::new();
    while !data.is_empty() && !data.iter().all(|&b| b == 0) {
        let space = data.iter().position(|&b| b == b' ').ok_or_else(bad)?;
        let length = decimal(&data[..space])
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(bad)?;
        if length <= space + 1 || length > data.len() || data[length - 1] != b'\n' {
            return Err(bad());
        }
        let record = &data[space + 1..length - 1];
        let equals = record.iter().position(|&b| b == b'=').ok_or_else(bad)?;
        records.push((&record[..equals], &record[equals + 1..]));
        data = &data[length..];
    }
    Ok(records)
}

/// Writes a ustar header for an entry owned by the sandbox user, preceded by a pax header when
/// the name, the link or the size do not fit the ustar fields.
fn write_header(
    out: &mut Vec<u8>,
    name: &[u8],
    kind: u8,
    mode: u32,
    size: u64,
    mtime: u64,
    link: &[u8],
) {
    let mut records = Vec::new();
    if name.len() > 100 {
        pax_record(&mut records, "path", name);
    }
    if link.len() > 100 {
        pax_record(&mut records, "linkpath", link);
    }
    if size > MAX_OCTAL_11 {
        pax_record(&mut records, "size", size.to_string().as_bytes());
    }
    if !records.is_empty() {
        let length = records.len() as u64;
        ustar(out, b"././@PaxHeader", b'x', 0o644, length, mtime, b"");
        out.extend_from_slice(&records);
        out.resize(out.len() + padding(length) as usize, 0);
    }
    ustar(out, name, kind, mode, size, mtime, link);
}

/// One pax record, its length counting its own digits.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let body = key.len() + value.len() + 3; // space, '=', newline
    let mut length = body + 1;
    while body + length.to_string().len() != length {
        length = body + length.to_string().len();
    }
    out.extend_from_slice(format!("{length} {key}=").as_bytes());
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// One ustar header block (names and links cut to their fields: a pax record says the rest).
/// Owned by the sandbox user.
fn ustar(out: &mut Vec<u8>, name: &[u8], kind: u8, mode: u32, size: u64, mtime: u64, link: &[u8]) {
    let owner = (SANDBOX_UID, SANDBOX_GID);
    let entry = ustar::Entry {
        name,
        kind,
        mode,
        owner,
        size,
        mtime,
        link,
    };
    entry.append_header(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ustar header as another writer would make it (any owner, any type).
    fn raw(name: &str, kind: u8, mode: u32, uid: u64, data: &[u8], link: &str) -> Vec<u8> {
        let mut out = Vec::new();
        ustar(
            &mut out,
            name.as_bytes(),
            kind,
            mode,
            data.len() as u64,
            1_700_000_000,
            link.as_bytes(),
        );
        // Owner: rewrite the uid/gid fields and the checksum.
        let text = format!("{uid:07o}\0");
        out[108..116].copy_from_slice(text.as_bytes());
        out[116..124].copy_from_slice(text.as_bytes());
        out[148..156].copy_from_slice(b"        ");
        let sum: u32 = out.iter().map(|&b| u32::from(b)).sum();
        out[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len() + padding(data.len() as u64) as usize, 0);
        out
    }

    fn end(mut parts: Vec<Vec<u8>>) -> Vec<u8> {
        parts.push(vec![0u8; 2 * BLOCK]);
        parts.concat()
    }

    /// (name, type, mode, uid, gid, data, link) of each entry, pax paths applied.
    type Listed = (String, u8, u32, u64, u64, Vec<u8>, String);

    fn list(archive: &[u8]) -> Vec<Listed> {
        let mut entries = Vec::new();
        let mut pos = 0;
        let mut path = None;
        let mut linkpath = None;
        while pos + BLOCK <= archive.len() {
            let h = &archive[pos..pos + BLOCK];
            pos += BLOCK;
            if h.iter().all(|&b| b == 0) {
                break;
            }
            let size = number(&h[124..136]).unwrap() as usize;
            let data = archive[pos..pos + size].to_vec();
            pos += size + padding(size as u64) as usize;
            if h[156] == b'x' {
                for (k, v) in pax_records(&data).unwrap() {
                    match k {
                        b"path" => path = Some(String::from_utf8_lossy(v).into_owned()),
                        b"linkpath" => linkpath = Some(String::from_utf8_lossy(v).into_owned()),
                        _ => {}
                    }
                }
                continue;
            }
            let text = |b: &[u8]| String::from_utf8_lossy(field(b)).into_owned();
            entries.push((
                path.take().unwrap_or_else(|| text(&h[..100])),
                h[156],
                number(&h[100..108]).unwrap() as u32,
                number(&h[108..116]).unwrap(),
                number(&h[116..124]).unwrap(),
                data,
                linkpath.take().unwrap_or_else(|| text(&h[157..257])),
            ));
        }
        entries
    }

    fn restore(archive: &[u8]) -> Result<Vec<Listed>, Refused> {
        let mut f = Filter::new(Scope::All, "", u64::MAX);
        f.push(archive)?;
        Ok(list(&f.finish()?.0))
    }

    fn save(archive: &[u8], prefix: &[&str], limit: u64) -> Result<Vec<Listed>, Refused> {
        let prefix = prefix.iter().map(|p| p.as_bytes().to_vec()).collect();
        let mut f = Filter::new(Scope::Beneath(prefix), "/workspace", limit);
        // One byte at a time: the engine's chunks fall anywhere.
        for b in archive {
            f.push(std::slice::from_ref(b))?;
        }
        Ok(list(&f.finish()?.0))
    }

    fn names(entries: &[Listed]) -> Vec<&str> {
        entries.iter().map(|e| e.0.as_str()).collect()
    }

    #[test]
    fn only_normalised_paths_beneath_the_workspace() {
        assert_eq!(beneath_workspace("/workspace", WORKSPACE).unwrap(), "");
        assert_eq!(beneath_workspace("/workspace/", WORKSPACE).unwrap(), "");
        assert_eq!(
            beneath_workspace("/workspace/a/b", WORKSPACE).unwrap(),
            "a/b"
        );
        assert_eq!(
            beneath_workspace("/home/user/a", "/home/user").unwrap(),
            "a"
        );
        assert!(beneath_workspace("/workspace/a", "/home/user").is_err());
        for bad in [
            "/etc",
            "/workspaces",
            "/workspace/../etc",
            "/workspace/a//b",
            "/workspace/./a",
        ] {
            assert!(beneath_workspace(bad, WORKSPACE).is_err(), "{bad}");
        }
        let tar = directories("a/b");
        assert_eq!(tar.len(), 512 * 2 + 1024);
        let listed = list(&tar);
        assert_eq!(names(&listed), ["a/", "a/b/"]);
        assert!(listed
            .iter()
            .all(|e| e.1 == DIR && e.2 == 0o755 && e.3 == 65534 && e.4 == 65534));
    }

    #[test]
    fn a_restored_archive_is_the_sandbox_users_plain_data() {
        let archive = end(vec![
            raw("./", DIR, 0o755, 0, b"", ""),
            raw("./sbin/", DIR, 0o2755, 0, b"", ""),
            raw("./sbin/unix_chkpwd", REGULAR, 0o2755, 0, b"ELF", ""),
            raw("./sbin/su", REGULAR, 0o4755, 0, b"ELF", ""),
            raw("./tmp/", DIR, 0o1777, 0, b"", ""),
            raw("./null", b'3', 0o666, 0, b"", ""),
            raw("./disk", b'4', 0o660, 0, b"", ""),
            raw("./fifo", b'6', 0o644, 0, b"", ""),
            raw("./etc", SYMLINK, 0o777, 0, b"", "/etc"),
            raw("./up", SYMLINK, 0o777, 0, b"", "sbin/../.."),
            raw("./sbin/ok", SYMLINK, 0o777, 0, b"", "../notes/a.txt"),
            raw("./etc/passwd", REGULAR, 0o644, 0, b"through the link", ""),
            raw("./sbin/ok/x", REGULAR, 0o644, 0, b"beneath a link", ""),
            raw("../outside", REGULAR, 0o644, 0, b"climbs", ""),
            raw("./notes/deep/a.txt", REGULAR, 0o600, 1000, b"kept", ""),
            raw("./hard", HARD_LINK, 0o644, 0, b"", "./notes/deep/a.txt"),
            raw("./hard-out", HARD_LINK, 0o644, 0, b"", "../../etc/shadow"),
            raw("./hard-link", HARD_LINK, 0o644, 0, b"", "./sbin/ok"),
            raw("./notes/deep/a.txt", REGULAR, 0o644, 0, b"twice", ""),
            raw("./", SYMLINK, 0o777, 0, b"", "/"),
        ]);
        let entries = restore(&archive).unwrap();
        assert_eq!(
            names(&entries),
            [
                "./",
                "sbin/",
                "sbin/unix_chkpwd",
                "sbin/su",
                "tmp/",
                "sbin/ok",
                "etc/",
                "etc/passwd",
                "notes/",
                "notes/deep/",
                "notes/deep/a.txt",
                "hard",
            ]
        );
        for (name, _, mode, uid, gid, _, _) in &entries {
            assert_eq!((*uid, *gid), (65534, 65534), "{name}");
            assert_eq!(mode & 0o7000, 0, "{name}: {mode:o}");
        }
        assert_eq!(entries[2].2, 0o755);
        assert_eq!(entries[5].6, "../notes/a.txt");
        // The dropped link `etc` left the name free: `etc` is a directory of the volume.
        assert_eq!(
            (entries[6].1, entries[7].5.as_slice()),
            (DIR, &b"through the link"[..])
        );
        assert_eq!(entries[10].5, b"kept");
        assert_eq!(
            (entries[11].1, entries[11].6.as_str()),
            (HARD_LINK, "notes/deep/a.txt")
        );
        // Idempotent: a saved archive restores unchanged.
        let again = {
            let mut f = Filter::new(Scope::All, "", u64::MAX);
            f.push(&archive).unwrap();
            let (cleaned, dropped) = f.finish().unwrap();
            assert_eq!(dropped, 11);
            restore(&cleaned).unwrap()
        };
        assert_eq!(again, entries);
    }

    #[test]
    fn a_saved_volume_is_its_directory_never_a_link() {
        // The engine's answer for /workspace/data when data -> /usr/sbin: the link itself.
        let link = end(vec![raw("data", SYMLINK, 0o777, 65534, b"", "/usr/sbin")]);
        let e = save(&link, &["data"], 1 << 20).unwrap_err();
        assert!(
            e.to_string()
                .contains("/workspace/data is a symbolic link, not a directory"),
            "{e}"
        );
        // A nested volume whose parent is a link: refused on the parent.
        let nested = end(vec![
            raw("a/", DIR, 0o755, 65534, b"", ""),
            raw("a/b", SYMLINK, 0o777, 65534, b"", "/usr"),
        ]);
        let e = save(&nested, &["a", "b", "sbin"], 1 << 20).unwrap_err();
        assert!(
            e.to_string().contains("/workspace/a/b is a symbolic link"),
            "{e}"
        );
        // Gone: nothing is saved.
        let gone = end(vec![raw("a/", DIR, 0o755, 65534, b"", "")]);
        assert!(matches!(
            save(&gone, &["a", "v"], 1 << 20),
            Err(Refused::Missing(_))
        ));

        // A real nested directory: its entries only, renamed beneath it, links rebased.
        let tree = end(vec![
            raw("a/", DIR, 0o755, 65534, b"", ""),
            raw("a/other.txt", REGULAR, 0o644, 65534, b"sibling", ""),
            raw("a/v/", DIR, 0o700, 65534, b"", ""),
            raw("a/v/f", REGULAR, 0o644, 65534, b"mine", ""),
            raw("a/v/g", HARD_LINK, 0o644, 65534, b"", "a/v/f"),
            raw("a/v/h", HARD_LINK, 0o644, 65534, b"", "a/other.txt"),
            raw("a/v/l", SYMLINK, 0o777, 65534, b"", "f"),
            raw("a/vv", REGULAR, 0o644, 65534, b"not beneath", ""),
        ]);
        let entries = save(&tree, &["a", "v"], 1 << 20).unwrap();
        assert_eq!(names(&entries), ["./", "f", "g", "l"]);
        assert_eq!(entries[0].2, 0o700);
        assert_eq!(entries[2].6, "f");
        assert!(matches!(
            save(&tree, &["a", "v"], 2048),
            Err(Refused::TooLarge)
        ));
    }

    #[test]
    fn long_names_and_broken_streams() {
        let long = format!("{}/{}", "d".repeat(90), "f".repeat(90));
        let link = "l".repeat(150);
        let archive = end(vec![
            raw("v/", DIR, 0o755, 0, b"", ""),
            {
                let mut pax = Vec::new();
                pax_record(&mut pax, "path", format!("v/{long}").as_bytes());
                pax_record(&mut pax, "SCHILY.xattr.security.capability", b"\x01\x02");
                let mut h = raw("././@PaxHeader", b'x', 0o644, 0, &pax, "");
                h.extend(raw("v/short", REGULAR, 0o644, 0, b"x", ""));
                h
            },
            {
                let mut h = raw("././@LongLink", b'K', 0o644, 0, link.as_bytes(), "");
                h.extend(raw("v/link", SYMLINK, 0o777, 0, b"", ""));
                h
            },
        ]);
        let entries = save(&archive, &["v"], 1 << 20).unwrap();
        let parent = format!("{}/", "d".repeat(90));
        assert_eq!(
            names(&entries),
            ["./", parent.as_str(), long.as_str(), "link"]
        );
        assert_eq!(entries[3].6, link);
        // Round trip through the restore side: the pax records are read back.
        let mut f = Filter::new(Scope::Beneath(vec![b"v".to_vec()]), "/workspace", 1 << 20);
        f.push(&archive).unwrap();
        let (saved, _) = f.finish().unwrap();
        assert_eq!(restore(&saved).unwrap(), entries);

        assert!(matches!(restore(b"not a tar"), Err(Refused::Truncated)));
        assert!(matches!(restore(&[b'x'; 1024]), Err(Refused::NotTar(_))));
        let cut = raw("f", REGULAR, 0o644, 0, &[7u8; 2000], "");
        assert!(matches!(restore(&cut[..1000]), Err(Refused::Truncated)));
    }

    #[test]
    fn data_entries_are_plain_data_only() {
        let long = format!("deep/{}", "n".repeat(150));
        let mut pax = Vec::new();
        pax_record(&mut pax, "path", long.as_bytes());
        let archive = end(vec![
            raw("./", DIR, 0o755, 0, b"", ""),
            raw("./a.txt", REGULAR, 0o4755, 0, b"data", ""),
            raw("././@PaxHeader", b'x', 0o644, 0, &pax, ""),
            raw("cut", REGULAR, 0o644, 0, b"long", ""),
            raw("./in", SYMLINK, 0o777, 0, b"", "a.txt"),
            raw("./out", SYMLINK, 0o777, 0, b"", "/etc/passwd"),
            raw("./copy", HARD_LINK, 0o644, 0, b"", "a.txt"),
            raw("./shadow", HARD_LINK, 0o644, 0, b"", "/etc/shadow"),
            raw("./null", b'3', 0o666, 0, b"", ""),
            raw("../up.txt", REGULAR, 0o644, 0, b"x", ""),
        ]);
        let (entries, dropped) = data_entries(&archive).unwrap();
        let seen: Vec<(&str, DataKind, u32, &str, &[u8])> = entries
            .iter()
            .map(|e| {
                (
                    e.path.as_str(),
                    e.kind,
                    e.mode,
                    e.link.as_str(),
                    e.data.as_slice(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("", DataKind::Dir, 0o755, "", &b""[..]),
                ("a.txt", DataKind::File, 0o755, "", &b"data"[..]),
                ("deep", DataKind::Dir, 0o755, "", &b""[..]),
                (long.as_str(), DataKind::File, 0o644, "", &b"long"[..]),
                ("in", DataKind::Symlink, 0o777, "a.txt", &b""[..]),
                ("copy", DataKind::HardLink, 0o644, "a.txt", &b""[..]),
            ]
        );
        assert_eq!(
            dropped, 4,
            "the link out, the hard link out, the device, the `..` name"
        );
        assert_eq!(data_entries(&[]).unwrap(), (Vec::new(), 0));
        assert!(data_entries(&[b'x'; 1024]).is_err());
    }
}
