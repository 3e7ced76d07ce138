//! The runsc-enabled Docker engine of the gVisor tests (`gvisor.rs`, `gvisor_root.rs`): started
//! beside the host's by `scripts/lib/gvisor_engine.sh`, one at a time in this binary, stopped
//! (nothing left) when dropped.

use std::process::Command;

use super::sandbox::AgentSandbox;

/// Where a runsc-enabled engine lives (`scripts/lib/second_engine.sh` with
/// `AEGIS_ENGINE2_RUNSC=1`): its directories, bridge, address range and firewall tag, whether
/// it has the engine's experimental features (checkpoints), and the lock that keeps it to one
/// test at a time in this binary (a test's stop would pull it from under another). Places with
/// other names run beside each other.
pub struct Place {
    pub dir: &'static str,
    pub run: &'static str,
    pub bridge: &'static str,
    pub range: &'static str,
    pub tag: &'static str,
    pub experimental: bool,
    pub alone: &'static std::sync::Mutex<()>,
}

static DEFAULT_ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The engine of `scripts/lib/gvisor_engine.sh`'s defaults.
pub const DEFAULT: Place = Place {
    dir: "/var/lib/aegis-gvisor",
    run: "/run/aegis-gvisor",
    bridge: "aegis-gvisor",
    range: "10.214.0.0/16",
    tag: "aegis-gvisor",
    experimental: true,
    alone: &DEFAULT_ALONE,
};

impl Place {
    fn script(&self, verb: &str, images: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(format!(
                "{}/../scripts/lib/second_engine.sh",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(verb)
            .args(images)
            .env("AEGIS_ENGINE2_DIR", self.dir)
            .env("AEGIS_ENGINE2_RUN", self.run)
            .env("AEGIS_ENGINE2_BRIDGE", self.bridge)
            .env("AEGIS_ENGINE2_RANGE", self.range)
            .env("AEGIS_ENGINE2_TAG", self.tag)
            .env("AEGIS_ENGINE2_RUNSC", "1")
            .env("AEGIS_ENGINE2_EXPERIMENTAL", self.experimental.to_string())
            .output()
            .expect("bash runs")
    }
}

/// The runsc-enabled engine, stopped (nothing left) when dropped.
pub struct GvisorEngine {
    /// The engine's address (`unix://...`), for `docker.host`.
    pub host: String,
    /// Where it lives.
    pub place: &'static Place,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl GvisorEngine {
    /// Starts the default engine with the `busybox` runtime image loaded.
    pub fn start() -> GvisorEngine {
        Self::start_with(&["aegis-runtime/busybox:1"])
    }

    /// Starts the default engine with `images` loaded from the host's engine.
    pub fn start_with(images: &[&str]) -> GvisorEngine {
        Self::start_at(&DEFAULT, images)
    }

    /// Starts the engine at `place` with `images` loaded from the host's engine.
    pub fn start_at(place: &'static Place, images: &[&str]) -> GvisorEngine {
        let alone = place
            .alone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = place.script("start", images);
        assert!(
            out.status.success(),
            "the gVisor engine must start here (scripts/lib/second_engine.sh; scripts/test.sh \
             installs runsc):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(host.starts_with("unix://"), "its address: {host}");
        GvisorEngine {
            host,
            place,
            _alone: alone,
        }
    }

    /// `docker -H <engine> args...`: (exit code, stdout).
    pub fn docker(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("docker runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    /// Names of the engine's containers (any state) whose name contains `part`, each with its
    /// state.
    pub fn containers(&self, part: &str) -> Vec<String> {
        let (_, out) = self.docker(&["ps", "-a", "--format", "{{.Names}} {{.State}}"]);
        out.lines()
            .filter(|l| l.contains(part))
            .map(str::to_owned)
            .collect()
    }

    /// Runs `argv` in `sandbox` as the sandbox user with `docker exec` (what agent code could
    /// do): (exit code, stdout).
    pub fn inside(&self, sandbox: &AgentSandbox, argv: &[&str]) -> (i32, String) {
        let container = sandbox.container();
        let mut args = vec!["exec", "-u", "65534:65534", container.as_str()];
        args.extend_from_slice(argv);
        self.docker(&args)
    }
}

impl Drop for GvisorEngine {
    fn drop(&mut self) {
        let out = self.place.script("stop", &[]);
        if !out.status.success() {
            eprintln!(
                "the gVisor engine did not stop cleanly:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
