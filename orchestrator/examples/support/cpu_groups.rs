//! `load_bench --layout compose`: the node and PostgreSQL get CPU groups of their own beside the
//! sandboxes, as `docker compose up` gives them, for the length of the run.
//!
//! Why: the Linux scheduler shares CPU between groups first and between the tasks of a group
//! second. Under compose, the orchestrator, PostgreSQL and every sandbox are containers, so each
//! is a group of equal weight. A node started by hand on a host without systemd (this
//! benchmark, the test suite) stays in the root group, where each of its threads and each
//! PostgreSQL backend weighs as much as Docker's whole group, which holds every sandbox: once
//! the machine saturates, commands wait behind the node's threads and `cmd.run`'s p99 reaches
//! tens of times its p50. Measuring in both layouts shows which figures belong to the code and
//! which to the host's grouping.
//!
//! Only a root process on a cgroupfs layout (Docker's group at `<cpu controller>/docker`) can
//! do this; otherwise [`compose`] says why not and the run keeps the host's layout. Everything
//! moved is moved back, and the groups removed, when the [`Layout`] is dropped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Groups made for the run, each with the group its processes came from.
pub struct Layout {
    /// (the group made, the group its first process was in).
    groups: Vec<(PathBuf, PathBuf)>,
    /// What the run's header says about the layout.
    pub description: String,
}

/// The CPU controller's mount and Docker's group under it (cgroup v1 `cpu`, or v2).
fn docker_group() -> Result<(PathBuf, PathBuf), String> {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let root = if v2 {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.procs").exists())
            .ok_or("no cgroup v1 cpu controller is mounted")?
    };
    let docker = root.join("docker");
    if !docker.is_dir() {
        return Err(format!(
            "Docker's CPU group {} is missing (a systemd cgroup driver puts containers elsewhere)",
            docker.display()
        ));
    }
    Ok((root, docker))
}

/// The group directory `pid` is in under `root` (the CPU controller's line of
/// `/proc/<pid>/cgroup`).
fn group_of(root: &Path, pid: i32) -> Option<PathBuf> {
    let v2 = root == Path::new("/sys/fs/cgroup");
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = if v2 {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "cpu")
        };
        ours.then(|| root.join(path.trim_start_matches('/')))
    })
}

/// The children of `pid` (from `/proc/*/stat`).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| parent_of(*child) == Some(pid))
        .collect()
}

/// Whether this process's effective uid is 0 (the second field of `Uid:` in its status).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
            .unwrap_or(false)
    })
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Moves this process, and the PostgreSQL server whose backend has pid `backend` (with every
/// process it forked), into groups of their own beside the sandboxes. `backend` is `None` when
/// the server is not a process of this host (then only this process moves).
pub fn compose(backend: Option<i32>) -> Result<Layout, String> {
    if !is_root() {
        return Err("only root may move processes between CPU groups".to_owned());
    }
    let (root, docker) = docker_group()?;
    let mut layout = Layout {
        groups: Vec::new(),
        description: String::new(),
    };
    let tag = std::process::id();
    let node = layout.group(
        &root,
        &docker.join(format!("aegis-bench-{tag}-node")),
        std::process::id() as i32,
    )?;
    let mut said = vec![format!("this process in {}", node.display())];
    // A backend's parent is the postmaster; new backends are forked by it, into its group.
    let postmaster = backend.and_then(parent_of).filter(|pm| {
        group_of(&root, *pm).is_some_and(|g| !g.starts_with(&docker) && g.starts_with(&root))
            && std::fs::read_to_string(format!("/proc/{pm}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
    });
    match postmaster {
        Some(pm) => {
            let pg = layout.group(
                &root,
                &docker.join(format!("aegis-bench-{tag}-postgres")),
                pm,
            )?;
            for child in children_of(pm) {
                // A process that ended meanwhile is not an error.
                let _ = move_into(&pg, child);
            }
            said.push(format!("PostgreSQL in {}", pg.display()));
        }
        None => said.push("PostgreSQL not moved (not a process of this host's root group)".into()),
    }
    layout.description = format!(
        "compose-like CPU groups beside the sandboxes' ({})",
        said.join(", ")
    );
    Ok(layout)
}

impl Layout {
    /// Makes group `dir` and moves `leader` into it, remembering where `leader` was: everything
    /// in `dir` goes back there at the end.
    fn group(&mut self, root: &Path, dir: &Path, leader: i32) -> Result<PathBuf, String> {
        let back =
            group_of(root, leader).ok_or_else(|| format!("no CPU group for pid {leader}"))?;
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        self.groups.push((dir.to_owned(), back));
        move_into(dir, leader)?;
        Ok(dir.to_owned())
    }
}

/// Moves process `pid` (all its threads) into `group`.
fn move_into(group: &Path, pid: i32) -> Result<(), String> {
    std::fs::write(group.join("cgroup.procs"), pid.to_string())
        .map_err(|e| format!("moving pid {pid} into {}: {e}", group.display()))
}

impl Drop for Layout {
    fn drop(&mut self) {
        // Every process still in a group (backends forked during the run included) goes back
        // where its group's first process came from, then the group goes.
        for (group, back) in &self.groups {
            if let Ok(procs) = std::fs::read_to_string(group.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.parse::<i32>().ok()) {
                    let _ = move_into(back, pid);
                }
            }
            let _ = std::fs::remove_dir(group);
        }
    }
}
