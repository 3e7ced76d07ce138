//! `fs.watch` and `fs.unwatch`: changes beneath a directory of a read root, streamed as events.
//!
//! The directory is resolved like every path (`roots.rs`: openat2 beneath its root) and opened;
//! the kernel's inotify is then pointed at that open descriptor through `/proc/self/fd/N`, so
//! the requested path itself is never given to a path-based call. With `recursive`,
//! subdirectories get watches too: those there at the start are met by a descriptor walk that
//! never follows a symlink, those created later are resolved again beneath their root like any
//! requested path. The thread of each watch reads the kernel's events and sends one `fs` event
//! per change (`create`, `write`, `remove`, `rename`, `chmod`); a lost event is never silent:
//! the kernel's queue overflowing, or a directory beyond [`MAX_DIRECTORIES`], sends `overflow`.
//! The last event of a watch is `watch_end`, with why.
//!
//! Permissions are the sandbox user's (the handler thread's fsuid: inotify needs read access to
//! each directory), and so is the kernel's accounting: the inotify instance is made under the
//! sandbox user's effective uid, so its watches count against that user's host-wide inotify
//! limits, never against root's (which dockerd and systemd need). Bounds: `max_watches` per
//! sandbox, [`MAX_DIRECTORIES`] per watch (and [`MAX_WALKED`] entries walked to find them); the
//! kernel bounds its own queue. So that a command writing in a loop does not become a line per
//! `write` on the executor's stream, events are read in batches at most every [`BATCH`] (the
//! kernel merges a repeated event meanwhile) and a repeat within a batch is sent once.
//!
//! `fs.write` and `fs.edit` never write a file in place: they write a temporary file beside it
//! and rename it over the name (`fs/write.rs`). A watch reports that as what it means for the
//! name, never the temporary file: the temporary file's changes (created, written, its mode
//! set) are held until it is renamed, then sent under the final name (`create`, `write`,
//! `chmod`, as a file written in place reports them); a temporary file removed unrenamed (a
//! failed write) changed no name and reports nothing.

use std::collections::HashMap;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::walk::{self, Step};
use crate::fs::write;
use crate::paths;
use crate::protocol::{
    ErrorKind, Event, EventBody, FsEvent, FsOp, UnwatchParams, UnwatchResult, WatchParams,
    WatchResult, WatchSyncParams, WatchSyncResult,
};
use crate::roots::Access;
use crate::running::WatchControl;

/// Most directories one watch covers.
pub const MAX_DIRECTORIES: usize = 1000;
/// Shortest time between two reads of a watch's events.
const BATCH: Duration = Duration::from_millis(20);
/// Most entries (files included) a recursive watch walks to find the directories.
const MAX_WALKED: u64 = 100_000;
/// Deepest directory a recursive watch enters.
const MAX_DEPTH: usize = 64;
/// Most temporary files of `fs.write` a watch holds the changes of at once (a bound against
/// names that look like them and are never renamed).
const MAX_HELD: usize = 1024;
/// Longest an `fs.watch_sync` waits for the watch's thread.
const SYNC_LIMIT: Duration = Duration::from_secs(5);

/// What every watched directory reports.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// A watch's state on its thread.
struct Watch {
    inotify: OwnedFd,
    /// The watched directory's absolute path, beneath which new subdirectories are resolved
    /// again (no descriptor of a watched directory is held: an open directory that is removed
    /// reports its removal only once it is closed).
    display: String,
    recursive: bool,
    /// Watch descriptor -> directory relative to `top` (`""` for `top`).
    dirs: HashMap<i32, String>,
    /// The changes of `fs.write`'s temporary files, by (watch descriptor, name), until they are
    /// renamed over their final name.
    held: HashMap<(i32, String), Vec<FsOp>>,
    /// The held changes of a temporary file renamed away, by the rename's cookie, until the
    /// other half of the rename names where it went.
    moving: HashMap<u32, Vec<FsOp>>,
}

impl Watch {
    /// Adds a watch on `dir` (a descriptor), known as `rel` beneath `top`.
    fn add(&mut self, dir: BorrowedFd<'_>, rel: String) -> rustix::io::Result<()> {
        if self.dirs.len() >= MAX_DIRECTORIES {
            return Err(Errno::NOSPC);
        }
        let wd = inotify::add_watch(
            &self.inotify,
            format!("/proc/self/fd/{}", dir.as_raw_fd()),
            MASK,
        )?;
        self.dirs.insert(wd, rel);
        Ok(())
    }

    fn path(&self, rel: &str, name: &str) -> String {
        paths::join(&paths::join(&self.display, rel), name)
    }

    /// Holds a change of a temporary file of `fs.write` (see the module's doc): created,
    /// written or its mode set, kept in order; renamed away, moved under the rename's cookie
    /// (at least `create` and `write`: the name it lands on got new content); removed,
    /// forgotten.
    fn hold(&mut self, wd: i32, name: String, flags: ReadFlags, cookie: u32) {
        let key = (wd, name);
        if flags.contains(ReadFlags::MOVED_FROM) {
            let mut ops = self.held.remove(&key).unwrap_or_default();
            if !ops.contains(&FsOp::Create) {
                ops.insert(0, FsOp::Create);
            }
            if !ops.contains(&FsOp::Write) {
                ops.insert(1, FsOp::Write);
            }
            if self.moving.len() >= MAX_HELD {
                self.moving.clear();
            }
            self.moving.insert(cookie, ops);
            return;
        }
        if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_TO) {
            self.held.remove(&key);
            return;
        }
        let op = if flags.contains(ReadFlags::CREATE) {
            FsOp::Create
        } else if flags.contains(ReadFlags::MODIFY) {
            FsOp::Write
        } else if flags.contains(ReadFlags::ATTRIB) {
            FsOp::Chmod
        } else {
            return;
        };
        if self.held.len() >= MAX_HELD && !self.held.contains_key(&key) {
            self.held.clear();
        }
        let ops = self.held.entry(key).or_default();
        if ops.last() != Some(&op) {
            ops.push(op);
        }
    }
}

/// Runs `fs.watch` for request `request`.
pub fn start(ctx: &Arc<Context>, request: u64, params: WatchParams) -> OpResult<WatchResult> {
    {
        let mut watches = ctx.watches.lock();
        if watches.len() >= ctx.config.max_watches {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!(
                    "this sandbox already has {} directory watches (its limit); remove one first",
                    ctx.config.max_watches
                ),
            ));
        }
        watches.insert(request, None);
    }
    match set_up(ctx, request, &params) {
        Ok((watch, control, result)) => {
            ctx.watches
                .lock()
                .insert(request, Some(Arc::clone(&control)));
            let thread_ctx = Arc::clone(ctx);
            let spawned = std::thread::Builder::new()
                .name(format!("watch-{request}"))
                .spawn(move || run(&thread_ctx, request, watch, &control));
            if let Err(e) = spawned {
                ctx.watches.lock().remove(&request);
                return Err(OpError::new(
                    ErrorKind::Busy,
                    format!("cannot start the watch's thread: {e}"),
                ));
            }
            Ok(result)
        }
        Err(e) => {
            ctx.watches.lock().remove(&request);
            Err(e)
        }
    }
}

fn set_up(
    ctx: &Context,
    request: u64,
    params: &WatchParams,
) -> OpResult<(Watch, Arc<WatchControl>, WatchResult)> {
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let top = target.open(OFlags::PATH | OFlags::DIRECTORY)?;
    let failed = |what: &str, e: Errno| OpError::os(e, what, &target.display);
    // Charged to the sandbox user, never to root (see `identity::charged_to_sandbox_user`).
    let inotify = crate::identity::charged_to_sandbox_user(ctx.config.uid, ctx.config.gid, || {
        inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
    })
    .map_err(|e| failed("cannot watch", e))?;
    let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(|e| failed("cannot watch", e))?;
    let sync = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(|e| failed("cannot watch", e))?;
    let mut watch = Watch {
        inotify,
        display: target.display.clone(),
        recursive: params.recursive,
        dirs: HashMap::new(),
        held: HashMap::new(),
        moving: HashMap::new(),
    };
    watch
        .add(top.as_fd(), String::new())
        .map_err(|e| failed("cannot watch", e))?;
    drop(top);
    if params.recursive {
        let listing = target.open(OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut refused = None;
        let limits = walk::Limits {
            max_depth: MAX_DEPTH,
            max_entries: MAX_WALKED,
        };
        let walked = walk::walk(listing, limits, |entry| {
            if entry.file_type != FileType::Directory {
                return Step::Continue;
            }
            let opened = rustix::fs::openat(
                entry.dir,
                entry.name.as_c_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            match opened.and_then(|fd| watch.add(fd.as_fd(), entry.rel.to_owned())) {
                Ok(()) => Step::Continue,
                Err(Errno::NOSPC) => {
                    refused = Some(OpError::new(
                        ErrorKind::LimitReached,
                        format!(
                            "'{}' holds more than {MAX_DIRECTORIES} directories; watch a narrower directory, or without recursive",
                            target.display
                        ),
                    ));
                    Step::Stop
                }
                // Removed meanwhile, or not readable by the sandbox user: not watched.
                Err(_) => Step::Skip,
            }
        });
        if let Some(refused) = refused {
            return Err(refused);
        }
        if walked.entries >= MAX_WALKED {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!(
                    "'{}' holds more than {MAX_WALKED} entries; watch a narrower directory, or without recursive",
                    target.display
                ),
            ));
        }
    }
    crate::log_event!(
        "fs.watch id={request} '{}' ({} directories)",
        watch.display,
        watch.dirs.len()
    );
    let result = WatchResult {
        path: watch.display.clone(),
        directories: watch.dirs.len() as u64,
    };
    Ok((watch, Arc::new(WatchControl::new(stop, sync)), result))
}

/// Runs `fs.unwatch`: the watch's thread sends `watch_end` and stops.
pub fn stop(ctx: &Context, params: UnwatchParams) -> UnwatchResult {
    let control = ctx.watches.lock().get(&params.target).cloned().flatten();
    match control {
        Some(control) => {
            let _ = rustix::io::write(&control.stop, &1u64.to_ne_bytes());
            UnwatchResult { removed: true }
        }
        None => UnwatchResult { removed: false },
    }
}

/// Runs `fs.watch_sync`: answers once the watch's thread has read the kernel's queue as it is
/// now and sent its events (before this answer, on the stream events go to), so a change made
/// before the request (a write whose answer came back) is among them, and so are the entries
/// of a directory made before it beneath a recursive watch, whose own watch may have come
/// after they were made (see [`scan`]). Without this, a poll right after a change could miss
/// it while the thread is between two reads.
pub fn sync(ctx: &Context, params: WatchSyncParams) -> WatchSyncResult {
    let control = ctx.watches.lock().get(&params.target).cloned().flatten();
    let Some(control) = control else {
        return WatchSyncResult { synced: false };
    };
    let ticket = control.ask_sync();
    let _ = rustix::io::write(&control.sync, &1u64.to_ne_bytes());
    WatchSyncResult {
        synced: control.wait_synced(ticket, SYNC_LIMIT),
    }
}

/// The watch's thread: events until it is stopped or its directory goes.
fn run(ctx: &Context, request: u64, mut watch: Watch, control: &WatchControl) {
    let send = |body: EventBody| {
        ctx.events.event(&Event {
            event: request,
            body,
        })
    };
    let reason = loop {
        let mut fds = [
            PollFd::new(&watch.inotify, PollFlags::IN),
            PollFd::new(&control.stop, PollFlags::IN),
            PollFd::new(&control.sync, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => break format!("waiting for events failed: {e}"),
        }
        if !fds[1].revents().is_empty() {
            break "removed by fs.unwatch".to_owned();
        }
        // Every sync asked for before this read of the queue is served by it.
        let syncing = if fds[2].revents().is_empty() {
            None
        } else {
            let _ = rustix::io::read(&control.sync, &mut [0u8; 8]);
            Some(control.asked())
        };
        match read_events(ctx, &mut watch) {
            Ok((events, ended)) => {
                let sent = !events.is_empty();
                for event in events {
                    send(EventBody::Fs(event));
                }
                if let Some(upto) = syncing {
                    control.synced(upto);
                }
                if let Some(reason) = ended {
                    break reason;
                }
                if sent && syncing.is_none() {
                    std::thread::sleep(BATCH);
                }
            }
            Err(e) => break format!("reading events failed: {e}"),
        }
    };
    ctx.watches.lock().remove(&request);
    send(EventBody::WatchEnd { reason });
    // Whoever waits for a sync now has everything this watch will ever send.
    control.synced(u64::MAX);
}

/// Reads what the kernel has queued; the events, and why the watch ends if it does.
fn read_events(
    ctx: &Context,
    watch: &mut Watch,
) -> rustix::io::Result<(Vec<FsEvent>, Option<String>)> {
    let raw = drain_queue(watch)?;
    let mut events = Vec::new();
    for (wd, flags, name, cookie) in raw {
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            events.push(FsEvent {
                op: FsOp::Overflow,
                path: watch.display.clone(),
                is_dir: true,
            });
            continue;
        }
        let Some(rel) = watch.dirs.get(&wd).cloned() else {
            continue;
        };
        if flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::IGNORED) {
            watch.dirs.remove(&wd);
            if rel.is_empty() {
                return Ok((events, Some("the watched directory was removed".to_owned())));
            }
            continue;
        }
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            continue;
        };
        let is_dir = flags.contains(ReadFlags::ISDIR);
        if !is_dir && write::is_temp_name(&name) {
            watch.hold(wd, name, flags, cookie);
            continue;
        }
        let path = watch.path(&rel, &name);
        if flags.contains(ReadFlags::MOVED_TO) {
            if let Some(ops) = watch.moving.remove(&cookie) {
                // A temporary file of `fs.write` renamed over this name: its changes, here.
                for op in ops {
                    let event = FsEvent {
                        op,
                        path: path.clone(),
                        is_dir: false,
                    };
                    if events.last() != Some(&event) {
                        events.push(event);
                    }
                }
                continue;
            }
        }
        let Some(op) = op_of(flags) else {
            continue;
        };
        let event = FsEvent {
            op,
            path: path.clone(),
            is_dir,
        };
        if events.last() != Some(&event) {
            events.push(event);
        }
        if op == FsOp::Create && is_dir && watch.recursive {
            watch_new_dir(ctx, watch, &rel, &name, path, &mut events);
        }
    }
    Ok((events, None))
}

/// One inotify record: watch descriptor, flags, name (lossy), rename cookie.
type RawEvent = (i32, ReadFlags, Option<String>, u32);

/// Everything the kernel has queued, read until it would block, before any of it is handled
/// (handling adds watches on the same descriptor).
fn drain_queue(watch: &Watch) -> rustix::io::Result<Vec<RawEvent>> {
    let mut buffer = [MaybeUninit::<u8>::uninit(); 16 * 1024];
    let mut raw = Vec::new();
    let mut reader = inotify::Reader::new(&watch.inotify, &mut buffer);
    loop {
        match reader.next() {
            Ok(event) => raw.push((
                event.wd(),
                event.events(),
                event
                    .file_name()
                    .map(CStr::to_string_lossy)
                    .map(|n| n.into_owned()),
                event.cookie(),
            )),
            Err(Errno::AGAIN) => break,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(raw)
}

/// The operation a record reports, by precedence; none for flags a watch does not report.
fn op_of(flags: ReadFlags) -> Option<FsOp> {
    if flags.contains(ReadFlags::CREATE) || flags.contains(ReadFlags::MOVED_TO) {
        Some(FsOp::Create)
    } else if flags.contains(ReadFlags::MODIFY) {
        Some(FsOp::Write)
    } else if flags.contains(ReadFlags::DELETE) {
        Some(FsOp::Remove)
    } else if flags.contains(ReadFlags::MOVED_FROM) {
        Some(FsOp::Rename)
    } else if flags.contains(ReadFlags::ATTRIB) {
        Some(FsOp::Chmod)
    } else {
        None
    }
}

/// A directory created under a recursive watch is watched too, and what it already holds
/// reported; an `Overflow` event when the watch limit is reached.
fn watch_new_dir(
    ctx: &Context,
    watch: &mut Watch,
    rel: &str,
    name: &str,
    path: String,
    events: &mut Vec<FsEvent>,
) {
    let sub = if rel.is_empty() {
        name.to_owned()
    } else {
        paths::join(rel, name)
    };
    // Resolved beneath its root like any requested path; the final name not followed.
    let opened = ctx
        .roots
        .resolve(&path, Access::Read)
        .and_then(|t| t.open(OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW));
    let added = match opened {
        Ok(fd) => watch.add(fd.as_fd(), sub.clone()),
        Err(_) => Ok(()), // gone again, or not a directory we may read
    };
    let full = match added {
        Ok(()) => scan(ctx, watch, &path, &sub, events),
        Err(e) => e == Errno::NOSPC,
    };
    if full {
        events.push(FsEvent {
            op: FsOp::Overflow,
            path,
            is_dir: true,
        });
    }
}

/// Reports what a directory just watched already holds, and watches its subdirectories: what
/// was made in it between its creation and its own watch (a program making a directory and
/// writing in it at once) has no inotify event, and would be lost. Each entry is reported as
/// created (a file with content also as written; `fs.write`'s temporary files not at all), as
/// the watch would have seen it. An entry made after the watch was added can be reported twice
/// (here and by its event), never not at all. `path` is the directory's absolute path, `rel`
/// its path beneath the watched one. True when a subdirectory was beyond [`MAX_DIRECTORIES`].
fn scan(
    ctx: &Context,
    watch: &mut Watch,
    path: &str,
    rel: &str,
    events: &mut Vec<FsEvent>,
) -> bool {
    // Resolved beneath its root like any requested path; the final name not followed.
    let Ok(listing) = ctx
        .roots
        .resolve(path, Access::Read)
        .and_then(|t| t.open(OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW))
    else {
        return false; // gone again, or not readable by the sandbox user
    };
    let limits = walk::Limits {
        max_depth: MAX_DEPTH,
        max_entries: MAX_WALKED,
    };
    let mut full = false;
    walk::walk(listing, limits, |entry| {
        let is_dir = entry.file_type == FileType::Directory;
        let name = entry.name.to_string_lossy();
        if !is_dir && write::is_temp_name(&name) {
            return Step::Continue;
        }
        let sub = paths::join(rel, entry.rel);
        let found = paths::join(&watch.display, &sub);
        events.push(FsEvent {
            op: FsOp::Create,
            path: found.clone(),
            is_dir,
        });
        if is_dir {
            let opened = rustix::fs::openat(
                entry.dir,
                entry.name.as_c_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            return match opened.and_then(|fd| watch.add(fd.as_fd(), sub)) {
                Ok(()) => Step::Continue,
                Err(Errno::NOSPC) => {
                    full = true;
                    Step::Stop
                }
                Err(_) => Step::Skip,
            };
        }
        let written = entry.file_type == FileType::RegularFile
            && rustix::fs::statat(
                entry.dir,
                entry.name.as_c_str(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok_and(|st| st.st_size > 0);
        if written {
            events.push(FsEvent {
                op: FsOp::Write,
                path: found,
                is_dir: false,
            });
        }
        Step::Continue
    });
    full
}
