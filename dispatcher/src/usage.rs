//! What a running sandbox uses, read from its container's cgroup through the engine's stats
//! (one sample of two readings about a second apart, so the CPU share is measured, not
//! guessed). The workspace and `/tmp` are tmpfs mounts whose pages the kernel charges to the
//! container's memory cgroup as shared memory (`shmem` in `memory.stat`), so the bytes stored
//! there are told apart from the processes' own memory by that figure (under cgroup v1, whose
//! figures the engine reports without `shmem`, by the page cache, which holds them).

use bollard::query_parameters::StatsOptionsBuilder;
use futures_util::StreamExt;

use crate::dispatcher::Dispatcher;
use crate::error::{engine, DispatchError, Result};
use crate::spec::SandboxId;
use crate::store;

/// One sample of a sandbox's use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// CPUs the sandbox may use (its limit, rounded up).
    pub cpu_count: u32,
    /// Percent of those CPUs used over the sample (0 to 100).
    pub cpu_used_pct: f32,
    /// Memory its processes use, bytes (page cache and tmpfs contents not counted).
    pub mem_used: u64,
    /// Its memory limit, bytes.
    pub mem_total: u64,
    /// Page cache, bytes.
    pub mem_cache: u64,
    /// Bytes stored in its workspace and `/tmp` (tmpfs).
    pub disk_used: u64,
    /// Its workspace's size limit plus `/tmp`'s, bytes.
    pub disk_total: u64,
}

impl Dispatcher {
    /// One sample of what sandbox `id` uses; any instance can read it (the container is named
    /// by the sandbox's row).
    pub async fn usage(&self, id: SandboxId) -> Result<Usage> {
        let info = store::get(&self.inner.pg, id)
            .await?
            .filter(|i| !i.state.is_terminal())
            .ok_or(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: false,
            })?;
        let limits = info.spec.as_ref().map(|s| s.limits).unwrap_or_default();
        let mut stream = Box::pin(
            self.inner.docker.stats(
                &info.container_name,
                Some(
                    StatsOptionsBuilder::new()
                        .stream(false)
                        .one_shot(false)
                        .build(),
                ),
            ),
        );
        let stats = match stream.next().await {
            Some(s) => s.map_err(engine(format!("reading the stats of sandbox {id}")))?,
            None => {
                return Err(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: false,
                })
            }
        };
        let cpu_count = u32::try_from(limits.nano_cpus.div_ceil(1_000_000_000))
            .unwrap_or(1)
            .max(1);
        let total = |s: &Option<bollard::models::ContainerCpuStats>| {
            let s = s.as_ref();
            (
                s.and_then(|s| s.cpu_usage.as_ref())
                    .and_then(|u| u.total_usage)
                    .unwrap_or(0),
                s.and_then(|s| s.system_cpu_usage).unwrap_or(0),
                s.and_then(|s| s.online_cpus).unwrap_or(1).max(1),
            )
        };
        let (cpu_now, system_now, online) = total(&stats.cpu_stats);
        let (cpu_before, system_before, _) = total(&stats.precpu_stats);
        let cpu_delta = cpu_now.saturating_sub(cpu_before) as f64;
        let system_delta = system_now.saturating_sub(system_before) as f64;
        let cpu_used_pct = if system_delta > 0.0 {
            // The share of the host's CPUs, as a share of the sandbox's own.
            (cpu_delta / system_delta * f64::from(online) / f64::from(cpu_count) * 100.0)
                .clamp(0.0, 100.0) as f32
        } else {
            0.0
        };
        let memory = stats.memory_stats.unwrap_or_default();
        let figures = memory.stats.unwrap_or_default();
        let stat = |names: &[&str]| names.iter().find_map(|n| figures.get(*n).copied());
        // cgroup v2 names first, then v1's.
        // Both versions count tmpfs pages (shmem) in the page cache figure; cgroup v1 as the
        // engine reports it has no shmem figure, so there the page cache stands for it.
        let cache = stat(&["file", "total_cache", "cache"]).unwrap_or(0);
        let shmem = stat(&["shmem", "total_shmem"]).unwrap_or(cache);
        let usage = memory.usage.unwrap_or(0);
        Ok(Usage {
            cpu_count,
            cpu_used_pct,
            mem_used: usage.saturating_sub(cache.max(shmem)),
            mem_total: limits.memory_bytes,
            mem_cache: cache.saturating_sub(shmem),
            disk_used: shmem,
            disk_total: limits.workspace_bytes + limits.tmpfs_bytes,
        })
    }
}
