//! From a command's [`ExecGrant`] to the files the kernel will let it execute.
//!
//! Each granted name is looked up in the configured `PATH` exactly like `argv[0]`
//! (`program.rs`); the file found (after symlinks: busybox applets all resolve to one binary)
//! gets the execute right. A dynamically linked ELF also needs its program interpreter, the
//! dynamic loader named in its `PT_INTERP` header: the kernel opens it for execution too. The
//! loader, once executable, could run any file it is handed (`ld-linux-x86-64.so.2 /bin/sh`), so
//! it must never be a program of its own: a command whose `argv[0]` is a loader, or a grant that
//! names one, is refused here (the argv policy refuses loader names anywhere in the command).
//!
//! A script (`#!`) is granted, but not its interpreter: the interpreter must be granted by name
//! itself, because granting it would let every other granted program run it.
//!
//! Lookups are cached for the executor's life: the image is read-only, so a name resolves to the
//! same file every time.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::{Mode, OFlags, CWD};

use crate::error::{OpError, OpResult};
use crate::protocol::{ErrorKind, ExecGrant};
use crate::spawn::held::HeldPaths;
use crate::spawn::program;

/// ELF program header type of the program interpreter.
const PT_INTERP: u32 = 3;
/// Bytes read from the start of a file to find its interpreter (headers sit at the front).
const HEAD_BYTES: usize = 64 * 1024;

/// What one program name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The path found in `PATH` (as given to `execve`).
    pub path: String,
    /// Its dynamic loader, if it is a dynamically linked ELF.
    pub loader: Option<String>,
    /// The file is itself a dynamic loader (never runnable as a program).
    pub is_loader: bool,
}

/// The files a command may execute; `None` when execution is not restricted.
pub type ExecPaths = Option<Vec<String>>;

/// Cache of resolved program names, and of the granted files held open for Landlock rules.
#[derive(Default)]
pub struct Grants {
    cache: Mutex<HashMap<String, Resolved>>,
    opened: HeldPaths,
}

impl Grants {
    /// Resolves `name` in `search_path` (cached).
    pub fn resolve(&self, name: &str, search_path: &str) -> OpResult<Resolved> {
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return Ok(hit.clone());
        }
        let path = program::find(name, search_path)?;
        let head = read_head(&path);
        let loader = head.as_deref().and_then(elf_interpreter);
        let is_loader = looks_like_loader(&path, head.as_deref(), loader.is_some());
        let resolved = Resolved {
            path,
            loader,
            is_loader,
        };
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), resolved.clone());
        Ok(resolved)
    }

    /// `path` (a resolved, granted file for a Landlock rule, or a program's directory to execute
    /// it from) opened `O_PATH`, held open for the executor's life: the image is read-only, and
    /// walking a path on the image's filesystem costs a round trip to its FUSE daemon per
    /// component (a permission check each) on every call otherwise. `None` when it cannot be
    /// opened (a file then gets no rule; a program is executed by its path).
    pub fn opened(&self, path: &str) -> Option<Arc<OwnedFd>> {
        self.opened.get_or_open(
            path,
            || rustix::fs::openat(CWD, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).ok(),
            || true,
        )
    }

    /// The files a command with `argv[0] = name` (already found at `program`) may execute
    /// under `grant`; refuses a loader as the program or in the grant.
    pub fn exec_paths(
        &self,
        grant: &ExecGrant,
        name: &str,
        search_path: &str,
    ) -> OpResult<ExecPaths> {
        let first = self.resolve(name, search_path)?;
        if first.is_loader {
            return Err(loader_refused(name, &first.path));
        }
        let mut names: Vec<&str> = vec![name];
        match grant {
            ExecGrant::Any => return Ok(None),
            ExecGrant::ArgvZero => {}
            ExecGrant::Only(list) => names.extend(list.iter().map(String::as_str)),
        }
        let mut paths: Vec<String> = Vec::new();
        for granted in names {
            let resolved = match self.resolve(granted, search_path) {
                Ok(r) => r,
                // A granted program absent from this image is simply not executable here.
                Err(e) if e.kind == ErrorKind::CommandNotFound => continue,
                Err(e) => return Err(e),
            };
            if resolved.is_loader {
                return Err(loader_refused(granted, &resolved.path));
            }
            for path in std::iter::once(resolved.path).chain(resolved.loader) {
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
        }
        Ok(Some(paths))
    }
}

fn loader_refused(name: &str, path: &str) -> OpError {
    OpError::new(
        ErrorKind::PermissionDenied,
        format!(
            "'{name}' ({path}) is the dynamic loader, which runs any file it is given; it is never \
             runnable as a program"
        ),
    )
}

/// The first [`HEAD_BYTES`] of a file, read as the sandbox user (None if unreadable).
fn read_head(path: &str) -> Option<Vec<u8>> {
    let fd = rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    let mut file = std::fs::File::from(fd);
    let mut head = Vec::with_capacity(4096);
    file.by_ref()
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .ok()?;
    Some(head)
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF, if it has one within `head`.
pub fn elf_interpreter(head: &[u8]) -> Option<String> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(head.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(head.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?)).ok()
    };
    let phoff = u64_at(0x20)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    if phentsize < 56 {
        return None;
    }
    for index in 0..phnum.min(256) {
        let header = phoff.checked_add(index.checked_mul(phentsize)?)?;
        if u32_at(header)? != PT_INTERP {
            continue;
        }
        let offset = u64_at(header + 0x08)?;
        let size = u64_at(header + 0x20)?;
        let raw = head.get(offset..offset.checked_add(size)?)?;
        let text = raw.split(|b| *b == 0).next()?;
        let path = std::str::from_utf8(text).ok()?;
        return path.starts_with('/').then(|| path.to_owned());
    }
    None
}

/// A dynamic loader: a shared-object ELF without an interpreter of its own whose file name
/// is one of the loaders' (`ld-linux-*.so*`, `ld-musl-*.so*`, `ld.so*`, `ld64.so*`).
fn looks_like_loader(path: &str, head: Option<&[u8]>, has_interpreter: bool) -> bool {
    if has_interpreter {
        return false;
    }
    let Some(head) = head else {
        return is_loader_name(path);
    };
    let shared_object = head.len() >= 18 && &head[..4] == b"\x7fELF" && head[16] == 3;
    // Resolve the real name: `/lib64/ld-linux-x86-64.so.2` is often a symlink.
    let real = std::fs::canonicalize(path)
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| path.to_owned());
    shared_object && (is_loader_name(path) || is_loader_name(&real))
}

/// True when the last component of `path` is a dynamic loader's name.
pub fn is_loader_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("ld-linux")
        || name.starts_with("ld-musl")
        || name == "ld.so"
        || name.starts_with("ld.so.")
        || name.starts_with("ld64.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_names() {
        for name in [
            "/lib64/ld-linux-x86-64.so.2",
            "ld-linux-aarch64.so.1",
            "/lib/ld-musl-x86_64.so.1",
            "/lib/ld.so",
            "ld64.so.2",
        ] {
            assert!(is_loader_name(name), "{name}");
        }
        for name in ["/bin/ls", "build.so", "field.sort", "old.sh", "ldconfig"] {
            assert!(!is_loader_name(name), "{name}");
        }
    }

    #[test]
    fn interpreter_of_a_crafted_elf() {
        // A minimal ELF64 header with one PT_INTERP program header pointing at a string.
        let mut elf = vec![0u8; 64 + 56 + 32];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[16] = 2;
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&PT_INTERP.to_le_bytes());
        let interp = b"/lib64/ld-linux-x86-64.so.2\0";
        elf[64 + 8..64 + 16].copy_from_slice(&120u64.to_le_bytes());
        elf[64 + 32..64 + 40].copy_from_slice(&(interp.len() as u64).to_le_bytes());
        elf[120..120 + interp.len()].copy_from_slice(interp);
        assert_eq!(
            elf_interpreter(&elf).as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        // Truncated or foreign input never panics and finds nothing.
        assert_eq!(elf_interpreter(&elf[..100]), None);
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        let mut huge = elf.clone();
        huge[64 + 8..64 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(elf_interpreter(&huge), None);
    }
}
