//! `proc.list`: the sandbox's processes with CPU, memory and listening TCP ports.
//!
//! The container has its own pid and network namespaces, so `/proc` holds only the sandbox's
//! processes and `/proc/net/tcp{,6}` only its sockets. A listening socket is tied to a process
//! through its inode: `/proc/net/tcp` gives `inode -> port` for sockets in state `LISTEN`, and
//! the links in `/proc/PID/fd` read `socket:[inode]`. Reading those links needs ptrace-read
//! access, which the handler thread has (fsuid = the sandbox user) for the commands' processes
//! only.
//!
//! The executor (PID 1) and its per-command sub-reapers are hidden unless `include_internal` is
//! set; then they are listed with their `role`. CPU is reported as total CPU time and as its
//! average share of one core over the process's lifetime (no sampling interval, so the call
//! returns at once).

use std::collections::{BTreeSet, HashMap};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::protocol::{ErrorKind, ProcListParams, ProcListResult, ProcessInfo, ProcessRole};

/// Default number of processes returned.
pub const DEFAULT_LIMIT: u32 = 50;
/// Most processes returned.
pub const MAX_LIMIT: u32 = 200;
/// Most processes examined (the pids limit of a sandbox is far lower).
const MAX_SCANNED: usize = 65_536;
/// Bytes of a command line kept.
const MAX_COMMAND_BYTES: usize = 4096;
/// TCP state `LISTEN` in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// Runs `proc.list`.
pub fn run(_ctx: &Context, params: ProcListParams) -> OpResult<ProcListResult> {
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(OpError::invalid(format!(
            "limit must be between 1 and {MAX_LIMIT}, got {limit}"
        )));
    }
    let needle = params.name.as_deref().map(str::to_lowercase);
    let listening = listening_sockets();
    let clock = Clock::read();
    let own_pid = crate::identity::own_pid();

    let entries = std::fs::read_dir("/proc")
        .map_err(|e| OpError::new(ErrorKind::Io, format!("cannot read /proc: {e}")))?;
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .take(MAX_SCANNED)
        .collect();
    pids.sort_unstable();

    let mut processes = Vec::new();
    let mut total = 0u64;
    let mut scanned = 0u64;
    for pid in pids {
        // A process may exit between the listing and the reads: it is simply left out.
        let Some(mut info) = read_process(pid, &clock) else {
            continue;
        };
        info.role = role_of(pid, own_pid, &info);
        if info.role != ProcessRole::Command && !params.include_internal {
            continue;
        }
        scanned += 1;
        info.listening_ports = ports_of(pid, &listening);
        if let Some(needle) = &needle {
            if !info.name.to_lowercase().contains(needle)
                && !info.command.to_lowercase().contains(needle)
            {
                continue;
            }
        }
        if let Some(port) = params.port {
            if !info.listening_ports.contains(&port) {
                continue;
            }
        }
        total += 1;
        if processes.len() < limit as usize {
            processes.push(info);
        }
    }
    Ok(ProcListResult {
        truncated: total > processes.len() as u64,
        processes,
        total,
        scanned,
    })
}

fn role_of(pid: u32, own_pid: u32, info: &ProcessInfo) -> ProcessRole {
    if pid == own_pid {
        ProcessRole::Executor
    } else if info.uid == 0 {
        // Commands run as the sandbox user; the only other root processes are copies of the
        // executor: sub-reapers, the fork server that makes them (`fork-server`; the protocol
        // has no role of its own for it), and, for an instant, a command between fork and exec.
        ProcessRole::SubReaper
    } else {
        ProcessRole::Command
    }
}

/// Clock facts for turning `/proc/PID/stat` ticks into time.
struct Clock {
    ticks_per_second: u64,
    page_size: u64,
    uptime_seconds: f64,
}

impl Clock {
    fn read() -> Self {
        // SAFETY: sysconf only reads a system constant.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let uptime_seconds = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Clock {
            ticks_per_second: u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100),
            page_size: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            uptime_seconds,
        }
    }
}

/// The fields of `/proc/PID/stat` this tool uses.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    name: String,
    state: String,
    ppid: u32,
    cpu_ticks: u64,
    start_ticks: u64,
}

/// Parses `/proc/PID/stat`; the name sits between the first `(` and the *last* `)`, since a
/// process may put any byte, `)` included, in its name.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_owned();
    // Fields after the name, numbered from 3 (state) as in proc(5).
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).copied();
    let number = |n: usize| field(n)?.parse::<u64>().ok();
    Some(Stat {
        name,
        state: field(3)?.to_owned(),
        ppid: u32::try_from(number(4)?).ok()?,
        cpu_ticks: number(14)?.saturating_add(number(15)?),
        start_ticks: number(22)?,
    })
}

fn read_process(pid: u32, clock: &Clock) -> Option<ProcessInfo> {
    let stat = parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(u32::MAX);
    let rss_pages = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    let mut cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline.truncate(MAX_COMMAND_BYTES);
    let command = String::from_utf8_lossy(&cmdline)
        .trim_end_matches('\0')
        .replace('\0', " ");
    let cpu_time_ms = stat.cpu_ticks.saturating_mul(1000) / clock.ticks_per_second;
    let age_seconds =
        clock.uptime_seconds - stat.start_ticks as f64 / clock.ticks_per_second as f64;
    let cpu_percent = if age_seconds > 0.0 {
        let percent = cpu_time_ms as f64 / 10.0 / age_seconds;
        (percent * 10.0).round() / 10.0
    } else {
        0.0
    };
    Some(ProcessInfo {
        pid,
        ppid: stat.ppid,
        name: stat.name,
        command,
        uid,
        state: stat.state,
        cpu_time_ms,
        cpu_percent,
        memory_rss_bytes: rss_pages.saturating_mul(clock.page_size),
        listening_ports: Vec::new(),
        role: ProcessRole::Command,
    })
}

/// `inode -> port` of every listening TCP socket (IPv4 and IPv6) of the sandbox.
fn listening_sockets() -> HashMap<u64, u16> {
    let mut sockets = HashMap::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            sockets.extend(parse_tcp_table(&text));
        }
    }
    sockets
}

/// Parses one `/proc/net/tcp{,6}` table into `inode -> port` for sockets in state LISTEN.
fn parse_tcp_table(text: &str) -> Vec<(u64, u16)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if fields.get(3) != Some(&TCP_LISTEN) {
                return None;
            }
            let port_hex = fields.get(1)?.rsplit(':').next()?;
            let port = u16::from_str_radix(port_hex, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            Some((inode, port))
        })
        .collect()
}

/// The listening ports among a process's open descriptors; empty when they cannot be read.
fn ports_of(pid: u32, listening: &HashMap<u64, u16>) -> Vec<u16> {
    if listening.is_empty() {
        return Vec::new();
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut ports = BTreeSet::new();
    for fd in fds.filter_map(Result::ok) {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let inode = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse::<u64>().ok());
        if let Some(port) = inode.and_then(|i| listening.get(&i)) {
            ports.insert(*port);
        }
    }
    ports.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_names_may_hold_parentheses_and_spaces() {
        let line = "42 (my (odd) name) S 7 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 \
                    12345 1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.name, "my (odd) name");
        assert_eq!(stat.state, "S");
        assert_eq!(stat.ppid, 7);
        assert_eq!(stat.cpu_ticks, 300);
        assert_eq!(stat.start_ticks, 12345);
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn only_listening_sockets_are_kept() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 123456 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000 65534        0 654321 1 0000000000000000 20 4 30 10 -1\n";
        assert_eq!(parse_tcp_table(table), vec![(123_456, 8080)]);
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(parse_tcp_table(v6), vec![(777, 80)]);
    }
}
