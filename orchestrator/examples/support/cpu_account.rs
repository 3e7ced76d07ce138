//! CPU time by process name between two snapshots of `/proc`, for the load benchmark's `--cpu`:
//! on a shared machine, wall-clock rates move with the neighbours' load, but the CPU time each
//! component spends per call (the orchestrator, dockerd, the containerd shims, the executors,
//! our PostgreSQL backends) barely does, so it shows where the work is and whether a change
//! removed some.
//!
//! Each process counts its own time plus that of the children it reaped (`cutime`, `cstime`):
//! a command's sub-reaper and the program it ran are short-lived and counted in the executor
//! that reaped them. PostgreSQL backends count only when they serve `database` (the cluster may
//! be shared). Processes inside containers count only in the sandboxes of `database` (found by
//! their `org.aegis.db-name` label): `executor (ours)` (with the commands it reaped), `fork-server
//! (ours)` (which clones every command's sub-reaper), and `in sandboxes (ours)` for anything
//! else alive in them; executors of other sandboxes on the machine are neighbours and are left
//! out. Other processes named like ours (another engineer's dockerd clients) are noise that the
//! per-name split makes visible rather than hides.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on every Linux we meet).
const TICKS_PER_SEC: f64 = 100.0;

/// Ticks of CPU per process at one moment, with each process's name.
pub struct Snapshot {
    by_pid: HashMap<i32, (String, u64)>,
}

/// Full ids of the running containers labelled with `database` (our sandboxes); empty when
/// the Docker CLI cannot say.
fn our_containers(database: &str) -> Vec<String> {
    std::process::Command::new("docker")
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=org.aegis.db-name={database}"))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The container (of `ours`) process `pid` runs in: its id appears in the cgroup paths.
fn in_ours(pid: i32, ours: &[String]) -> Option<bool> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let container = cgroup.lines().find_map(container_of)?;
    Some(ours.iter().any(|id| id == container))
}

/// The container id a cgroup line names (`.../docker/<id>` or `.../docker-<id>.scope`), if any.
fn container_of(line: &str) -> Option<&str> {
    let last = line.rsplit('/').next()?;
    let id = last
        .strip_prefix("docker-")
        .and_then(|rest| rest.strip_suffix(".scope"))
        .unwrap_or(last);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Takes a snapshot; `database` selects the PostgreSQL backends and the sandboxes that count.
pub fn snapshot(database: &str) -> Snapshot {
    let ours = our_containers(database);
    let mut by_pid = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Snapshot { by_pid };
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((name, ticks)) = parse_stat(&stat) else {
            continue;
        };
        let name = if name == "postgres" {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(database) {
                continue;
            }
            "postgres (ours)".to_owned()
        } else if pid == std::process::id() as i32 {
            "this process".to_owned()
        } else {
            match in_ours(pid, &ours) {
                // In a container, but not one of our sandboxes: a neighbour.
                Some(false) => continue,
                Some(true) => match name.as_str() {
                    "sandbox-executo" => "executor (ours)".to_owned(),
                    "fork-server" => "fork-server (ours)".to_owned(),
                    _ => "in sandboxes (ours)".to_owned(),
                },
                None => name,
            }
        };
        by_pid.insert(pid, (name, ticks));
    }
    Snapshot { by_pid }
}

/// `(comm, utime + stime + cutime + cstime)` of one stat line.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some((name, tick(11)? + tick(12)? + tick(13)? + tick(14)?))
}

/// CPU milliseconds by process name from `before` to `after` (processes that appeared count
/// whole; those that vanished are lost unless a surviving parent reaped them).
pub fn spent(before: &Snapshot, after: &Snapshot) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    for (pid, (name, ticks)) in &after.by_pid {
        let was = match before.by_pid.get(pid) {
            Some((old, t)) if old == name => *t,
            _ => 0,
        };
        let delta = ticks.saturating_sub(was);
        if delta > 0 {
            *by_name.entry(name.clone()).or_insert(0.0) += delta as f64 * 1000.0 / TICKS_PER_SEC;
        }
    }
    by_name
}

/// One line: the names that matter, in ms of CPU per call, biggest first.
pub fn per_call(spent: &BTreeMap<String, f64>, calls: usize, keep: &[&str]) -> String {
    let calls = calls.max(1) as f64;
    let mut rows: Vec<(&String, f64)> = spent
        .iter()
        .filter(|(name, _)| keep.iter().any(|k| name.starts_with(k)))
        .map(|(name, ms)| (name, ms / calls))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rows.iter().map(|r| r.1).sum();
    let parts: Vec<String> = rows
        .iter()
        .map(|(name, ms)| format!("{name} {ms:.3}"))
        .collect();
    format!("{total:.3} ms CPU/call = {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_container_is_named_by_the_last_segment_of_its_cgroup() {
        let id = "ce1948b5d7a5f01e44d87b8853bcce4054bcb65f454afc250e120e42118866c7";
        assert_eq!(
            super::container_of(&format!("8:pids:/docker/{id}")),
            Some(id)
        );
        assert_eq!(
            super::container_of(&format!("0::/system.slice/docker-{id}.scope")),
            Some(id)
        );
        assert_eq!(super::container_of("0::/system.slice/docker.service"), None);
        assert_eq!(super::container_of("9:name=systemd:/"), None);
    }

    #[test]
    fn stat_names_may_hold_spaces_and_parentheses() {
        let line = "7 (a (b) c) S 1 7 7 0 -1 0 0 0 0 0 5 6 7 8 20 0";
        assert_eq!(super::parse_stat(line), Some(("a (b) c".to_owned(), 26)));
    }
}
