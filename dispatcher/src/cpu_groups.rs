//! Whether this node shares the CPU fairly with its sandboxes: a check made once at start.
//!
//! Linux shares CPU time between groups (cgroups) first and between the tasks inside a group
//! second. Every sandbox is a container, so a group of its own, and all of them sit under the
//! engine's group (`/docker` with the cgroupfs driver). A node that runs in the root group (started
//! by hand, without systemd or a container) competes with that whole group thread by thread:
//! each of its threads, and each PostgreSQL backend there, weighs as much as all the sandboxes
//! together. Once the machine saturates, the sandboxes' commands then wait behind the node's own
//! work, and `cmd.run`'s p99 grows to tens of times its p50 (measured with `load_bench --layout
//! host` against `--layout compose`; ARCHITECTURE.md, "CPU groups"). Under compose or a systemd
//! unit the node is a group of its own, beside its sandboxes, and nothing is said.

/// Why the node's CPU group starves its sandboxes under load, from the text of
/// `/proc/self/cgroup`; `None` when the node has a group of its own.
pub fn starving_layout(proc_self_cgroup: &str) -> Option<String> {
    let lines: Vec<(&str, &str)> = proc_self_cgroup
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    // cgroup v1's CPU controller line when there is one, else v2's single hierarchy.
    let (_, path) = lines
        .iter()
        .find(|(controllers, _)| controllers.split(',').any(|c| c == "cpu"))
        .or_else(|| lines.iter().find(|(controllers, _)| controllers.is_empty()))?;
    let root = *path == "/";
    root.then(|| {
        "this node runs in the root CPU group, where each of its threads weighs as much as the \
         engine's whole group of sandboxes: under saturation commands wait behind the node \
         (p99 far above p50); run it in a group of its own, as docker compose or a systemd unit \
         does"
            .to_owned()
    })
}

/// Says once, at start, when [`starving_layout`] finds this process in the root group.
pub(crate) fn warn_if_starving() {
    static SAID: std::sync::Once = std::sync::Once::new();
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    if let Some(why) = starving_layout(&text) {
        SAID.call_once(|| tracing::warn!("{why}"));
    }
}

#[cfg(test)]
mod tests {
    use super::starving_layout;

    #[test]
    fn the_root_group_is_named_on_cgroup_v1_and_v2() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/5a23\n1:cpu:/\n0::/\n";
        assert!(starving_layout(v1).is_some());
        let v1_joint = "3:cpu,cpuacct:/\n2:pids:/x\n";
        assert!(starving_layout(v1_joint).is_some());
        assert!(starving_layout("0::/\n").is_some());
    }

    #[test]
    fn a_group_of_its_own_is_fair() {
        // A compose container, a systemd unit (v1, then v2).
        assert!(starving_layout("4:cpu,cpuacct:/docker/ce19\n0::/\n").is_none());
        assert!(starving_layout("1:cpu:/system.slice/aegis.service\n").is_none());
        assert!(starving_layout("0::/system.slice/aegis.service\n").is_none());
        // Nothing readable: nothing said.
        assert!(starving_layout("").is_none());
    }
}
